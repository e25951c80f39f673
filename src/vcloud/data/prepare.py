"""One raw ROI -> one prepared store (results/prepared/rois/{roi}.zarr) and its bad-file list.

The raw ROI comes from the downloaded archives (read in place through their index, see
vcloud.data.archive) or from an extracted tree. Locations are prepared by `workers` threads
(decoding, s2cloudless with one LightGBM thread each: both release the GIL) and handed to the
store writer in patch order, at most workers + 1 locations in memory: the store is byte-identical
whatever the number of workers.

Policy for bad input (`on_bad_image`):
- fail: the first problem raises one line naming the file and what is wrong; nothing is written.
- skip: bad images are marked missing (valid_s1/valid_s2 False), listed with their reason in
  {roi}.bad.tsv beside the store, and every good image is kept.

Not bad input, under either policy (layout.scan_roi): a date whose S1 is missing (no S1 file or
time folder, or no S1 at all) is kept with S2 only, valid_s1 False; a series with fewer dates
than `times` (time folders absent) is kept with the dates it has, the absent ones missing. Both
are counted in the summary (`dates_s2_only`, `locations_short`, `times_absent`) and the store's
attributes, and named in the log, one line per location. An S1 file that is there but
unreadable is a bad image (fail stops; skip keeps the date with S2 only).
"""

from __future__ import annotations

import csv
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vcloud.bands import band_set_name, describe_count
from vcloud.constants import CLOUD_CLASS_MISSING, S1_BANDS, S1_CLIP_DB
from vcloud.data.archive import resolve_sources
from vcloud.data.clouds import CloudThresholds, cloud_cover_and_class, cloud_mask, cloud_probability, zero_bands
from vcloud.data.folder import FolderSource
from vcloud.data.geotiff import NO_GEOREF, BadImageError, GeoRef, read_image
from vcloud.data.layout import Problem, RoiId, scan_roi
from vcloud.data.masks import MaskSpec, read_supplied, scl_table, supplied_mask
from vcloud.data.s2files import S2Spec, check_s2_file, read_meta
from vcloud.data.scenes import read_window
from vcloud.data.store import (
    CLOUD_PROB_SCALE,
    PLAIN_FOLDER,
    location_id,
    open_store,
    store_attrs,
    summary,
    summary_line,
    write_locations,
)
from vcloud.data.wind_values import WindSource
from vcloud.errors import BadInputError
from vcloud.io import atomic_output

log = logging.getLogger(__name__)

BAD_TSV_HEADER = ("path", "kind", "patch", "t", "reason")


def bad_tsv_path(store: Path) -> Path:
    """results/prepared/rois/ROIs1868_119.zarr -> results/prepared/rois/ROIs1868_119.bad.tsv"""
    store = Path(store)
    return store.with_name(store.name.removesuffix(".zarr") + ".bad.tsv")


def prepare_roi(
    *,
    raw: Path | list[Path],
    roi: RoiId,
    out: Path,
    on_bad_image: str = "fail",
    times: int = 30,
    size: int = 256,
    thresholds: CloudThresholds = CloudThresholds(),
    wind_table: Path | None = None,
    workers: int = 1,
    index_dir: Path | None = None,
    scl: dict | None = None,
    s2: S2Spec = S2Spec(),
    s1_max_days: int | None = None,
    overlap: int | None = None,
) -> dict:
    """Prepare one ROI; returns the summary counts that are also logged.

    raw: one path or several (e.g. the train and the val/test download roots); each a folder
    of downloaded archives, one archive, or an extracted tree. index_dir: where the archives'
    indexes are (default: beside each archive); a missing one is built, a stale one refused.
    scl: SCL class code -> cloud probability (data/masks.py; None: the default table), used
    when a plain folder brings SCL/. s2: the S2 files' band set and product level
    (data/s2files.py; other than 13 L1C bands only in a plain folder). s1_max_days: a plain
    folder's S1 pairing window in days (None: folder.S1_MAX_DAYS, 6). overlap: the pixels that
    neighbouring patches of a plain folder's larger scene share (data/scenes.py; None: its default).
    """
    if on_bad_image not in ("fail", "skip"):
        raise BadInputError(f"on_bad_image: '{on_bad_image}' is not one of fail, skip")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise BadInputError(f"workers: {workers!r} is not a positive number of threads")
    raws = [Path(p) for p in raw] if isinstance(raw, (list, tuple)) else [Path(raw)]
    out = Path(out)
    sources = resolve_sources(raws, roi, index_dir=index_dir, s1_max_days=s1_max_days, size=size, overlap=overlap)
    scan = scan_roi(sources, roi, times=times)
    problems = list(scan.problems)
    _fail_on(problems, on_bad_image)
    spec = _mask_spec(scan, scl_table(scl), s2)
    wind = WindSource(wind_table, roi) if wind_table else None
    options = {
        "roi": str(roi),
        "on_bad_image": on_bad_image,
        "times": times,
        "size": size,
        "cloud_thresholds": asdict(thresholds),
        "wind_table": str(wind_table) if wind_table else None,
        "cloud_mask": spec.source,
        "s2": s2.attrs(),
    }
    if isinstance(scan.sources.get("s2"), FolderSource):
        options["s1_max_days"] = scan.sources["s2"].s1_max_days
        if scan.sources["s2"].cut:
            options["overlap"] = scan.sources["s2"].overlap
    where = ", ".join(sorted({str(Path(str(source)).resolve()) for source in scan.sources.values()}))
    label = "SEN12MS-CR-TS" if not isinstance(scan.sources.get("s2"), FolderSource) else PLAIN_FOLDER
    attrs = store_attrs(source=f"{label} {where}", options=options, s2_bands=s2.bands)
    attrs["s2_product_level"] = s2.level
    attrs["series"] = {"times": times, "absent": list(scan.absent), "beyond": list(scan.beyond)}
    attrs["cloud_mask"] = spec.attrs()
    _log_series(scan)

    def one(patch: int):
        new_problems: list[Problem] = []
        ds = _prepare_location(scan, patch, size, thresholds, wind, new_problems, spec, s2)
        return ds, new_problems

    def locations():
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prepare") as pool:
            pending: deque = deque()
            try:
                for patch in tqdm(scan.patches, desc=str(roi), unit="loc", disable=None):
                    pending.append(pool.submit(one, patch))
                    if len(pending) > workers:  # bounded memory: workers + 1 locations in flight
                        yield finish(pending.popleft())
                while pending:
                    yield finish(pending.popleft())
            finally:
                for future in pending:
                    future.cancel()

    def finish(future):
        ds, new_problems = future.result()
        problems.extend(new_problems)
        _fail_on(new_problems, on_bad_image)
        ds.attrs = attrs
        return ds

    bad_tsv = bad_tsv_path(out)
    with atomic_output(out) as tmp_store, atomic_output(bad_tsv) as tmp_tsv:
        write_locations(locations(), tmp_store)
        _write_bad_tsv(tmp_tsv, problems)
        counts = summary(open_store(tmp_store))
    counts["bad_files"] = len(problems)
    counts["times_absent"] = len(scan.absent)
    counts["times_beyond"] = len(scan.beyond)
    log.info(summary_line(f"prepared {roi}", counts))
    return counts


def _mask_spec(scan, table: dict[int, float], s2: S2Spec) -> MaskSpec:
    """s2cloudless's mask, or the one a plain folder brings (SCL/, MASK/), with s2cloudless beside it
    where the bands allow; refused where no mask can be had (not L1C, and no SCL/ or MASK/)."""
    source = scan.sources.get("s2")
    folder = isinstance(source, FolderSource)
    if not folder and s2 != S2Spec():
        raise BadInputError(
            f"{source}: SEN12MS-CR-TS is Level-1C with the 13 bands; --bands {band_set_name(s2.bands)} and "
            f"--level {s2.level} are for a plain folder of your own imagery"
        )
    kind = source.mask_kind if folder else None
    if kind is None:
        if not s2.s2cloudless:
            raise BadInputError(
                f"{source}: no cloud mask for {s2.level} {band_set_name(s2.bands)}: s2cloudless needs the 13 Level-1C "
                "bands; put the product's scene classification in SCL/ or your mask in MASK/ beside S2/ (docs/data.md)"
            )
        return MaskSpec(source="s2cloudless")
    beside = "s2cloudless computed beside it for comparison" if s2.s2cloudless else "no s2cloudless: not L1C"
    log.info("%s: cloud mask from %s/ (%s)", scan.roi, kind.upper(), beside)
    return MaskSpec(source=kind, scl=table if kind == "scl" else None, s2cloudless_too=s2.s2cloudless)


def _fail_on(problems: list[Problem], policy: str) -> None:
    if problems and policy == "fail":
        first = problems[0]
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise BadInputError(f"{first.path}: {first.reason}{more}")


def _log_series(scan) -> None:
    """Dates kept without S1 and dates a series lacks: named in the log, never silent."""
    roi = scan.roi
    name = lambda patch: location_id(roi.rois, roi.roi, patch)  # noqa: E731
    if scan.beyond:
        log.warning(
            "%s: %d time folders past times=%d not prepared (t=%s); raise data.times to use them",
            roi,
            len(scan.beyond),
            scan.times,
            spans(scan.beyond),
        )
    if scan.absent:
        log.info(
            "%s: a series of %d of %d dates: t=%s absent (no S2 or S1 folder), stored as missing",
            roi,
            scan.times - len(scan.absent),
            scan.times,
            spans(scan.absent),
        )
    with_s2 = [key for key, pair in scan.images.items() if "s2" in pair]
    if scan.s1_missing and len(scan.s1_missing) == len(with_s2):
        log.info("%s: no S1 image at all: its %d S2 images are kept with S2 only (valid_s1 False)", roi, len(with_s2))
    else:
        missing: dict[int, list[int]] = {}
        for patch, t in scan.s1_missing:
            missing.setdefault(patch, []).append(t)
        for patch, ts in sorted(missing.items()):
            log.info("%s: S1 missing at t=%s: kept with S2 only (valid_s1 False)", name(patch), spans(ts))
    present: dict[int, set[int]] = {}
    for patch, t in scan.images:
        present.setdefault(patch, set()).add(t)
    for patch in scan.patches:
        gone = [t for t in range(scan.times) if t not in present[patch] and t not in scan.absent]
        if gone:
            log.info("%s: no image at t=%s: stored as missing", name(patch), spans(gone))


def spans(values) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8': date indices for a log line."""
    values = sorted(int(v) for v in values)
    parts, start = [], None
    for i, v in enumerate(values):
        start = v if start is None else start
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(v) if v == start else f"{start}-{v}")
            start = None
    return ",".join(parts)


def _prepare_location(scan, patch, size, thresholds, wind, problems, spec: MaskSpec, s2spec: S2Spec):
    import xarray as xr

    times = scan.times
    s2 = np.zeros((times, len(s2spec.bands), size, size), np.uint16)
    s1 = np.full((times, len(S1_BANDS), size, size), S1_CLIP_DB[0], np.float32)
    valid = {"s1": np.zeros(times, bool), "s2": np.zeros(times, bool)}
    dates = {"s1": np.full(times, np.datetime64("NaT"), "datetime64[ns]"), "s2": None}
    dates["s2"] = dates["s1"].copy()
    nan_pixels = np.zeros(times, np.int32)
    georefs: dict[str, GeoRef] = {}  # first georeferenced image of each kind
    firsts: dict[str, str] = {}  # and its file
    specs = {"s2": (len(s2spec.bands), np.uint16), "s1": (len(S1_BANDS), np.float32)}
    folder = isinstance(scan.sources.get("s2"), FolderSource)
    window = scan.sources["s2"].window(patch) if folder else None  # a patch of a larger scene
    for t in range(times):
        for kind, name in sorted(scan.images.get((patch, t), {}).items()):
            path = scan.where(name)
            bands, dtype = specs[kind]
            try:
                if window is None:
                    data, image_georef = read_image(scan.open(name), bands=bands, size=size, dtype=dtype)
                else:
                    row, col = window
                    data = read_window(scan.open(name), row=row, col=col, size=size, bands=bands, dtype=dtype)
                    image_georef = scan.sources["s2"].patch_georef(patch)
                if kind == "s1":
                    data, nans = _clean_s1(data)
                    nan_pixels[t] = nans
                else:
                    _check_s2(path, data, s2spec.bands)
                    if folder:  # the band set and level the file's metadata give, and L2A's offset
                        data, _ = check_s2_file(path, data, s2spec, read_meta(scan.open(name)))
            except BadImageError as err:
                reason = str(err)
                if kind == "s2" and getattr(err, "bands", None) is not None:
                    reason = f"{reason} ({band_set_name(s2spec.bands)}); {describe_count(err.bands)}"
                problems.append(Problem(str(path), reason, kind=kind, patch=patch, t=t))
                continue
            (s2 if kind == "s2" else s1)[t] = data
            valid[kind][t] = True
            dates[kind][t] = np.datetime64(name.date, "ns")
            if image_georef != NO_GEOREF:
                georefs.setdefault(kind, image_georef)
                firsts.setdefault(kind, path)
                if folder and kind == "s2" and image_georef != georefs["s2"]:
                    raise BadInputError(
                        f"{path}: on another grid ({image_georef.crs} {image_georef.transform}) than {firsts['s2']} "
                        f"({georefs['s2'].crs} {georefs['s2'].transform}); every date of a location must be on one grid"
                    )

    prob = np.full((times, size, size), np.nan, np.float32)
    cover = np.full(times, np.nan, np.float32)
    classes = np.full(times, CLOUD_CLASS_MISSING, np.int8)
    compared = {name: np.full(times, np.nan, np.float32) for name in ("cloud_cover_s2cloudless", "cloud_agreement")}
    good = np.flatnonzero(valid["s2"])
    georef = georefs.get("s2") or georefs.get("s1") or NO_GEOREF
    if len(good):
        if spec.source == "s2cloudless" or spec.s2cloudless_too:
            # One LightGBM thread per worker: N workers use N cores (LightGBM alone would take all).
            computed = cloud_probability(s2[good], num_threads=1)
            computed_mask = cloud_mask(computed)
        if spec.source == "s2cloudless":
            prob[good], mask = computed, computed_mask
        else:
            prob[good] = _supplied(scan, patch, good, spec, size=size, georef=georefs.get("s2"), window=window)
            mask = supplied_mask(prob[good])
        if spec.s2cloudless_too:
            compared["cloud_cover_s2cloudless"][good] = computed_mask.reshape(len(good), -1).mean(axis=1)
            compared["cloud_agreement"][good] = (mask == computed_mask).reshape(len(good), -1).mean(axis=1)
        cover[good], classes[good] = cloud_cover_and_class(prob[good], mask, thresholds)

    loc = {"location": np.array([location_id(scan.roi.rois, scan.roi.roi, patch)], dtype=object)}
    two = ("location", "time")
    data_vars = {
        "s2": (("location", "time", "band_s2", "y", "x"), s2[None]),
        "s1": (("location", "time", "band_s1", "y", "x"), s1[None]),
        "cloud_prob": (("location", "time", "y", "x"), prob[None]),
        "cloud_cover": (two, cover[None]),
        "cloud_class": (two, classes[None]),
        "valid_s2": (two, valid["s2"][None]),
        "valid_s1": (two, valid["s1"][None]),
        "s1_nan_pixels": (two, nan_pixels[None]),
        "date_s2": (two, dates["s2"][None]),
        "date_s1": (two, dates["s1"][None]),
        "crs": (("location",), np.array([georef.crs], dtype=object)),
        "transform": (("location", "gt"), np.array([georef.transform], np.float64)),
    }
    if spec.s2cloudless_too:
        data_vars.update({name: (two, values[None]) for name, values in compared.items()})
    if folder and scan.sources["s2"].cut:
        data_vars.update(scan.sources["s2"].scene_vars(patch))
    if wind is not None:
        u, v = wind.at(georef, dates["s2"], size=size)
        data_vars["wind_u"] = (two, u[None])
        data_vars["wind_v"] = (two, v[None])
    coords = {
        **loc,
        "rois": ("location", np.array([scan.roi.rois], dtype=object)),
        "roi": ("location", np.array([scan.roi.roi], np.int32)),
        "patch": ("location", np.array([patch], np.int32)),
        "time": np.arange(times, dtype=np.int16),
        "band_s2": np.array(s2spec.bands, dtype=object),
        "band_s1": np.array(S1_BANDS, dtype=object),
    }
    return xr.Dataset(data_vars, coords=coords)


def _check_s2(path, data: np.ndarray, bands: tuple[str, ...]) -> None:
    """Refuse an S2 image with bands of zeros (padding, not reflectance), under either policy."""
    zero = zero_bands(data, bands)
    if len(zero) == len(data):
        raise BadImageError("every band is 0 at every pixel (no data)")
    if zero:
        raise BadInputError(
            f"{path}: {', '.join(zero)} 0 at every pixel: padding is not reflectance (s2cloudless fed it calls "
            "cloudy dates clear, and a model would learn it); give the bands the file has, --bands l2a or a list "
            "(docs/data.md)"
        )


def _supplied(scan, patch: int, good: np.ndarray, spec: MaskSpec, *, size: int, georef, window=None) -> np.ndarray:
    """(len(good), H, W) the cloud probability of the SCL or MASK images of the dates `good`.

    Rounded to the store's steps (1/250), so that the mask computed here is the one every reader
    of the stored probability computes.
    """
    source = scan.sources["s2"]
    out = np.empty((len(good), size, size), np.float32)
    for i, t in enumerate(good):
        path = source.mask_file(patch, int(t))
        out[i] = read_supplied(path, spec.source, size=size, table=spec.scl or {}, georef=georef, window=window)
    return np.round(out * CLOUD_PROB_SCALE) / np.float32(CLOUD_PROB_SCALE)


def _clean_s1(data: np.ndarray) -> tuple[np.ndarray, int]:
    """NaN -> clip floor (counted, as the reference loader tolerates them); inf is an error."""
    if np.isinf(data).any():
        raise BadImageError(f"{int(np.isinf(data).sum())} infinite pixels")
    nans = np.isnan(data)
    if nans.all():
        raise BadImageError("every pixel is NaN")
    count = int(nans.sum())
    if count:
        data = np.where(nans, np.float32(S1_CLIP_DB[0]), data)
    return data, count


def _write_bad_tsv(path: Path, problems: list[Problem]) -> None:
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(BAD_TSV_HEADER)
        for p in problems:
            writer.writerow((p.path, p.kind, "" if p.patch is None else p.patch, "" if p.t is None else p.t, p.reason))

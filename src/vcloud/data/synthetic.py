"""Synthetic SEN12MS-CR-TS raw tree: the laptop and CI stand-in for the real dataset.

    <out>/<ROIsXXXX>/<roi>/{S1,S2}/<t>/<s1|s2>_<ROIsXXXX>_<roi>_ImgNo_<t>_<date>_patch_<pid>.tif
    <out>/wind.csv    rois,roi,date,u,v                       one row per (ROI, t); date = S2 date
    <out>/truth.csv   rois,roi,patch,t,cloud_class,cloud_cover  one row per image

Per ROI the patches lie side by side on one canvas (10 m pixels, a UTM zone), so land cover
and clouds run on across patch borders. Land cover (water, vegetation, bare soil, urban) comes
from smooth random fields; vegetation follows a seasonal cycle in S2 (red edge, NIR) and in S1
(VH). Clouds are two periodic fields per ROI (cumulus, cirrus) that drift with the wind: the
field at date t is the field at t-1 moved by wind_t * ADVECTION_S, so the wind in wind.csv
says where each cloud came from. Every image has one cloud class, drawn per location:
- thin:   cirrus haze in streaks along the wind (visible/NIR raised partially, B10 signal);
- thick:  bright cumulus over part of the patch, with shadows offset away from the sun;
- opaque: cloud over the whole patch.
The spectra are tuned so that s2cloudless with the reference post-processing (vcloud.data.clouds)
finds the class written in truth.csv for most images. Everything depends only on the seed and
the arguments: the same call writes byte-identical files.
"""

from __future__ import annotations

import csv
import datetime as dt
import logging
import os
import shutil
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vcloud.constants import CLOUD_CLASSES, S1_BANDS, S2_BANDS
from vcloud.data.geotiff import GeoRef, write_image
from vcloud.data.layout import RawName, RoiId
from vcloud.errors import VcloudError
from vcloud.io import atomic_output

log = logging.getLogger(__name__)

YEAR = 2018  # SEN12MS-CR-TS covers 2018
PIXEL_M = 10.0
# Seconds of wind drift between consecutive dates. Real acquisitions are days apart; the
# compressed time scale keeps the drift visible inside a patch (10 m/s -> 30 px per date).
ADVECTION_S = 30.0
S1_MAX_DATE_SHIFT_DAYS = 3
COVER_MIN_OPACITY = 0.1  # truth cloud_cover: fraction of pixels with cloud opacity above this
S1_NAN_IMAGE_RATE = 1 / 12  # share of S1 images with a few NaN pixels (as in the real data)

WIND_HEADER = ("rois", "roi", "date", "u", "v")
TRUTH_HEADER = ("rois", "roi", "patch", "t", "cloud_class", "cloud_cover")

# Share of dates per cloud class for an ordinary location, and for one that is never clear.
CLASS_SHARES = {"clear": 0.4, "thin": 0.2, "thick": 0.25, "opaque": 0.15}
NEVER_CLEAR_SHARES = {"clear": 0.0, "thin": 0.35, "thick": 0.35, "opaque": 0.3}

# Default ROIs, all of them ROIs of SEN12MS-CR-TS (so the reference loader finds every split):
# the first test ROI, the first val ROI, then train ROIs; roi 119 repeats across folders
# (ROIs1868/119 is test, ROIs1970/119 train). More ROIs come from the dataset's train list.
_DEFAULT_ROIS = (RoiId("ROIs1868", 119), RoiId("ROIs2017", 22), RoiId("ROIs1970", 119), RoiId("ROIs1970", 21))

# Top-of-atmosphere reflectance x10000 in S2_BANDS order (B1 B2 B3 B4 B5 B6 B7 B8 B8A B9 B10 B11 B12).
LAND_COVERS = ("water", "vegetation", "soil", "urban")
_SPECTRA = {
    "water": [1250, 1000, 800, 550, 450, 350, 330, 300, 280, 100, 8, 100, 60],
    "vegetation": [1250, 950, 850, 550, 1100, 2600, 3200, 3400, 3500, 1050, 12, 1900, 900],
    "soil": [1400, 1300, 1500, 1900, 2100, 2300, 2450, 2600, 2700, 900, 20, 3400, 2800],
    "urban": [1500, 1400, 1400, 1500, 1700, 1900, 2000, 2200, 2250, 700, 20, 2500, 2100],
}
_DORMANT_VEGETATION = [1350, 1150, 1150, 1300, 1600, 1900, 2100, 2250, 2350, 800, 15, 2900, 2100]
_CUMULUS = [5200, 5000, 4900, 4800, 4900, 5000, 5100, 5100, 5150, 2600, 500, 3300, 2100]
_HAZE = [1000, 900, 800, 700, 650, 600, 580, 560, 550, 200, 0, 300, 180]  # added at optical depth 1
_HAZE_B10 = 550  # cirrus band signal at optical depth 1
_HAZE_EXTINCTION = 0.25  # ground signal lost at optical depth 1
# Cirrus comes in fine streaks over ~45 % of its envelope, with faint haze between them:
# s2cloudless flags the streaks, its 4 px averaging joins them into one mask, and the mean
# probability over that mask stays below thick_min_prob, so thin haze is detected as thin.
_STREAK_LEVEL = 0.35
_HALO_OPACITY, _HALO_WIDTH = 0.4, 0.4  # opacity and width (in cumulus-field units) of the halo
_SHADOW_DARKENING = 0.55  # direct light lost under a thick cloud's shadow
# S1 backscatter in dB per land cover, before season, moisture, wind and speckle.
_S1_VV = {"water": -25.0, "vegetation": -10.5, "soil": -13.0, "urban": -5.0}
_S1_VH = {"water": -32.0, "vegetation": -19.0, "soil": -21.0, "urban": -12.0}
_S1_LOOKS = 4.4  # equivalent number of looks of GRD speckle


class SynthError(VcloudError, ValueError):
    """A bad argument: a ValueError for callers, one line without traceback for the CLI."""


def default_rois(n: int) -> list[RoiId]:
    """n dataset ROIs: one test ROI, one val ROI, then train ROIs (a roi number repeats)."""
    from vcloud.data.layout import dataset_region, dataset_rois

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SynthError(f"rois: {n!r} is not a positive number of ROIs")
    rest = [roi for roi in dataset_rois() if roi not in _DEFAULT_ROIS]
    rest.sort(key=lambda roi: dataset_region(roi)[1] != "train")  # train ROIs first (stable)
    names = (list(_DEFAULT_ROIS) + rest)[:n]
    if len(names) < n:
        raise SynthError(f"rois: {n} default ROIs asked for, but only {len(names)} exist (name them with --roi)")
    return names


def write_raw_tree(
    out: Path, *, rois: list[RoiId], patches: int, times: int, size: int, seed: int, archives: bool = False
) -> None:
    """Write a synthetic raw tree with wind.csv and truth.csv; the tree appears complete or not at all.

    archives=True writes the tree as the dataset is downloaded instead: one .tar.gz per kind,
    region and part ({s1,s2}_<region>[_test].tar.gz, real inner layout) beside wind.csv and
    truth.csv; the images are the same bytes as in the tree.
    """
    _check_arguments(rois=rois, patches=patches, times=times, size=size, seed=seed)
    if archives:
        from vcloud.data.layout import dataset_region

        other = [str(roi) for roi in rois if dataset_region(roi) is None]
        if other:
            raise SynthError(f"rois: {', '.join(other)} not in SEN12MS-CR-TS, so no archive of the dataset holds it")
    out = Path(out)
    if out.exists() and not (out.is_dir() and _replaceable(out)):
        raise SynthError(f"{out}: exists and is not an empty folder or an earlier synthetic tree")
    with atomic_output(out) as tmp:
        tmp.mkdir()
        wind_rows, truth_rows = [], []
        with _Writer() as writer:
            for roi in rois:
                wind, truth = _write_roi(tmp, roi, writer, patches=patches, times=times, size=size, seed=seed)
                wind_rows += wind
                truth_rows += truth
        _write_csv(tmp / "wind.csv", WIND_HEADER, wind_rows)
        _write_csv(tmp / "truth.csv", TRUTH_HEADER, truth_rows)
        if archives:
            _pack_archives(tmp, rois)
    counts = {name: sum(row[4] == name for row in truth_rows) for name in CLOUD_CLASSES}
    log.info(
        "wrote %s: %d ROIs x %d patches x %d dates at %d px; %s",
        out,
        len(rois),
        patches,
        times,
        size,
        ", ".join(f"{k} {v}" for k, v in counts.items()),
    )


def _check_arguments(*, rois, patches, times, size, seed) -> None:
    for name, value, low in (("patches", patches, 1), ("times", times, 1), ("size", size, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            what = "a non-negative integer" if low == 0 else "a positive integer"
            raise SynthError(f"{name}: {value!r} is not {what}")
    if times > 365:
        raise SynthError(f"times: {times} dates do not fit in one year ({YEAR})")
    if not rois:
        raise SynthError("rois: the list of ROIs is empty")
    if not all(isinstance(roi, RoiId) for roi in rois):
        raise SynthError("rois: every ROI must be a RoiId, e.g. RoiId('ROIs1868', 119)")
    if len(set(rois)) != len(rois):
        raise SynthError(f"rois: {', '.join(sorted({str(r) for r in rois if rois.count(r) > 1}))} listed twice")


def _pack_archives(root: Path, rois: list[RoiId]) -> None:
    """Replace the ROI folders under `root` by the archives that hold them in the dataset."""
    from vcloud.data.archive import archive_for, write_archive

    groups: dict = {}
    for roi in rois:
        for kind in ("s1", "s2"):
            groups.setdefault(archive_for(roi, kind), []).append(roi)
    for name, members in sorted(groups.items(), key=lambda item: item[0].filename):
        files = []
        for roi in members:
            folder = root / roi.rois / str(roi.roi) / name.kind.upper()
            files += [(str(p.relative_to(root)), p.read_bytes()) for p in sorted(folder.rglob("*.tif"))]
        write_archive(root, name, files)
    for folder in sorted({roi.rois for roi in rois}):
        shutil.rmtree(root / folder)


def _replaceable(out: Path) -> bool:
    """Empty, an earlier synthetic tree, or what is left of earlier archives (snakemake removes
    a rule's outputs before rerunning it, but not the archive indexes beside them)."""
    from vcloud.data.archive import INDEX_SUFFIX, parse_archive_name

    entries = {path.name for path in out.iterdir()}
    ours = {"wind.csv", "truth.csv"}
    leftovers = {
        e for e in entries - ours if not (parse_archive_name(e) or parse_archive_name(e.removesuffix(INDEX_SUFFIX)))
    }
    return not entries or ours <= entries or not leftovers


class _Writer:
    """GeoTIFF writes on a few threads (zlib releases the GIL), overlapping the next date's
    computation; at most `max_pending` images wait in memory."""

    def __init__(self, *, max_pending: int = 64) -> None:
        workers = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="synth-write")
        self._pending: deque[Future] = deque()
        self._max_pending = max_pending

    def write(self, path: Path, data: np.ndarray, georef: GeoRef) -> None:
        while len(self._pending) >= self._max_pending:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(write_image, path, data, georef))

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, exc_type, *_) -> None:
        try:
            if exc_type is None:
                while self._pending:
                    self._pending.popleft().result()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _write_csv(path: Path, header: tuple[str, ...], rows: list[tuple]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


# ----------------------------------------------------------------------------- one ROI


@dataclass(frozen=True)
class _Plan:
    """Everything about one ROI that is not a pixel."""

    dates_s2: list[dt.date]
    dates_s1: list[dt.date]
    wind: np.ndarray  # (T, 2) u east, v north in m/s, rounded as written to wind.csv
    classes: np.ndarray  # (P, T) index into CLOUD_CLASSES
    covers: np.ndarray  # (P, T) target cloud cover of thick and thin images
    shadow_px: np.ndarray  # (T, 2) where a thick cloud's shadow lies relative to it (rows, cols)
    s1_nan: np.ndarray  # (P, T) bool: this S1 image gets a strip of NaN pixels
    epsg: int
    origin: tuple[float, float]  # (x0, y0) of patch 0's top-left corner, metres
    peak_doy: float  # day of the year of greenest vegetation
    season_amp: float  # 0 (tropics) .. 1 (strong seasons)


def _rng(seed: int, roi: RoiId, stream: int) -> np.random.Generator:
    # Keyed on the ROI name: a ROI's content does not depend on the other ROIs in the list.
    return np.random.default_rng([seed, int(roi.rois[4:]), roi.roi, stream])


def _plan_roi(roi: RoiId, *, patches: int, times: int, seed: int) -> _Plan:
    rng = _rng(seed, roi, 0)
    step = 365.0 / times
    phase = 0.15 + 0.7 * (0.5 * rng.random() + 0.5 * rng.random(times)) if step >= 4 else np.full(times, 0.5)
    days = np.floor((np.arange(times) + phase) * step).astype(int)
    shift = rng.integers(-S1_MAX_DATE_SHIFT_DAYS, S1_MAX_DATE_SHIFT_DAYS + 1, times)
    days_s1 = np.clip(np.sort(days + shift), 0, 364)  # sorting keeps each within the shift of its S2 date
    jan1 = dt.date(YEAR, 1, 1)

    direction = rng.uniform(0, 2 * np.pi) + rng.normal(0, 0.35, times)  # towards, from east, anticlockwise
    speed = rng.uniform(3, 10) * np.exp(rng.normal(0, 0.25, times))
    wind = np.round(np.stack([speed * np.cos(direction), speed * np.sin(direction)], axis=1), 2)

    never_clear = patches - 1 if patches >= 2 else None
    classes = np.stack(
        [_class_schedule(rng, times, NEVER_CLEAR_SHARES if p == never_clear else CLASS_SHARES) for p in range(patches)]
    )
    thick, thin = CLOUD_CLASSES.index("thick"), CLOUD_CLASSES.index("thin")
    covers = np.where(classes == thick, rng.uniform(0.25, 0.65, classes.shape), 1.0)
    covers = np.where(classes == thin, rng.uniform(0.45, 1.0, classes.shape), covers)

    # Sun between east and west through south (clockwise from north); shadows fall away from it.
    sun_azimuth = rng.uniform(np.pi / 2, 3 * np.pi / 2)
    length = rng.uniform(4, 10, times)
    shadow_px = np.round(np.stack([np.cos(sun_azimuth) * length, -np.sin(sun_azimuth) * length], axis=1))

    # Every ROI gets at least one S1 image with NaN pixels, so preparation always meets some.
    s1_nan = np.zeros(patches * times, bool)
    s1_nan[rng.choice(patches * times, max(1, round(patches * times * S1_NAN_IMAGE_RATE)), replace=False)] = True
    return _Plan(
        dates_s2=[jan1 + dt.timedelta(days=int(d)) for d in days],
        dates_s1=[jan1 + dt.timedelta(days=int(d)) for d in days_s1],
        wind=wind,
        classes=classes,
        covers=covers,
        shadow_px=shadow_px.astype(int),
        s1_nan=s1_nan.reshape(patches, times),
        epsg=32600 + int(rng.integers(1, 61)),
        origin=(float(rng.integers(30, 70) * 10000), float(rng.integers(100, 700) * 10000)),
        peak_doy=rng.uniform(0, 365),
        season_amp=rng.uniform(0.5, 1.0),
    )


def _class_schedule(rng: np.random.Generator, times: int, shares: dict[str, float]) -> np.ndarray:
    """Class per date: counts in proportion to the shares, every class with a share present
    once there are enough dates, in random order."""
    weights = np.array([shares[name] for name in CLOUD_CLASSES])
    exact = weights / weights.sum() * times
    counts = np.floor(exact).astype(int)
    counts[np.argsort(counts - exact, kind="stable")[: times - counts.sum()]] += 1
    present = weights > 0
    if times >= present.sum():
        for i in np.flatnonzero(present & (counts == 0)):
            counts[np.argmax(counts)] -= 1
            counts[i] += 1
    return rng.permutation(np.repeat(np.arange(len(CLOUD_CLASSES)), counts))


def _field(
    rng: np.random.Generator, shape: tuple[int, int], sigma: float, *, stretch: float = 1.0, angle: float = 0.0
) -> np.ndarray:
    """Periodic Gaussian-smoothed noise, mean 0 and std 1; `stretch` elongates it along `angle`
    (radians, in image x/col and y/row axes)."""
    ky = np.fft.fftfreq(shape[0])[:, None]
    kx = np.fft.rfftfreq(shape[1])[None, :]
    along = kx * np.cos(angle) + ky * np.sin(angle)
    across = -kx * np.sin(angle) + ky * np.cos(angle)
    transfer = np.exp(-2 * np.pi**2 * sigma**2 * ((stretch * along) ** 2 + across**2))
    field = np.fft.irfft2(np.fft.rfft2(rng.standard_normal(shape)) * transfer, s=shape)
    return ((field - field.mean()) / max(field.std(), 1e-12)).astype(np.float32)


def _land_field(rng: np.random.Generator, shape: tuple[int, int], sigma: float) -> np.ndarray:
    """Smooth noise on the canvas, cut from a field that holds a few correlation lengths, so
    that scales larger than a small canvas still vary from ROI to ROI (not periodic)."""
    big = (max(shape[0], int(6 * sigma)), max(shape[1], int(6 * sigma)))
    return _field(rng, big, sigma)[: shape[0], : shape[1]]


@dataclass
class _Scene:
    """Per-ROI pixel fields on the canvas (size rows, patches*size cols) and the cloud fields."""

    land: np.ndarray  # (4, H, W) memberships of LAND_COVERS, sum 1
    static_s2: np.ndarray  # (13, H, W) reflectance of water, soil and urban (they do not change)
    vegetation: np.ndarray  # (H, W) vegetation membership times ground brightness
    greenness_shift: np.ndarray  # (H, W) days of phenology shift (fields, crops)
    urban_texture: np.ndarray  # (H, W)
    cumulus: np.ndarray  # (FH, FW) periodic
    cirrus: np.ndarray  # (FH, FW) periodic envelope
    streaks: np.ndarray  # (FH, FW) periodic, elongated along the prevailing wind


def _scene(roi: RoiId, plan: _Plan, *, patches: int, size: int, seed: int) -> _Scene:
    rng = _rng(seed, roi, 1)
    shape = (size, patches * size)
    bias = np.array([-0.7, 0.4, 0.0, -0.4]) + rng.normal(0, 0.35, 4)
    # Three scales: parcels and ponds, fields and villages, lakes and towns.
    logits = np.stack(
        [
            0.45 * _land_field(rng, shape, 5.0)
            + 0.7 * _land_field(rng, shape, 15.0)
            + 0.55 * _land_field(rng, shape, 45.0)
            + b
            for b in bias
        ]
    )
    land = np.exp((logits - logits.max(axis=0)) / 0.2)
    land = (land / land.sum(axis=0)).astype(np.float32)
    brightness = 1 + 0.06 * _land_field(rng, shape, 2.0) + 0.04 * _land_field(rng, shape, 10.0)
    urban_texture = _land_field(rng, shape, 1.0)
    spectra = {name: np.array(values, np.float32)[:, None, None] for name, values in _SPECTRA.items()}
    static_s2 = land[0] * spectra["water"] + land[2] * spectra["soil"]
    static_s2 += land[3] * spectra["urban"] * (1 + 0.12 * urban_texture)
    field_shape = (2 * max(size, 64), (patches + 1) * max(size, 64))
    u, v = plan.wind.mean(axis=0)
    return _Scene(
        land=land,
        static_s2=static_s2 * brightness,
        vegetation=land[1] * brightness,
        greenness_shift=25 * _land_field(rng, shape, 5.0),
        urban_texture=urban_texture,
        cumulus=0.85 * _field(rng, field_shape, 9.0) + 0.3 * _field(rng, field_shape, 3.0),
        cirrus=_field(rng, field_shape, 12.0),
        streaks=_field(rng, field_shape, 1.0, stretch=4.0, angle=np.arctan2(-v, u)),
    )


def _write_roi(root: Path, roi: RoiId, writer: _Writer, *, patches: int, times: int, size: int, seed: int):
    plan = _plan_roi(roi, patches=patches, times=times, seed=seed)
    scene = _scene(roi, plan, patches=patches, size=size, seed=seed)
    rng = _rng(seed, roi, 2)
    # Cloud field position (rows, cols) per date: the pattern moves downwind, east = +col, north = -row.
    drift = np.cumsum(plan.wind * ADVECTION_S / PIXEL_M, axis=0)
    start = rng.integers(0, scene.cumulus.shape)
    x0, y0 = plan.origin
    wind_rows, truth_rows = [], []
    for t in tqdm(range(times), desc=str(roi), unit="date", disable=None, leave=False):
        ground = _ground_s2(scene, plan, t, rng)  # (13, H, W)
        s1 = _s1(scene, plan, t, rng)  # (2, H, W)
        offset = (int(start[0] + round(drift[t, 1])), int(start[1] - round(drift[t, 0])))
        u, v = plan.wind[t]
        wind_rows.append((roi.rois, roi.roi, plan.dates_s2[t].isoformat(), f"{u:.2f}", f"{v:.2f}"))
        for p in range(patches):
            cols = slice(p * size, (p + 1) * size)
            cls = CLOUD_CLASSES[plan.classes[p, t]]
            window = (offset[0], offset[1] + p * size)
            s2, cover = _add_clouds(scene, ground[:, :, cols], cls, plan.covers[p, t], window, plan.shadow_px[t], rng)
            s1_patch = s1[:, :, cols].copy()
            if plan.s1_nan[p, t]:
                _nan_strip(s1_patch, rng)
            georef = GeoRef(plan.epsg, (x0 + p * size * PIXEL_M, PIXEL_M, 0.0, y0, 0.0, -PIXEL_M))
            for kind, data, date in (("s2", s2, plan.dates_s2[t]), ("s1", s1_patch, plan.dates_s1[t])):
                name = RawName(kind=kind, rois=roi.rois, roi=roi.roi, t=t, date=date, patch=p)
                writer.write(name.path(root), data, georef)
            truth_rows.append((roi.rois, roi.roi, p, t, cls, f"{cover:.4f}"))
    return wind_rows, sorted(truth_rows, key=lambda row: (row[2], row[3]))


# ----------------------------------------------------------------------------- pixels


def _greenness(plan: _Plan, scene: _Scene, date: dt.date) -> np.ndarray:
    doy = date.timetuple().tm_yday
    cycle = np.cos(2 * np.pi * (doy - plan.peak_doy - scene.greenness_shift) / 365.0)
    return np.clip(0.55 + 0.45 * plan.season_amp * cycle, 0.0, 1.0)


def _ground_s2(scene: _Scene, plan: _Plan, t: int, rng: np.random.Generator) -> np.ndarray:
    """(13, H, W) float32 clear-sky reflectance x10000 of the whole canvas at date t."""
    green = _greenness(plan, scene, plan.dates_s2[t]).astype(np.float32)
    dormant = np.array(_DORMANT_VEGETATION, np.float32)[:, None, None]
    green_minus_dormant = np.array(_SPECTRA["vegetation"], np.float32)[:, None, None] - dormant
    ground = scene.static_s2 + scene.vegetation * (dormant + green * green_minus_dormant)
    illumination = rng.uniform(0.95, 1.05)
    aerosol = rng.uniform(0, 150) * np.linspace(1, 0, 13, dtype=np.float32)[:, None, None] ** 2
    noise = rng.standard_normal(ground.shape, dtype=np.float32) * (0.01 * ground + 15)
    return (ground * illumination + aerosol + noise).astype(np.float32)


def _s1(scene: _Scene, plan: _Plan, t: int, rng: np.random.Generator) -> np.ndarray:
    """(2, H, W) float32 backscatter in dB (VV, VH) of the whole canvas at the S1 date."""
    green = _greenness(plan, scene, plan.dates_s1[t])
    speed = float(np.hypot(*plan.wind[t]))
    moisture = rng.normal(0, 1.2)  # dB, wet or dry soil at this date
    db = {
        "VV": {
            "water": _S1_VV["water"] + 0.9 * speed,
            "vegetation": _S1_VV["vegetation"] + 1.5 * green,
            "soil": _S1_VV["soil"] + moisture,
            "urban": _S1_VV["urban"] + 2.5 * scene.urban_texture,
        },
        "VH": {
            "water": _S1_VH["water"] + 0.9 * speed,
            "vegetation": _S1_VH["vegetation"] + 4.0 * green,
            "soil": _S1_VH["soil"] + moisture,
            "urban": _S1_VH["urban"] + 2.0 * scene.urban_texture,
        },
    }
    out = []
    for band in S1_BANDS:
        power = sum(scene.land[i] * 10 ** (np.asarray(db[band][name]) / 10) for i, name in enumerate(LAND_COVERS))
        speckle = rng.gamma(_S1_LOOKS, 1 / _S1_LOOKS, power.shape)
        out.append(10 * np.log10(power * speckle))
    return np.stack(out).astype(np.float32)


def _nan_strip(s1: np.ndarray, rng: np.random.Generator) -> None:
    """A few NaN pixels along one edge, as at swath borders in the real data."""
    size = s1.shape[-1]
    width, length = int(rng.integers(1, 3)), int(rng.integers(size // 4, size // 2 + 1))
    edge = int(rng.integers(4))
    near, far = slice(0, width), slice(size - width, size)
    along_near, along_far = slice(0, length), slice(size - length, size)
    rows, cols = [(near, along_near), (far, along_far), (along_near, near), (along_far, far)][edge]
    s1[:, rows, cols] = np.nan


def _window(field: np.ndarray, origin: tuple[int, int], size: int) -> np.ndarray:
    rows = (origin[0] + np.arange(size)) % field.shape[0]
    cols = (origin[1] + np.arange(size)) % field.shape[1]
    return field[np.ix_(rows, cols)]


def _add_clouds(
    scene: _Scene,
    ground: np.ndarray,
    cls: str,
    cover: float,
    origin: tuple[int, int],
    shadow_px: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, float]:
    """Cloudy uint16 S2 image of one patch and its true cloud cover."""
    size = ground.shape[-1]
    cumulus_spectrum = np.array(_CUMULUS, np.float32)[:, None, None]
    if cls == "clear":
        toa, opacity = ground, np.zeros(ground.shape[1:], np.float32)
    elif cls == "opaque":
        texture = _window(scene.cumulus, origin, size)
        opacity = np.clip(0.97 + 0.03 * texture, 0.0, 1.0)
        brightness = rng.uniform(0.85, 1.25) * (1 + 0.08 * texture)
        toa = ground * (1 - opacity) + cumulus_spectrum * brightness * opacity
    elif cls == "thick":
        field = _window(scene.cumulus, origin, size)
        level = np.quantile(field, 1 - cover)
        core = 1 - np.exp(-np.maximum(field - level, 0) / 0.1)
        # Humid halo ("twilight zone") of low opacity around the cumulus, a few pixels wide.
        halo = _HALO_OPACITY * np.sqrt(np.clip((field - level + _HALO_WIDTH) / _HALO_WIDTH, 0, 1))
        opacity = np.maximum(core, halo)
        shadow_origin = (origin[0] - int(shadow_px[0]), origin[1] - int(shadow_px[1]))
        shade = _window(scene.cumulus, shadow_origin, size) > level
        shaded = ground * (1 - _SHADOW_DARKENING * shade)
        brightness = rng.uniform(0.8, 1.2) * (1 + 0.1 * field)
        toa = shaded * (1 - opacity) + cumulus_spectrum * brightness * opacity
    else:  # thin: cirrus streaks inside a smooth envelope
        field = _window(scene.cirrus, origin, size)
        level = np.quantile(field, 1 - cover) if cover < 1 else -np.inf
        envelope = np.clip((field - level) / 0.5, 0.0, 1.0)
        streaks = 1 / (1 + np.exp(-(_window(scene.streaks, origin, size) - _STREAK_LEVEL) / 0.12))
        depth = rng.uniform(0.85, 1.0) * envelope * (0.1 + 0.9 * streaks)
        haze = np.array(_HAZE, np.float32)[:, None, None] * depth
        haze[S2_BANDS.index("B10")] += _HAZE_B10 * depth
        toa = ground * (1 - _HAZE_EXTINCTION * depth) + haze
        opacity = envelope
    true_cover = float((opacity > COVER_MIN_OPACITY).mean())
    return np.clip(np.rint(toa), 1, 65535).astype(np.uint16), true_cover

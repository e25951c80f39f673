"""The prepared store: an xarray Dataset in zarr v3, one chunk per (location, time) image.

Dims: location, time, band_s2 (13), band_s1 (2), y, x, and gt (6) for the geotransform.

| variable       | dims                               | dtype (on disk)  | meaning                           |
| -------------- | ---------------------------------- | ---------------- | --------------------------------- |
| s2             | location, time, band_s2, y, x      | uint16           | reflectance x10000, 0 if missing  |
| s1             | location, time, band_s1, y, x      | float32          | backscatter dB, NaN -> clip floor |
| cloud_prob     | location, time, y, x               | uint8 (CF scale) | s2cloudless probability 0..1      |
| cloud_cover    | location, time                     | float32          | masked fraction, NaN if missing   |
| cloud_class    | location, time                     | int8             | index into CLOUD_CLASSES, -1 bad  |
| valid_s2/s1    | location, time                     | bool             | False: image missing or bad       |
| s1_nan_pixels  | location, time                     | int32            | NaN pixels set to the clip floor  |
| date_s2/s1     | location, time                     | datetime64       | acquisition date, NaT if missing  |
| wind_u/v       | location, time                     | float32          | wind (m/s) when a table was given |
| crs, transform | location / location, gt            | str / float64    | georeferencing per location       |

Coordinates: location (id "ROIs1868_119_p42"), rois ("ROIs1868"), roi (119), patch (42), time.
Attributes: format_version, source, band names, normalisation constants, producer
(package version, git revision, resolved options).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from vcloud import __version__
from vcloud.constants import (
    CLOUD_CLASSES,
    S1_BANDS,
    S1_CLIP_DB,
    S2_BANDS,
    S2_CLIP,
    S2_SCALE,
    STORE_FORMAT_VERSION,
)
from vcloud.errors import BadInputError

log = logging.getLogger(__name__)

CLOUD_PROB_SCALE = 250  # cloud_prob stored as round(p * 250) in uint8; 255 = missing
IMAGE_VARS = ("s2", "s1", "cloud_prob")


def location_id(rois: str, roi: int, patch: int) -> str:
    return f"{rois}_{roi}_p{patch}"


def normalise_s2(s2: np.ndarray) -> np.ndarray:
    """Reflectance x10000 -> float32 0..1 (clip 0..10000, /10000, NaN -> 0)."""
    out = np.clip(s2.astype(np.float32), *S2_CLIP) / np.float32(S2_SCALE)
    return np.nan_to_num(out, nan=0.0)


def normalise_s1(s1_db: np.ndarray) -> np.ndarray:
    """Backscatter dB -> float32 0..1 (clip -25..0 dB, rescale, NaN -> 0)."""
    low, high = S1_CLIP_DB
    out = (np.clip(s1_db.astype(np.float32), low, high) - np.float32(low)) / np.float32(high - low)
    return np.nan_to_num(out, nan=0.0)


def store_attrs(*, source: str, options: dict) -> dict:
    return {
        "format_version": STORE_FORMAT_VERSION,
        "source": source,
        "s2_bands": list(S2_BANDS),
        "s1_bands": list(S1_BANDS),
        "cloud_classes": list(CLOUD_CLASSES),
        "normalisation": {
            "s2": {"clip": list(S2_CLIP), "divide_by": S2_SCALE, "nan_to": 0.0},
            "s1": {"clip_db": list(S1_CLIP_DB), "rescale_to": [0.0, 1.0], "nan_to": 0.0},
        },
        "producer": {"vcloud_version": __version__, "git_revision": git_revision(), "options": options},
    }


def encoding_for(ds) -> dict:
    """Per-variable zarr encoding: one chunk per (location, time) image, compressed."""
    from zarr.codecs import BloscCodec

    size_y, size_x = ds.sizes["y"], ds.sizes["x"]
    images = {
        "s2": (1, 1, len(S2_BANDS), size_y, size_x),
        "s1": (1, 1, len(S1_BANDS), size_y, size_x),
        "cloud_prob": (1, 1, size_y, size_x),
    }
    enc: dict[str, dict] = {}
    for name in ds.data_vars:
        var = ds[name]
        if name in images:
            chunks = images[name]
            shuffle = "bitshuffle" if name != "s1" else "shuffle"
            compressor = BloscCodec(cname="zstd", clevel=3, shuffle=shuffle)
        else:
            chunks = tuple(var.shape)
            compressor = BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")
        enc[name] = {"chunks": chunks, "compressors": (compressor,)}
    enc["cloud_prob"].update(dtype="uint8", scale_factor=1.0 / CLOUD_PROB_SCALE, _FillValue=255)
    return enc


def git_revision() -> str:
    """The git revision of the source tree the package runs from, or 'unknown'."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


@contextmanager
def atomic_output(out: Path) -> Iterator[Path]:
    """Yield a temporary path beside `out`; on success it replaces `out`, on error it is removed.

    A later step never sees a half-written store: `out` is either the old complete one or
    the new complete one.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    _remove(tmp)
    try:
        yield tmp
    except BaseException:
        _remove(tmp)
        raise
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_locations(datasets: Iterator, path: Path) -> int:
    """Write an iterator of one-location Datasets as one store, appending along `location`."""
    count = 0
    for ds in datasets:
        if count == 0:
            ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False, encoding=encoding_for(ds))
        else:
            ds.to_zarr(path, append_dim="location", zarr_format=3, consolidated=False)
        count += 1
    if count:
        import zarr

        # One metadata read per open instead of one per array: it matters on Lustre.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
            zarr.consolidate_metadata(str(path), zarr_format=3)
    return count


def open_store(path: Path):
    """Open a prepared store with xarray (lazy), checking that it is one and of our version."""
    import xarray as xr

    path = Path(path)
    if not path.exists():
        raise BadInputError(f"{path}: prepared store not found")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
            ds = xr.open_zarr(path, consolidated=True, zarr_format=3)
    except Exception as err:  # zarr raises several types for a broken store
        raise BadInputError(f"{path}: not a readable zarr v3 store ({type(err).__name__}: {err})") from None
    version = ds.attrs.get("format_version")
    if version != STORE_FORMAT_VERSION:
        raise BadInputError(
            f"{path}: store format_version {version!r}, this vcloud reads {STORE_FORMAT_VERSION}"
        )
    return ds


def assemble(stores: Sequence[Path], out: Path) -> None:
    """Gather per-ROI stores into one split store, one location at a time (bounded memory)."""
    if not stores:
        raise BadInputError(f"{out}: no input stores to assemble")
    opened = [(Path(p), open_store(p)) for p in stores]
    first_path, first = opened[0]
    seen: dict[str, Path] = {}
    for path, ds in opened:
        for dim in ("time", "y", "x"):
            if ds.sizes[dim] != first.sizes[dim]:
                raise BadInputError(
                    f"{path}: {dim} size {ds.sizes[dim]} differs from {first.sizes[dim]} in {first_path}"
                )
        for loc in ds["location"].values.tolist():
            if loc in seen:
                raise BadInputError(f"{path}: location {loc} is also in {seen[loc]}")
            seen[loc] = path
    sources = [str(p) for p, _ in opened]

    def locations():
        for _, ds in opened:
            for i in range(ds.sizes["location"]):
                one = ds.isel(location=slice(i, i + 1)).load()
                for name in one.variables:
                    one[name].encoding = {}
                one.attrs = store_attrs(
                    source=first.attrs.get("source", ""),
                    options={"assembled_from": sources},
                )
                yield one

    with atomic_output(out) as tmp:
        count = write_locations(locations(), tmp)
    log.info("assembled %d locations from %d stores into %s", count, len(stores), out)


def summary(ds) -> dict:
    """Counts for a log line: locations, images, bad images, cloud-class counts."""
    classes = ds["cloud_class"].values
    return {
        "locations": int(ds.sizes["location"]),
        "images": int(ds["valid_s2"].values.sum() + ds["valid_s1"].values.sum()),
        "missing_s2": int((~ds["valid_s2"].values).sum()),
        "missing_s1": int((~ds["valid_s1"].values).sum()),
        "s1_nan_pixels": int(ds["s1_nan_pixels"].values.sum()),
        "cloud_classes": {name: int((classes == i).sum()) for i, name in enumerate(CLOUD_CLASSES)},
    }


def summary_line(label: str, counts: dict) -> str:
    return f"{label}: " + json.dumps(counts, sort_keys=False)

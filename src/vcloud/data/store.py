"""The prepared store: an xarray Dataset in zarr v3, one chunk per (location, time) image.

Format 2: the image variables (s2, s1, cloud_prob) are sharded, one shard file per location
holding one inner chunk per date, each chunk with a crc32c checksum (read and verified by
shards.py); every other variable is one chunk for the whole store. So a location costs three
files. A split store hard-links the per-ROI shards (`assemble`): one copy of the pixels.

Dims: location, time, band_s2 (13), band_s1 (2), y, x, and gt (6) for the geotransform.

| variable       | dims                               | dtype (on disk)  | meaning                           |
| -------------- | ---------------------------------- | ---------------- | --------------------------------- |
| s2             | location, time, band_s2, y, x      | uint16           | reflectance x10000, 0 if missing  |
| s1             | location, time, band_s1, y, x      | float32          | backscatter dB, NaN -> clip floor |
| cloud_prob     | location, time, y, x               | uint8 (CF scale) | cloud probability 0..1 (below)    |
| cloud_cover    | location, time                     | float32          | masked fraction, NaN if missing   |
| cloud_cover_s2cloudless | location, time            | float32          | with a supplied mask: s2cloudless's cover |
| cloud_agreement | location, time                    | float32          | with a supplied mask: fraction of pixels where it and s2cloudless's mask agree |
| cloud_class    | location, time                     | int8             | index into CLOUD_CLASSES, -1 bad  |
| valid_s2/s1    | location, time                     | bool             | False: image missing or bad       |
| s1_nan_pixels  | location, time                     | int32            | NaN pixels set to the clip floor  |
| date_s2/s1     | location, time                     | datetime64       | acquisition date, NaT if missing  |
| wind_u/v       | location, time                     | float32          | wind (m/s) when a table was given |
| crs, transform | location / location, gt            | str / float64    | georeferencing per location       |
| scene, window  | location / location, win           | int32            | a cut scene's patch: its scene, window row, col, h, w |
| scene_shape, scene_transform | location, hw / location, gt | int32 / float64 | that scene's size and geotransform |

The scene variables are there only when a plain folder's scene larger than the patch was cut into
overlapping patches (data/scenes.py).
Coordinates: location (id "ROIs1868_119_p42"), rois ("ROIs1868"), roi (119), patch (42), time.
The cloud probability and mask are s2cloudless's, or those that came with the data (SCL/ or
MASK/ of a plain folder, data/masks.py); the attribute `cloud_mask` says which (`source`) and how
the pixel mask follows from the stored probability (`pixel_mask`); a store without it is
s2cloudless's.
Attributes: format_version, source, band names, normalisation constants, cloud_mask, producer
(package version, git revision, resolved options), counts (`summary`: missing images, dates kept
with S2 only, short series); a prepared ROI also `series` (its absent dates, folders past `times`).

A date without S1 (no S1 file, or an unreadable one under on_bad_image=skip) is kept with S2:
valid_s1 False, s1 at the clip floor (0 after normalisation). A series shorter than `time` has
its absent dates as missing images (valid_s2 and valid_s1 False): every store of a run keeps
the configured number of dates, so splits assemble.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
from vcloud.io import atomic_output, provenance

log = logging.getLogger(__name__)

CLOUD_PROB_SCALE = 250  # cloud_prob stored as round(p * 250) in uint8; 255 = missing
IMAGE_VARS = ("s2", "s1", "cloud_prob")
# Files a store costs on disk (the data budget counts with these; tests/unit/test_shards.py
# checks them): one shard file per image variable per location, and a fixed part per store
# (zarr.json of every array and one chunk per small table).
FILES_PER_LOCATION = len(IMAGE_VARS)
STORE_METADATA_FILES = 60


def store_bands(attrs: dict) -> tuple[str, ...]:
    """The S2 bands a store holds (its attribute s2_bands; every store records them)."""
    return tuple(attrs.get("s2_bands", S2_BANDS))


def check_bands(store: Path, model_bands: Sequence[str], *, model: str, have: Sequence[str] | None = None) -> None:
    """One line naming the store, its bands and the model's, when a model cannot read the store.
    have: the store's bands when its reader is open already (else the store is opened for them)."""
    from vcloud.bands import band_set_name

    have = tuple(have) if have is not None else store_bands(open_store(store).attrs)
    want = tuple(model_bands)
    if have != want:
        raise BadInputError(
            f"{store}: S2 bands {' '.join(have)} ({band_set_name(have)}), but {model} takes {' '.join(want)} "
            f"({band_set_name(want)}); prepare the store with the model's bands (vcloud prepare --bands)"
        )


PLAIN_FOLDER = "plain folder"  # the start of a store's `source` when prepared from your own imagery (data/folder.py)


def from_plain_folder(attrs: dict) -> bool:
    """Whether a store (its attrs) holds your own imagery rather than SEN12MS-CR-TS's."""
    return str(attrs.get("source", "")).startswith(PLAIN_FOLDER)


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


def store_attrs(*, source: str, options: dict, s2_bands: Sequence[str] = S2_BANDS) -> dict:
    return {
        "format_version": STORE_FORMAT_VERSION,
        "source": source,
        "s2_bands": list(s2_bands),
        "s1_bands": list(S1_BANDS),
        "cloud_classes": list(CLOUD_CLASSES),
        "normalisation": {
            "s2": {"clip": list(S2_CLIP), "divide_by": S2_SCALE, "nan_to": 0.0},
            "s1": {"clip_db": list(S1_CLIP_DB), "rescale_to": [0.0, 1.0], "nan_to": 0.0},
        },
        "producer": {**provenance(), "options": options},
    }


def _codecs(shuffle: str) -> tuple:
    """Blosc zstd, then a crc32c checksum of the compressed bytes: damage is found, not decoded."""
    from zarr.codecs import BloscCodec, Crc32cCodec

    return (BloscCodec(cname="zstd", clevel=3, shuffle=shuffle), Crc32cCodec())


def image_encoding(ds) -> dict:
    """Image variables: one inner chunk per (location, time) image, one shard per location.

    A training sample reads a handful of inner chunks (cheap random access); a location costs
    one file per image variable instead of one per image (30x fewer files on Lustre).
    """
    size_y, size_x, times = ds.sizes["y"], ds.sizes["x"], ds.sizes["time"]
    bands = {"s2": (ds.sizes["band_s2"],), "s1": (len(S1_BANDS),), "cloud_prob": ()}
    enc: dict[str, dict] = {}
    for name in IMAGE_VARS:
        shuffle = "shuffle" if name == "s1" else "bitshuffle"
        enc[name] = {
            "chunks": (1, 1, *bands[name], size_y, size_x),
            "shards": (1, times, *bands[name], size_y, size_x),
            "compressors": _codecs(shuffle),
        }
    enc["cloud_prob"].update(dtype="uint8", scale_factor=1.0 / CLOUD_PROB_SCALE, _FillValue=255)
    return enc


@dataclass(frozen=True)
class ShardLayout:
    """How one image variable is laid out on disk, read from its zarr.json and checked."""

    name: str
    shape: tuple[int, ...]  # (L, T, [bands,] H, W)
    dtype: np.dtype
    image: tuple[int, ...]  # one inner chunk: ([bands,] H, W)

    @property
    def dates(self) -> int:
        return self.shape[1]

    @property
    def image_nbytes(self) -> int:
        return int(np.prod(self.image)) * self.dtype.itemsize

    @classmethod
    def read(cls, store: Path, name: str) -> ShardLayout:
        meta_path = Path(store) / name / "zarr.json"
        try:
            meta = json.loads(meta_path.read_text())
            shape = tuple(meta["shape"])
            (codec,) = meta["codecs"]
            conf = codec["configuration"]
            inner = tuple(conf["chunk_shape"])
            shard = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
            names = [c["name"] for c in conf["codecs"]]
            index_names = [c["name"] for c in conf["index_codecs"]]
            endian = [c.get("configuration", {}).get("endian", "little") for c in conf["codecs"][:1]]
            ok = (
                codec["name"] == "sharding_indexed"
                and names == ["bytes", "blosc", "crc32c"]
                and index_names == ["bytes", "crc32c"]
                and conf.get("index_location", "end") == "end"
                and endian == ["little"]
                and inner[:2] == (1, 1)
                and shard[0] == 1
                and shard[1:] == shape[1:]
            )
            dtype = np.dtype(meta["data_type"]).newbyteorder("<")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise BadInputError(f"{store}: {name} metadata unreadable ({type(err).__name__}: {err})") from None
        if not ok:
            raise BadInputError(f"{store}: {name} is not sharded as this vcloud writes it (one shard per location)")
        return cls(name=name, shape=shape, dtype=dtype, image=inner[2:])

    def shard_path(self, store: Path, location: int) -> Path:
        return Path(store, self.name, "c", str(location), *["0"] * (len(self.shape) - 1))


def table_encoding(ds) -> dict:
    """Per-location and per-(location, time) variables and coordinates: one chunk each, whole."""
    return {
        name: {"chunks": tuple(ds[name].shape) or None, "compressors": _codecs("shuffle")}
        for name in ds.variables
        if ds[name].ndim
    }


def write_locations(datasets: Iterator, path: Path) -> int:
    """Write an iterator of one-location Datasets as one store; returns the number of locations.

    Images are appended one location (one shard per image variable) at a time, so memory stays
    bounded; the small per-location tables are gathered and written once at the end, as one
    chunk per variable, so they cost a constant number of files whatever the location count.
    Same inputs, same bytes: nothing time- or host-dependent is written.
    """
    import xarray as xr

    count = 0
    tables = []
    for ds in datasets:
        images = xr.Dataset({name: ds[name].variable for name in IMAGE_VARS}, attrs=ds.attrs)
        # Every inner chunk is written, even all-fill ones, so a missing chunk or shard is damage.
        common = {"zarr_format": 3, "consolidated": False, "write_empty_chunks": True}
        if count == 0:
            images.to_zarr(path, mode="w", encoding=image_encoding(ds), **common)
        else:
            images.to_zarr(path, append_dim="location", **common)
        tables.append(ds.drop_vars(IMAGE_VARS))
        count += 1
    if count:
        import zarr

        table = xr.concat(tables, dim="location", data_vars="minimal", coords="minimal", compat="override")
        table.attrs = {**tables[0].attrs, "counts": summary(table)}
        table.to_zarr(path, mode="a", zarr_format=3, consolidated=False, encoding=table_encoding(table))
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
        older = isinstance(version, int) and version < STORE_FORMAT_VERSION
        why = "written by an older vcloud (unsharded); prepare it again" if older else "not readable by this vcloud"
        raise BadInputError(
            f"{path}: store format_version {version!r}, this vcloud reads {STORE_FORMAT_VERSION}: {why}"
        )
    return ds


def assemble(stores: Sequence[Path], out: Path, *, dates: DateRanges | None = None) -> None:
    """Gather per-ROI stores into one split store without copying a pixel.

    `dates` (a temporal split, data/splits.py): the split keeps only the dates it names; every other
    date of every location is marked missing in the split's tables (valid_s2 and valid_s1 False, the
    cloud covers NaN, cloud_class -1, s1_nan_pixels 0; the date stays in date_s2), so that no sampler,
    protocol or prediction of the split sees it. The ranges are in the store's attrs
    (`date_ranges`); a split with no S2 date left is refused in one line naming it.

    The split's image shards are hard links to the per-ROI stores' shards (renumbered along
    `location`); only the small per-location tables and the metadata are written. So the split
    is an ordinary store that every reader (xarray, zarr, the loader, the viewer, `vcloud
    verify`) opens as it is, records no paths that could go stale when the workflow moves, and
    costs no extra space and no extra inodes (quota counts both once). Needs the per-ROI stores
    and the split on one filesystem, as results/prepared/ is.
    """
    import xarray as xr

    if not stores:
        raise BadInputError(f"{out}: no input stores to assemble")
    opened = [(Path(p), open_store(p)) for p in stores]
    first_path, first = opened[0]
    seen: dict[str, Path] = {}
    layouts = {name: ShardLayout.read(first_path, name) for name in IMAGE_VARS}
    for path, ds in opened:
        if store_bands(ds.attrs) != store_bands(first.attrs):
            raise BadInputError(
                f"{path}: S2 bands {' '.join(store_bands(ds.attrs))} differ from {' '.join(store_bands(first.attrs))} "
                f"of {first_path}; a split takes one band set"
            )
        if ds.attrs.get("cloud_mask") != first.attrs.get("cloud_mask"):
            raise BadInputError(
                f"{path}: cloud mask {ds.attrs.get('cloud_mask')} differs from {first.attrs.get('cloud_mask')} "
                f"of {first_path}; a split takes one kind of mask"
            )
        if from_plain_folder(ds.attrs) != from_plain_folder(first.attrs):
            raise BadInputError(
                f"{path}: source {ds.attrs.get('source')!r}, {first_path}: {first.attrs.get('source')!r}; a split takes "
                "SEN12MS-CR-TS or your own imagery, not both"
            )
        for dim in ("time", "y", "x"):
            if ds.sizes[dim] != first.sizes[dim]:
                raise BadInputError(
                    f"{path}: {dim} size {ds.sizes[dim]} differs from {first.sizes[dim]} in {first_path}"
                )
        for name in IMAGE_VARS:
            if _array_meta(path, name, shape=False) != _array_meta(first_path, name, shape=False):
                raise BadInputError(f"{path}: {name} is encoded differently from {first_path}")
        for loc in ds["location"].values.tolist():
            if loc in seen:
                raise BadInputError(f"{path}: location {loc} is also in {seen[loc]}")
            seen[loc] = path
    sources = [str(p) for p, _ in opened]
    tables = [ds.drop_vars(IMAGE_VARS).load() for _, ds in opened]
    table = xr.concat(tables, dim="location", data_vars="minimal", coords="minimal", compat="override")
    for name in table.variables:
        table[name].encoding = {}
    table.attrs = store_attrs(
        source=first.attrs.get("source", ""), options={"assembled_from": sources}, s2_bands=store_bands(first.attrs)
    )
    if "s2_product_level" in first.attrs:
        table.attrs["s2_product_level"] = first.attrs["s2_product_level"]
    if "cloud_mask" in first.attrs:
        table.attrs["cloud_mask"] = first.attrs["cloud_mask"]
    if dates is not None:
        kept = dates.mask(table["date_s2"].values)  # (L, T) bool
        for name in ("valid_s2", "valid_s1"):
            table[name] = table[name] & kept
        for name in ("cloud_cover", "cloud_cover_s2cloudless", "cloud_agreement"):
            if name in table:
                table[name] = table[name].where(kept)
        for name, missing in (("cloud_class", -1), ("s1_nan_pixels", 0)):
            table[name] = table[name].where(kept, missing).astype(table[name].dtype)
        table.attrs["date_ranges"] = dates.as_attrs()
        if not (table["valid_s2"].values).any():
            raise BadInputError(f"{out}: no S2 date of {', '.join(sources)} is among the kept ({dates.describe()})")
    table.attrs["counts"] = summary(table)
    total = len(seen)

    with atomic_output(out) as tmp:
        table.to_zarr(tmp, mode="w", zarr_format=3, consolidated=False, encoding=table_encoding(table))
        for name, layout in layouts.items():
            meta = _array_meta(first_path, name, shape=False)
            meta["shape"] = [total, *layout.shape[1:]]
            (tmp / name).mkdir()
            (tmp / name / "zarr.json").write_text(json.dumps(meta, indent=2))
            offset = 0
            for path, ds in opened:
                for location in range(ds.sizes["location"]):
                    _link(layout.shard_path(path, location), layout.shard_path(tmp, offset + location), out)
                offset += ds.sizes["location"]
        import zarr

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
            zarr.consolidate_metadata(str(tmp), zarr_format=3)
    log.info("assembled %d locations from %d stores into %s (image shards hard-linked)", total, len(stores), out)


@dataclass(frozen=True)
class DateRanges:
    """The dates a split store keeps: those in any `keep` range (every date when there is none) and
    in no `drop` range; ranges are (first, last) ISO dates, both included."""

    keep: tuple[tuple[str, str], ...] = ()
    drop: tuple[tuple[str, str], ...] = ()

    def mask(self, dates: np.ndarray) -> np.ndarray:
        day = np.asarray(dates).astype("datetime64[D]")
        inside = lambda first, last: (day >= np.datetime64(first)) & (day <= np.datetime64(last))  # noqa: E731
        kept = np.zeros(day.shape, bool) if self.keep else np.ones(day.shape, bool)
        for first, last in self.keep:
            kept |= inside(first, last)
        for first, last in self.drop:
            kept &= ~inside(first, last)
        return kept & ~np.isnat(day)

    def describe(self) -> str:
        """'2018-06-01..2018-07-31', 'every date but 2018-05-02..2018-08-30', ..."""
        text = ", ".join(f"{a}..{b}" for a, b in self.keep) or "every date"
        return text + (" but " + ", ".join(f"{a}..{b}" for a, b in self.drop) if self.drop else "")

    def as_attrs(self) -> dict:
        return {"keep": [list(r) for r in self.keep], "drop": [list(r) for r in self.drop]}

    def flags(self) -> str:
        """The same ranges as `vcloud assemble` flags: --keep FIRST LAST ... --drop FIRST LAST ..."""
        return " ".join([f"--keep {a} {b}" for a, b in self.keep] + [f"--drop {a} {b}" for a, b in self.drop])


def _array_meta(store: Path, name: str, *, shape: bool) -> dict:
    meta = json.loads((Path(store) / name / "zarr.json").read_text())
    if not shape:
        meta.pop("shape")
    return meta


def _link(source: Path, target: Path, out: Path) -> None:
    if not source.exists():
        raise BadInputError(f"{source}: shard file missing; run `vcloud verify` on its store")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError as err:
        raise BadInputError(
            f"{out}: cannot hard-link {source} ({err.strerror}); keep the per-ROI stores and the split on one filesystem"
        ) from None


def summary(ds) -> dict:
    """Counts for a log line and the store's `counts` attribute: locations, images, missing
    images, dates kept with S2 only (no S1), locations with a short series (fewer dates with S2
    than the store's `time` size) or none at all, and cloud-class counts."""
    classes = ds["cloud_class"].values
    valid_s2, valid_s1 = ds["valid_s2"].values, ds["valid_s1"].values
    s2_dates = valid_s2.sum(axis=1)  # (L,)
    return {
        "locations": int(ds.sizes["location"]),
        "images": int(valid_s2.sum() + valid_s1.sum()),
        "missing_s2": int((~valid_s2).sum()),
        "missing_s1": int((~valid_s1).sum()),
        "dates_s2_only": int((valid_s2 & ~valid_s1).sum()),
        "locations_short": int((s2_dates < ds.sizes["time"]).sum()),
        "locations_without_s2": int((s2_dates == 0).sum()),
        "s1_nan_pixels": int(ds["s1_nan_pixels"].values.sum()),
        "cloud_classes": {name: int((classes == i).sum()) for i, name in enumerate(CLOUD_CLASSES)},
    }


def summary_line(label: str, counts: dict) -> str:
    return f"{label}: " + json.dumps(counts, sort_keys=False)

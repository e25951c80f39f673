"""Direct, checked reads of the prepared store's sharded image arrays, and `vcloud verify`.

The store is zarr v3 (see store.py); an image variable keeps one shard file per location,
`<store>/<var>/c/<location>/0/...`, holding one inner chunk per date. A shard is
    chunk_0 ... chunk_{T-1} | index: T x (offset, nbytes) uint64 LE | crc32c of the index
and an inner chunk is `blosc(image bytes) | crc32c of the blosc bytes` (sharding spec,
index_location "end"). Training reads a handful of inner chunks per sample; going to the file
directly (one open, one index read, one pread per date, blosc into a preallocated array)
costs little more than the decompression itself, where zarr-python's generic path costs
several times that. Every chunk's checksum is checked on every read: a damaged chunk is an
error naming the store, variable, location and date, never a codec traceback.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vcloud.data.reader import Sample
from vcloud.data.store import (
    CLOUD_PROB_SCALE,
    IMAGE_VARS,
    ShardLayout,
    from_plain_folder,
    normalise_s1,
    normalise_s2,
    open_store,
    store_bands,
)
from vcloud.errors import BadInputError

MISSING = np.uint64(2**64 - 1)  # an index entry with this offset and size: chunk not written
_DATE_OF = {"s2": "date_s2", "s1": "date_s1", "cloud_prob": "date_s2"}  # the date that names a chunk


class DamagedStoreError(BadInputError):
    """A chunk of a prepared store cannot be read back: checksum, size or decompression."""

    def __init__(self, message: str):
        # A DataLoader worker's error reaches the main process rebuilt from the worker's
        # formatted traceback; keep only our own last line so the CLI still prints one line.
        last = message.strip().splitlines()[-1] if message.strip() else message
        prefix = f"{type(self).__module__}.{type(self).__qualname__}: "
        super().__init__(last.removeprefix(prefix) if last.startswith(prefix) else message)


class _Damage(Exception):
    """Internal: what is wrong with one shard or chunk; the caller adds the names."""


def _crc32c(data) -> bytes:
    import google_crc32c  # zarr's own crc32c dependency

    return np.uint32(google_crc32c.value(bytes(data))).tobytes()


def _read_index(fd: int, size: int, dates: int) -> np.ndarray:
    need = dates * 16 + 4
    if size < need:
        raise _Damage(f"shard is {size} bytes, shorter than its {need}-byte index")
    raw = os.pread(fd, need, size - need)
    if _crc32c(raw[:-4]) != raw[-4:]:
        raise _Damage("shard index checksum mismatch (shard truncated or overwritten)")
    return np.frombuffer(raw[:-4], dtype="<u8").reshape(dates, 2)


def _decode_into(raw: bytes, out: np.ndarray) -> None:
    from numcodecs import blosc

    if len(raw) < 5:
        raise _Damage(f"chunk of {len(raw)} bytes")
    if _crc32c(raw[:-4]) != raw[-4:]:
        raise _Damage("checksum mismatch")
    try:
        blosc.decompress(raw[:-4], out)
    except Exception as err:  # numcodecs raises RuntimeError/ValueError for bad frames
        raise _Damage(f"decompression failed ({err})") from None


def _chunk_bytes(fd: int, size: int, index: np.ndarray, t: int) -> bytes:
    offset, nbytes = index[t]
    if offset == MISSING and nbytes == MISSING:
        raise _Damage("chunk missing from its shard")
    if int(offset) + int(nbytes) > size - (len(index) * 16 + 4):
        raise _Damage(f"chunk at bytes {int(offset)}..{int(offset) + int(nbytes)} lies past the shard's data")
    return os.pread(fd, int(nbytes), int(offset))


def read_images(
    store: Path,
    layout: ShardLayout,
    location: int,
    times: Sequence[int],
    out: np.ndarray,
    *,
    damaged: list | None = None,
) -> None:
    """Decode the images of `location` at `times` into `out` (len(times), *layout.image).

    A damaged chunk raises ChunkDamage(t, reason) (t None: the whole shard), or, with
    `damaged` given, is appended to it as a ChunkDamage and the other dates are still read.
    """

    def fail(t, reason):
        if damaged is None:
            raise ChunkDamage(t, reason)
        damaged.append(ChunkDamage(t, reason))

    try:
        fd = os.open(layout.shard_path(store, location), os.O_RDONLY)
    except FileNotFoundError:
        return fail(None, "shard file missing")
    try:
        size = os.fstat(fd).st_size
        try:
            index = _read_index(fd, size, layout.dates)
        except _Damage as err:
            return fail(None, str(err))
        for i, t in enumerate(times):
            try:
                _decode_into(_chunk_bytes(fd, size, index, int(t)), out[i])
            except _Damage as err:
                fail(int(t), str(err))
    finally:
        os.close(fd)


class ChunkDamage(Exception):
    """Internal: a damaged chunk at date index `t` (None: the whole shard)."""

    def __init__(self, t: int | None, reason: str):
        super().__init__(reason)
        self.t, self.reason = t, reason


def damage_message(
    store: Path, name: str, location_id: str, t: int | None, dates, reason: str, *, hint: bool = True
) -> str:
    """`<store>: <var> of location <id> at <date> (t=<t>): <reason>` - one line for people."""
    if t is None:
        when = "every date"
    else:
        date = dates[t] if dates is not None else None
        day = "no date" if date is None or np.isnat(date) else str(np.datetime64(date, "D"))
        when = f"{day} (t={t})"
    tail = f"; run `vcloud verify {store}`" if hint else ""
    return f"{store}: {name} of location {location_id} at {when}: {reason}{tail}"


def verify(store: Path) -> list[str]:
    """Read every chunk of a prepared store; one line per damaged chunk (empty: all good)."""
    store = Path(store)
    ds = open_store(store)  # format version, metadata
    problems: list[str] = []
    try:
        locations = [str(v) for v in ds["location"].values]
    except Exception:  # reported below with the other tables; name locations by index meanwhile
        locations = [f"#{i}" for i in range(ds.sizes["location"])]
    tables = [name for name in ds.variables if name not in IMAGE_VARS]
    for name in tables:
        try:
            _ = ds[name].values  # small: one chunk each, checksummed by zarr's crc32c codec
        except Exception as err:  # zarr raises ValueError/RuntimeError for a damaged chunk
            problems.append(f"{store}: {name} (per-location table): {_reason(err)}")
    dates = {}
    for key in set(_DATE_OF.values()):
        try:
            dates[key] = ds[key].values
        except Exception:
            dates[key] = None
    for name in IMAGE_VARS:
        layout = ShardLayout.read(store, name)
        scratch = np.empty((layout.dates, *layout.image), layout.dtype)
        when = dates[_DATE_OF[name]]
        for location in range(layout.shape[0]):
            damaged: list[ChunkDamage] = []
            read_images(store, layout, location, range(layout.dates), scratch, damaged=damaged)
            row = when[location] if when is not None else None
            problems += [
                damage_message(store, name, locations[location], d.t, row, d.reason, hint=False) for d in damaged
            ]
    return problems


def load_table(ds, name: str, store: Path) -> np.ndarray:
    """A small per-location variable in memory, or one line naming it when it is damaged."""
    try:
        return ds[name].values
    except Exception as err:  # zarr raises ValueError/RuntimeError for a damaged chunk
        raise DamagedStoreError(
            f"{store}: {name} (per-location table): {_reason(err)}; run `vcloud verify {store}`"
        ) from None


def _reason(err: Exception) -> str:
    return "checksum mismatch" if "checksum" in str(err) else f"unreadable ({type(err).__name__}: {err})"


@dataclass(frozen=True)
class RawImages:
    """Images of one location at the requested dates, as stored (no normalisation)."""

    s2: np.ndarray  # (T, 13, H, W) uint16 reflectance x10000
    s1: np.ndarray  # (T, 2, H, W) float32 dB
    cloud_prob: np.ndarray  # (T, H, W) uint8 round(p * CLOUD_PROB_SCALE), 255 where S2 is missing


def as_reader(store) -> ShardReader:
    """The store opened once: a ShardReader handed down as it is, a path opened here. A command
    opens its store once and hands the reader to every protocol, sampler and check it runs."""
    return store if isinstance(store, ShardReader) else ShardReader(store)


class ShardReader:
    """Per-(location, time) tables in memory; pixels read straight from the shards on demand.

    Same attributes and `read` as reader.StoreReader (a drop-in), plus `read_raw`, which skips
    normalisation so that it can run on the accelerator. Holds no open file between reads, so
    it pickles into DataLoader workers as it is.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        ds = open_store(self.path)  # validates format version and gives a clear error
        table = lambda name: load_table(ds, name, self.path)  # noqa: E731
        self.locations: list[str] = [str(v) for v in table("location")]
        self.valid_s2 = table("valid_s2")
        self.valid_s1 = table("valid_s1")
        self.cloud_cover = table("cloud_cover")
        self.cloud_class = table("cloud_class")
        self.date_s2 = table("date_s2")
        self.date_s1 = table("date_s1")
        # (L, T, 2) wind (u east, v north; m/s) when the store has it, else NaN: no wind known.
        if "wind_u" in ds:
            self.wind = np.stack([table("wind_u"), table("wind_v")], axis=-1).astype(np.float32)
        else:
            self.wind = np.full((*self.valid_s2.shape, 2), np.nan, np.float32)
        self.shape = (ds.sizes["location"], ds.sizes["time"], ds.sizes["y"], ds.sizes["x"])
        self.cloud_mask: dict = dict(ds.attrs.get("cloud_mask") or {})  # where the mask came from (data/masks.py)
        self.s2_bands: tuple[str, ...] = store_bands(ds.attrs)
        self.s2_level: str = ds.attrs.get("s2_product_level", "L1C")
        self.from_plain_folder = from_plain_folder(ds.attrs)  # your own imagery, not SEN12MS-CR-TS
        self.layouts = {name: ShardLayout.read(self.path, name) for name in IMAGE_VARS}
        # Each location's georeferencing and ROI (vcloud predict's COGs and folders), when kept.
        optional = lambda name: table(name) if name in ds else None  # noqa: E731
        self.crs, self.transform = optional("crs"), optional("transform")
        self.roi_region, self.roi_number = optional("rois"), optional("roi")
        # A plain folder's scene cut into patches (data/scenes.py): each patch's scene, window
        # (row, column, height, width), the scene's size and geotransform; None when not cut.
        self.scene, self.window = optional("scene"), optional("window")
        self.scene_shape, self.scene_transform = optional("scene_shape"), optional("scene_transform")

    def __len__(self) -> int:
        return self.shape[0]

    def _images(self, name: str, location: int, times: Sequence[int]) -> np.ndarray:
        layout = self.layouts[name]
        out = np.empty((len(times), *layout.image), layout.dtype)
        try:
            read_images(self.path, layout, location, times, out)
        except ChunkDamage as err:
            dates = getattr(self, _DATE_OF[name])[location]
            raise DamagedStoreError(
                damage_message(self.path, name, self.locations[location], err.t, dates, err.reason)
            ) from None
        return out

    def read_raw(self, location: int, times: Sequence[int]) -> RawImages:
        times = [int(t) for t in times]
        return RawImages(*(self._images(name, int(location), times) for name in IMAGE_VARS))

    def read(self, location: int, times: Sequence[int]):
        """Normalised as the reference loader (reader.Sample): the CPU path, for evaluation."""
        raw = self.read_raw(location, times)
        index = np.asarray(times, dtype=np.int64)
        prob = np.where(raw.cloud_prob == 255, np.nan, raw.cloud_prob.astype(np.float32) / CLOUD_PROB_SCALE)
        return Sample(
            s2=normalise_s2(raw.s2),
            s1=normalise_s1(raw.s1),
            cloud_prob=prob.astype(np.float32),
            valid_s2=self.valid_s2[location, index],
            valid_s1=self.valid_s1[location, index],
        )

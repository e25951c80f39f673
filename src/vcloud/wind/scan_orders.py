"""Wind-scanner cache: exact, machine-independent scan orders, written once, read by every rank.

Why a file: computing the orders inside the first forward pass deadlocked DDP on LUMI (one
rank computing while the others waited); precomputing them to a file fixed it. So under
DDP (world size > 1) the orders are only ever read, never computed (`get_scan_orders`).

Grid and angles (TopoFlow's convention). The patch grid has H rows and W columns; patch
(row, col) has row-major index row * W + col and coordinates

    x = col / (W - 1) * 2 - 1          (-1 at the west edge, +1 at the east edge)
    y = -(row / (H - 1) * 2 - 1)       (+1 at the top row, -1 at the bottom row)

with x = 0 when W == 1 and y = 0 when H == 1. Sector i of S has angle 2*pi*i/S, 0 = east,
counter-clockwise (pi/2 = north); it is the direction the wind blows towards, so the scan
runs from upwind to downwind by ascending projection x*cos(angle) + y*sin(angle).

Exact sort key and tie rule. Sorting float projections (as the public TopoFlow code does)
makes axis-aligned and diagonal sectors tie on 1e-16 noise, so the order can change from
one machine to the next. Here the key is an integer:

    key = (2*col - (W-1)) * dy * round(cos(angle) * 2**32)
        + (-(2*row - (H-1))) * dx * round(sin(angle) * 2**32),   dx = max(W-1, 1), dy = max(H-1, 1)

which is the projection times dx*dy*2**32 with cos and sin rounded to multiples of 2**-32
(rounding snaps cos(pi/2) ~ 6e-17 to exactly 0 and makes cos(pi/4) == sin(pi/4)). The key
is computed in int64; arguments whose keys could overflow are refused. Patches are sorted
by ascending key; equal keys are broken by ascending row-major index (np.lexsort). For
S = 16 every rounded value lies at least 0.079 from a rounding boundary, so a libm that
differs by a few ulps, or an angle perturbed by 1e-12, gives the same orders.

Crops and windows (why the file has no regional orders). Because the key is linear in
(row, col), the keys of any h x w window of the grid differ from those of the top-left window
by one constant, and ascending row-major index is ascending window-local index: every window
of the same shape has the same order, the global order restricted to it. So a training crop
(or a region) needs no orders of its own: `window_orders` derives them from `orders`.
Format version 1 stored "regional orders" for fixed tiles; they were all identical for the
reason above and nothing read them, so version 2 drops them and refuses version 1.

File (npz, no pickle): `orders` and `inverse` (S, H*W), each in the smallest unsigned dtype
that fits; `meta`, a JSON string with the grid, sectors, the conventions above, the format
version and a sha256 checksum over the grid, sectors and every array's name, dtype, shape
and bytes. Loading checks all of it (and that each inverse is the
inverse permutation) against what the model config expects.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vcloud import __version__
from vcloud.errors import BadInputError, ConfigError, VcloudError
from vcloud.io import atomic_open, one_line, read_npz_with_meta

log = logging.getLogger(__name__)

FORMAT_NAME = "vcloud-wind-cache"
FORMAT_VERSION = 2  # 2: regional orders dropped (see "Crops and windows")
TRIG_SCALE = 2**32  # cos and sin are rounded to integers at this scale
ARRAY_KEYS: tuple[str, ...] = ("orders", "inverse")

ANGLE_CONVENTION = (
    "sector i of S has angle 2*pi*i/S, 0 = east, counter-clockwise, the direction the wind "
    "blows towards; patch (row, col) of an HxW grid has x = col/(W-1)*2-1 (0 if W == 1) and "
    "y = -(row/(H-1)*2-1) (0 if H == 1); orders run upwind to downwind by ascending "
    "x*cos(angle) + y*sin(angle)"
)
TIE_RULE = (
    "sort by the int64 key (2*col-(W-1))*max(H-1,1)*round(cos(angle)*2**32) + "
    "(-(2*row-(H-1)))*max(W-1,1)*round(sin(angle)*2**32), then by ascending row-major "
    "index"
)


@dataclass(frozen=True, eq=False)
class WindCache:
    """Scan orders as int64 arrays, and the file's meta (or the computed one).

    orders[s] lists the row-major patch indices from upwind to downwind for sector s;
    inverse[s][g] is the position of patch g in orders[s].
    """

    orders: np.ndarray  # (S, H*W)
    inverse: np.ndarray  # (S, H*W)
    meta: dict

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.meta["grid"])

    @property
    def sectors(self) -> int:
        return int(self.meta["sectors"])


# --- arguments -------------------------------------------------------------------------


def _check_arguments(grid_h: int, grid_w: int, sectors: int) -> None:
    for option, value in (("--grid-h", grid_h), ("--grid-w", grid_w), ("--sectors", sectors)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"{option}: expected a positive integer, got {value!r}")
    dx, dy = max(grid_w - 1, 1), max(grid_h - 1, 1)
    if 2 * dx * dy * TRIG_SCALE >= 2**63:
        raise ConfigError(f"--grid-h/--grid-w: grid {grid_h}x{grid_w} is too large for exact int64 scan keys")


# --- orders ----------------------------------------------------------------------------


def sector_angles(sectors: int) -> np.ndarray:
    """(S,) float64 angles in radians: 2*pi*i/S, 0 = east, counter-clockwise."""
    return 2.0 * np.pi * np.arange(sectors) / sectors


def scan_keys(grid_h: int, grid_w: int, angle: float) -> np.ndarray:
    """(H*W,) int64 exact sort keys of the row-major patches for one angle (module docstring)."""
    dx, dy = max(grid_w - 1, 1), max(grid_h - 1, 1)
    cos_q = int(round(math.cos(angle) * TRIG_SCALE))
    sin_q = int(round(math.sin(angle) * TRIG_SCALE))
    rows, cols = np.divmod(np.arange(grid_h * grid_w, dtype=np.int64), grid_w)
    x_num = 2 * cols - (grid_w - 1)  # x * dx
    y_num = (grid_h - 1) - 2 * rows  # y * dy
    return x_num * (dy * cos_q) + y_num * (dx * sin_q)


def global_order(grid_h: int, grid_w: int, angle: float) -> np.ndarray:
    """(H*W,) int64 row-major patch indices, upwind to downwind; ties by ascending index."""
    keys = scan_keys(grid_h, grid_w, angle)
    return np.lexsort((np.arange(keys.size), keys))


def window_orders(orders: np.ndarray, grid: tuple[int, int], window: tuple[int, int]) -> np.ndarray:
    """(S, h*w) window-local row-major indices in each sector's order, for any h x w window.

    The global order restricted to the top-left window; by the module docstring's argument
    it is the order of every window of that shape (a training crop's token grid).
    """
    (grid_h, grid_w), (h, w) = grid, window
    if not (1 <= h <= grid_h and 1 <= w <= grid_w):
        raise ConfigError(f"window {h}x{w} does not fit the wind cache's grid {grid_h}x{grid_w}")
    rows, cols = np.divmod(orders, grid_w)  # (S, H*W)
    inside = (rows < h) & (cols < w)
    return (rows * w + cols)[inside].reshape(orders.shape[0], h * w)


def _inverse(orders: np.ndarray) -> np.ndarray:
    """Inverse permutations along the last axis: inverse[..., orders[..., k]] = k."""
    inverse = np.empty_like(orders)
    positions = np.broadcast_to(np.arange(orders.shape[-1]), orders.shape)
    np.put_along_axis(inverse, orders, positions, axis=-1)
    return inverse


def _compute_arrays(grid_h: int, grid_w: int, sectors: int) -> dict[str, np.ndarray]:
    keys = np.stack([scan_keys(grid_h, grid_w, a) for a in sector_angles(sectors)])  # (S, N)
    orders = np.stack([np.lexsort((np.arange(grid_h * grid_w), k)) for k in keys])  # (S, N)
    return {"orders": orders, "inverse": _inverse(orders)}


def _stored_arrays(grid_h: int, grid_w: int, sectors: int) -> dict[str, np.ndarray]:
    """The arrays as written: each in the smallest unsigned dtype that holds its values."""
    arrays = _compute_arrays(grid_h, grid_w, sectors)
    return {
        name: array.astype(np.min_scalar_type(int(array.max()) if array.size else 0)) for name, array in arrays.items()
    }


def _checksum(arrays: dict[str, np.ndarray], grid: tuple, sectors: int) -> str:
    """sha256 of the layout (grid, sectors) and each array's name, dtype, shape, bytes."""
    digest = hashlib.sha256()
    layout = {"grid": list(grid), "sectors": int(sectors)}
    digest.update(json.dumps(layout, sort_keys=True).encode())
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _meta(grid_h: int, grid_w: int, sectors: int, arrays: dict[str, np.ndarray]) -> dict:
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "grid": [grid_h, grid_w],
        "sectors": sectors,
        "angle_convention": ANGLE_CONVENTION,
        "tie_rule": TIE_RULE,
        "trig_scale": TRIG_SCALE,
        "checksum_sha256": _checksum(arrays, (grid_h, grid_w), sectors),
        "vcloud_version": __version__,
    }


def _as_cache(arrays: dict[str, np.ndarray], meta: dict) -> WindCache:
    return WindCache(**{name: arrays[name].astype(np.int64) for name in ARRAY_KEYS}, meta=meta)


def compute_cache(*, grid_h: int, grid_w: int, sectors: int) -> WindCache:
    """Compute the orders in memory (single process only; see `get_scan_orders`)."""
    _check_arguments(grid_h, grid_w, sectors)
    arrays = _stored_arrays(grid_h, grid_w, sectors)
    return _as_cache(arrays, _meta(grid_h, grid_w, sectors, arrays))


# --- file ------------------------------------------------------------------------------


def write_cache(out: Path, *, grid_h: int, grid_w: int, sectors: int) -> None:
    """Write the cache npz atomically: a temp file in the same folder, then os.replace."""
    out = Path(out)
    _check_arguments(grid_h, grid_w, sectors)
    arrays = _stored_arrays(grid_h, grid_w, sectors)
    meta = _meta(grid_h, grid_w, sectors, arrays)
    try:
        with atomic_open(out, "wb") as handle:
            np.savez_compressed(handle, **arrays, meta=np.array(json.dumps(meta, sort_keys=True)))
    except OSError as err:
        raise VcloudError(f"{out}: cannot write the wind cache ({err.strerror or err})") from err
    log.info("wrote wind cache %s (grid %dx%d, %d sectors)", out, grid_h, grid_w, sectors)


def _read(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    # the version before the arrays: an old file lacks or adds some
    return read_npz_with_meta(
        path, what="wind cache", array_keys=ARRAY_KEYS, check_meta=lambda meta: _check_version(path, meta)
    )


def _check_version(path: Path, meta: dict) -> None:
    version = meta.get("format_version")
    if meta.get("format") != FORMAT_NAME or version != FORMAT_VERSION:
        raise ConfigError(
            f"{path}: format {meta.get('format')!r} version {version!r} in the file, "
            f"this vcloud reads {FORMAT_NAME!r} version {FORMAT_VERSION}; "
            f"rerun `vcloud wind-cache --out {path}` (or delete it and rerun snakemake)"
        )


def _validate(path: Path, arrays: dict[str, np.ndarray], meta: dict, *, grid_h: int, grid_w: int, sectors: int) -> None:
    rerun = f"rerun `vcloud wind-cache --out {path}`"
    try:
        file_grid = tuple(int(n) for n in meta["grid"])
        file_sectors = int(meta["sectors"])
        checksum = str(meta["checksum_sha256"])
    except (KeyError, TypeError, ValueError) as err:
        raise BadInputError(f"{path}: wind cache meta is incomplete ({one_line(err)})") from err
    if file_grid != (grid_h, grid_w):
        raise ConfigError(
            f"{path}: grid {file_grid[0]}x{file_grid[1]} in the file, model config wants {grid_h}x{grid_w}"
        )
    if file_sectors != sectors:
        raise ConfigError(f"{path}: {file_sectors} sectors in the file, model config wants {sectors}")
    if _checksum(arrays, file_grid, file_sectors) != checksum:
        raise BadInputError(f"{path}: checksum mismatch, the file is corrupt; {rerun}")
    for name in ARRAY_KEYS:
        if arrays[name].shape != (sectors, grid_h * grid_w):
            raise BadInputError(f"{path}: {name} has shape {arrays[name].shape}, expected {(sectors, grid_h * grid_w)}")


def _check_permutations(path: Path, cache: WindCache) -> None:
    order, inverse = cache.orders, cache.inverse
    n = order.shape[-1]
    in_range = all(a.min(initial=0) >= 0 and a.max(initial=0) < n for a in (order, inverse))
    identity = np.broadcast_to(np.arange(n), order.shape)
    if not in_range or not np.array_equal(np.take_along_axis(order, inverse, -1), identity):
        raise BadInputError(f"{path}: inverse is not the inverse of orders")


def load_cache(path: Path, *, grid_h: int, grid_w: int, sectors: int) -> WindCache:
    """Read and check a cache file against what the model config expects."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: wind cache not found; run `vcloud wind-cache --out {path}` first")
    arrays, meta = _read(path)
    _validate(path, arrays, meta, grid_h=grid_h, grid_w=grid_w, sectors=sectors)
    cache = _as_cache(arrays, meta)
    _check_permutations(path, cache)
    return cache


def get_scan_orders(
    path: Path, *, grid_h: int, grid_w: int, sectors: int, world_size: int, allow_recompute: bool
) -> WindCache:
    """Load the cache; compute it in memory only when it is missing on a single process.

    Under DDP (world_size > 1) a missing file is an error, never a recompute: computing in
    the forward pass is what deadlocked the ranks on LUMI.
    """
    path = Path(path)
    if path.exists():
        return load_cache(path, grid_h=grid_h, grid_w=grid_w, sectors=sectors)
    if world_size > 1:
        raise BadInputError(
            f"{path}: wind cache not found and world size is {world_size}; scan orders are "
            f"never computed under DDP, run `vcloud wind-cache --out {path}` before training"
        )
    if not allow_recompute:
        raise BadInputError(f"{path}: wind cache not found; run `vcloud wind-cache --out {path}` first")
    log.warning("%s: wind cache not found; computing scan orders in memory (one process)", path)
    return compute_cache(grid_h=grid_h, grid_w=grid_w, sectors=sectors)


# --- wind ------------------------------------------------------------------------------


def sector_from_wind(u, v, sectors: int) -> np.ndarray:
    """Nearest sector index of wind (u east, v north), as an int64 array shaped like u and v.

    The angle atan2(v, u) is rounded to the nearest multiple of 2*pi/S on the circle (0 =
    east, counter-clockwise; exactly half-way goes counter-clockwise). Calm (u == v == 0)
    or non-finite wind gives -1, meaning "no reordering".
    """
    if isinstance(sectors, bool) or not isinstance(sectors, (int, np.integer)) or sectors < 1:
        raise ConfigError(f"sectors: expected a positive integer, got {sectors!r}")
    u, v = np.broadcast_arrays(np.asarray(u, dtype=np.float64), np.asarray(v, dtype=np.float64))
    calm = ~(np.isfinite(u) & np.isfinite(v)) | ((u == 0) & (v == 0))
    with np.errstate(invalid="ignore"):
        angle = np.where(calm, 0.0, np.arctan2(v, u))  # (-pi, pi]
    index = np.floor(angle / (2.0 * np.pi / sectors) + 0.5).astype(np.int64) % sectors
    return np.where(calm, -1, index)

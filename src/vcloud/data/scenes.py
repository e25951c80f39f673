"""Scenes of any extent cut into overlapping patches: the grid, the scene's georeferencing, windowed reads.

A plain folder's image (data/folder.py) may be any size of at least one patch per side: an area
of 1,000 x 700 px or a whole 10,980 px tile. It is cut into `size` x `size` patches on a regular
grid whose step is `size - overlap`; the last row and column are snapped to the scene's bottom and
right edge (they overlap their neighbour by more), so every pixel is in a patch and no patch
leaves the scene. Each patch is one location of the prepared store, with its window (row, column,
height, width in the scene) and the scene's size and geotransform recorded beside it, so that
`vcloud predict` can blend the patches back into one image on the scene's own grid
(apply/blend.py). A scene smaller than a patch is refused: padding would feed the model pixels
that are not there.

Reads are windowed (rasterio): one patch of one date at a time, whatever the scene's size.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vcloud.data.geotiff import BadImageError, GeoRef
from vcloud.errors import BadInputError


def default_overlap(size: int) -> int:
    """Pixels two neighbouring patches share by default: an eighth of the patch (32 at 256 px), at
    least 16 (half a 32 px patch), so that a patch's outer 4 rows, where patch-edge error lives
    (docs/patch-edges.md), get at most 3.5/16 of the blend's weight."""
    return min(size // 2, max(16, size // 8))


def check_overlap(size: int, overlap: int) -> int:
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap <= size // 2:
        raise BadInputError(f"--overlap {overlap!r}: expected whole pixels from 0 to half the patch ({size // 2})")
    return overlap


def starts(length: int, size: int, overlap: int) -> list[int]:
    """Offsets of the patches along one axis of `length` px: every size - overlap, the last one
    snapped to length - size."""
    assert length >= size, f"{length} px cannot hold a {size} px patch"
    step = size - overlap
    out = list(range(0, length - size + 1, step))
    if out[-1] != length - size:
        out.append(length - size)
    return out


def patch_windows(height: int, width: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """(row, column) of every patch of a height x width scene, row by row."""
    return [(r, c) for r in starts(height, size, overlap) for c in starts(width, size, overlap)]


@dataclass(frozen=True)
class SceneGrid:
    """A scene's grid: what every date of one location must share."""

    crs: str  # "EPSG:32633"; "" when the file has none
    transform: tuple[float, float, float, float, float, float]  # GDAL geotransform
    height: int
    width: int

    def describe(self) -> str:
        return f"{self.height}x{self.width} px, {self.crs or 'no CRS'} {self.transform}"

    def window_georef(self, row: int, col: int) -> GeoRef:
        """The GeoRef of the patch at (row, col): the scene's transform shifted by the window."""
        x0, pw, rx, y0, ry, ph = self.transform
        epsg = int(self.crs.split(":")[1]) if self.crs.startswith("EPSG:") else 0
        return GeoRef(epsg, (x0 + col * pw + row * rx, pw, rx, y0 + col * ry + row * ph, ry, ph))


def scene_grid(path: Path) -> SceneGrid:
    """The grid of one GeoTIFF, from its header alone; one line naming the file if unreadable."""
    import rasterio

    try:
        with warnings.catch_warnings(), rasterio.open(path) as src:
            warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)  # its grid is then pixels
            epsg = src.crs.to_epsg() if src.crs else None
            crs = f"EPSG:{epsg}" if epsg else (src.crs.to_string() if src.crs else "")
            return SceneGrid(crs, tuple(float(v) for v in src.transform.to_gdal()), src.height, src.width)
    except rasterio.errors.RasterioError as err:
        raise BadInputError(f"{path}: not a readable GeoTIFF ({err})") from None


def read_window(path: Path, *, row: int, col: int, size: int, bands: int, dtype) -> np.ndarray:
    """(bands, size, size) of the patch at (row, col); BadImageError says why not (as read_image).

    dtype: the one dtype the image must have, or a tuple of those it may have."""
    import rasterio
    from rasterio.windows import Window

    try:
        with rasterio.open(path) as src:
            count, dtypes = src.count, set(src.dtypes)
            data = src.read(window=Window(col, row, size, size)) if count == bands else None
    except rasterio.errors.RasterioError as err:
        raise BadImageError(f"not a readable TIFF ({type(err).__name__}: {err})") from None
    if count != bands:
        err = BadImageError(f"wrong band count: {count}, expected {bands}")
        err.bands = count  # what the file holds: prepare says what to do with it
        raise err
    allowed = [np.dtype(d) for d in (dtype if isinstance(dtype, tuple) else (dtype,))]
    if len(dtypes) != 1 or np.dtype(dtypes.pop()) not in allowed:
        raise BadImageError(f"wrong dtype: {data.dtype}, expected {' or '.join(str(d) for d in allowed)}")
    return data

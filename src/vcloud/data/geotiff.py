"""GeoTIFF reading and writing with tifffile, with the checks a raw SEN12MS-CR-TS image needs.

Georeferencing is kept as an EPSG code plus a GDAL-style geotransform
(x0, pixel_w, 0, y0, 0, -pixel_h), read from and written to the standard GeoTIFF tags
(ModelPixelScale 33550, ModelTiepoint 33922, GeoKeyDirectory 34735).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile

TAG_PIXEL_SCALE = 33550
TAG_TIEPOINT = 33922
TAG_TRANSFORMATION = 34264
TAG_GEOKEYS = 34735
KEY_MODEL_TYPE = 1024
KEY_RASTER_TYPE = 1025
KEY_GEOGRAPHIC_CRS = 2048
KEY_PROJECTED_CRS = 3072


class BadImageError(ValueError):
    """A raw image that cannot be used; str() is the reason, without the path."""


@dataclass(frozen=True)
class GeoRef:
    epsg: int  # 0 when the file carries no CRS
    transform: tuple[float, float, float, float, float, float]

    @property
    def crs(self) -> str:
        return f"EPSG:{self.epsg}" if self.epsg else ""


NO_GEOREF = GeoRef(0, (0.0, 1.0, 0.0, 0.0, 0.0, -1.0))


def write_image(path: Path, data: np.ndarray, georef: GeoRef) -> None:
    """Write a (bands, H, W) array as a band-separate GeoTIFF."""
    assert data.ndim == 3, f"expected (bands, H, W), got shape {data.shape}"
    x0, pixel_w, _, y0, _, neg_pixel_h = georef.transform
    projected = georef.epsg not in (0, 4326)
    geokeys = [1, 1, 0, 3]
    geokeys += [KEY_MODEL_TYPE, 0, 1, 1 if projected else 2]
    geokeys += [KEY_RASTER_TYPE, 0, 1, 1]  # PixelIsArea
    geokeys += [KEY_PROJECTED_CRS if projected else KEY_GEOGRAPHIC_CRS, 0, 1, georef.epsg]
    extratags = [
        (TAG_PIXEL_SCALE, "d", 3, (pixel_w, -neg_pixel_h, 0.0), True),
        (TAG_TIEPOINT, "d", 6, (0.0, 0.0, 0.0, x0, y0, 0.0), True),
        (TAG_GEOKEYS, "H", len(geokeys), tuple(geokeys), True),
    ]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tifffile.imwrite(
        path,
        data,
        photometric="minisblack",
        planarconfig="separate",
        compression="zlib",
        extratags=extratags,
    )


def read_image(path: Path, *, bands: int, size: int, dtype) -> tuple[np.ndarray, GeoRef]:
    """Read one raw image as (bands, H, W) and its georeferencing; BadImageError says why not.

    dtype: the one dtype the image must have, or a tuple of those it may have.
    """
    try:
        with tifffile.TiffFile(path) as tif:
            page = tif.pages.first
            series = tif.series[0]
            data = series.asarray()
            georef = _georef(page)
            separate = page.planarconfig == tifffile.PLANARCONFIG.SEPARATE
    except Exception as err:  # any decoder failure means the file is unusable
        raise BadImageError(f"not a readable TIFF ({type(err).__name__}: {err})") from None
    if data.ndim == 2:
        data = data[np.newaxis]
    elif data.ndim == 3 and not separate:
        data = np.moveaxis(data, -1, 0)  # (H, W, bands) -> (bands, H, W)
    if data.ndim != 3:
        raise BadImageError(f"unexpected array shape {data.shape}")
    if data.shape[0] != bands:
        err = BadImageError(f"wrong band count: {data.shape[0]}, expected {bands}")
        err.bands = data.shape[0]  # what the file holds: prepare says what to do with it
        raise err
    if data.shape[1:] != (size, size):
        raise BadImageError(f"wrong size: {data.shape[1]}x{data.shape[2]}, expected {size}x{size}")
    allowed = [np.dtype(d) for d in (dtype if isinstance(dtype, tuple) else (dtype,))]
    if data.dtype not in allowed:
        raise BadImageError(f"wrong dtype: {data.dtype}, expected {' or '.join(str(d) for d in allowed)}")
    return data, georef


def _georef(page: tifffile.TiffPage) -> GeoRef:
    tags = page.tags
    geokeys = tags.get(TAG_GEOKEYS)
    epsg = 0
    if geokeys is not None:
        values = list(geokeys.value)
        for i in range(4, 4 + 4 * values[3], 4):
            key, location, _, value = values[i : i + 4]
            if key in (KEY_PROJECTED_CRS, KEY_GEOGRAPHIC_CRS) and location == 0:
                epsg = int(value)
    if TAG_TRANSFORMATION in tags:
        m = tags[TAG_TRANSFORMATION].value
        return GeoRef(epsg, (m[3], m[0], m[1], m[7], m[4], m[5]))
    if TAG_PIXEL_SCALE in tags and TAG_TIEPOINT in tags:
        sx, sy = tags[TAG_PIXEL_SCALE].value[:2]
        i, j, _, x, y, _ = tags[TAG_TIEPOINT].value[:6]
        return GeoRef(epsg, (x - i * sx, sx, 0.0, y + j * sy, 0.0, -sy))
    return GeoRef(epsg, NO_GEOREF.transform)

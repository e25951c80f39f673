"""Writing `vcloud predict`'s rasters: Cloud-Optimized GeoTIFFs and per-ROI VRT mosaics.

rasterio (GDAL, bundled in its wheels) writes the image into memory and rio-cogeo's
cog_translate turns it into a COG (internal tiles, DEFLATE with the horizontal predictor,
overviews by averaging) at a temporary name beside the output, renamed into place when whole
(io.atomic_output). GDAL writes no timestamp: the same pixels give the same bytes.

A mosaic is a GDAL VRT: a small XML file that places each location's file at the offset its
stored geotransform gives, in the ROI's common grid. It copies no pixels; GDAL, QGIS and
rasterio read it as one raster. The locations must share one CRS and pixel size (one ROI
of SEN12MS-CR-TS does).
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np

from vcloud.io import atomic_output, atomic_write_text

COG_PROFILE = "deflate"  # rio-cogeo profile: lossless, read by every GIS


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def block_size(height: int, width: int) -> int:
    """Internal tile side: half the image (so there is one overview level), a multiple of 16
    (GDAL's rule for tiles), at least 16 and at most 512."""
    return int(min(512, max(16, (min(height, width) // 2) // 16 * 16)))


def write_cog(
    out: Path,
    data: np.ndarray,
    *,
    crs: str,
    transform: tuple[float, ...],
    descriptions: list[str],
    tags: dict[str, str],
    nodata: float | None = None,
) -> None:
    """(bands, H, W) array -> a COG at `out` with `crs` and GDAL geotransform `transform`."""
    import rasterio
    from rasterio.io import MemoryFile
    from rasterio.transform import Affine
    from rio_cogeo.cogeo import cog_translate
    from rio_cogeo.profiles import cog_profiles

    bands, height, width = data.shape
    profile = {
        "driver": "GTiff",
        "dtype": data.dtype.name,
        "count": bands,
        "height": height,
        "width": width,
        "crs": rasterio.crs.CRS.from_user_input(crs) if crs else None,
        "transform": Affine.from_gdal(*transform),
        "nodata": nodata,
    }
    tile = block_size(height, width)
    cog = cog_profiles.get(COG_PROFILE)
    cog.update(blockxsize=tile, blockysize=tile, predictor=2)
    with MemoryFile() as memory:
        with memory.open(**profile) as dataset:
            dataset.write(data)
            dataset.descriptions = tuple(descriptions)
            dataset.update_tags(**tags)
        with memory.open() as source, atomic_output(out) as tmp, warnings.catch_warnings():
            # rio-cogeo's own use of affine's `*` (its concern, harmless here)
            warnings.filterwarnings("ignore", category=PendingDeprecationWarning, module="rio_cogeo")
            cog_translate(source, tmp, cog, in_memory=True, quiet=True, overview_resampling="average")


def write_vrt(out: Path, tiles: list[dict], *, descriptions: list[str], data_type: str = "UInt16") -> str | None:
    """A VRT placing `tiles` ({path, crs, transform, height, width}) in one grid; None when it
    was written, else why not (several CRSs or pixel sizes, rotation, off-grid offsets)."""
    if len({t["crs"] for t in tiles}) != 1:
        return "locations in more than one CRS"
    x0s, pws, rxs, y0s, rys, phs = np.array([t["transform"] for t in tiles], np.float64).T
    if np.any(rxs != 0) or np.any(rys != 0):
        return "a rotated geotransform"
    if not (np.allclose(pws, pws[0]) and np.allclose(phs, phs[0])):
        return "locations with different pixel sizes"
    pixel_w, pixel_h = float(pws[0]), float(phs[0])  # pixel_h < 0 (north up)
    left, top = float(x0s.min()), float(y0s.max() if pixel_h < 0 else y0s.min())
    offsets = [((t["transform"][0] - left) / pixel_w, (t["transform"][3] - top) / pixel_h) for t in tiles]
    if not all(abs(v - round(v)) < 1e-6 for xy in offsets for v in xy):
        return "locations not on one pixel grid"
    width = max(round(x) + t["width"] for (x, _), t in zip(offsets, tiles))
    height = max(round(y) + t["height"] for (_, y), t in zip(offsets, tiles))
    srs = _wkt(tiles[0]["crs"])
    lines = [f'<VRTDataset rasterXSize="{width}" rasterYSize="{height}">']
    if srs:
        lines.append(f'  <SRS dataAxisToSRSAxisMapping="1,2">{escape(srs)}</SRS>')
    lines.append(f"  <GeoTransform>{left!r}, {pixel_w!r}, 0.0, {top!r}, 0.0, {pixel_h!r}</GeoTransform>")
    for band, description in enumerate(descriptions, start=1):
        lines.append(f'  <VRTRasterBand dataType="{data_type}" band="{band}">')
        lines.append(f"    <Description>{escape(description)}</Description>")
        for (x, y), tile in zip(offsets, tiles):
            name = escape(_relative(Path(tile["path"]), Path(out).parent))
            size = f'xSize="{tile["width"]}" ySize="{tile["height"]}"'
            lines += [
                "    <SimpleSource>",
                f'      <SourceFilename relativeToVRT="1">{name}</SourceFilename>',
                f"      <SourceBand>{band}</SourceBand>",
                f'      <SrcRect xOff="0" yOff="0" {size}/>',
                f'      <DstRect xOff="{round(x)}" yOff="{round(y)}" {size}/>',
                "    </SimpleSource>",
            ]
        lines.append("  </VRTRasterBand>")
    lines.append("</VRTDataset>\n")
    text = "\n".join(lines)
    if not (Path(out).is_file() and Path(out).read_text() == text):  # a rerun leaves an unchanged mosaic alone
        atomic_write_text(out, text)
    return None


def _relative(path: Path, folder: Path) -> str:
    import os

    return Path(os.path.relpath(path, folder)).as_posix()


def _wkt(crs: str) -> str:
    if not crs:
        return ""
    from rasterio.crs import CRS

    return CRS.from_user_input(crs).to_wkt()

"""ERA5 10 m wind (u10, v10) for the real dataset, from the public ARCO-ERA5 zarr store.

`vcloud era5-wind` writes one small zarr store (resources/wind/era5_u10v10.zarr) with a group
per ROI (its slug, e.g. ROIs1868_119): u10 and v10 on (time, latitude, longitude), the hours
at noon UTC of every acquisition date of the ROI, on the ERA5 cells around its locations.
`vcloud prepare --wind` (data.wind_values.WindSource) opens the ROI's group and interpolates it to
each location's centre and date, exactly as it does for any ERA5 u10/v10 grid.

The source needs no account: Google's ARCO-ERA5 copy on public cloud storage (read over
HTTPS with fsspec; any path or URL xarray opens as zarr works, e.g. a local copy). Its
surface variables are `10m_u_component_of_wind` / `10m_v_component_of_wind` on (time,
latitude 90..-90, longitude 0..359.75) at 0.25 deg, and each hourly field is one chunk, so
the fetch reads every needed hour once (one global field per variable, a few MB) and cuts
every ROI's box out of it: the download grows with the number of distinct dates, not ROIs.

Which places and dates a ROI needs is decided in one function, `wind_needs`, from the raw
data (file names give the dates, GeoTIFF georeferencing the places): a ROI of the dataset, or
one of your own locations (a plain folder, data/folder.py, prepared as the ROI it is given, e.g.
the workflow's ROIs9000/<n>), whose group then carries that ROI's slug (ROIs9000_<n>).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vcloud import __version__
from vcloud.constants import S1_BANDS, S2_BANDS
from vcloud.data.archive import resolve_sources
from vcloud.data.folder import FolderSource
from vcloud.data.geotiff import BadImageError, read_image
from vcloud.data.layout import RoiId, scan_roi
from vcloud.data.wind_values import centre_lonlat
from vcloud.errors import BadInputError, VcloudError

log = logging.getLogger(__name__)

ARCO_ERA5 = "https://storage.googleapis.com/gcp-public-data-arco-era5/ar/full_37-1h-0p25deg-chunk-1.zarr-v3"
U10, V10 = "10m_u_component_of_wind", "10m_v_component_of_wind"
NOON = np.timedelta64(12, "h")  # WindSource interpolates to noon UTC of each date
MARGIN_DEG = 0.5  # two 0.25-deg cells beyond the outermost location: bilinear needs neighbours


@dataclass(frozen=True)
class WindNeed:
    """Where and when one ROI needs wind: location centres (lon, lat in degrees) and dates."""

    roi: RoiId
    lonlat: np.ndarray  # (P, 2) float64, one row per location (patch)
    dates: tuple[dt.date, ...]  # sorted, distinct acquisition dates of the ROI's S2 images


def wind_needs(raws, roi: RoiId, *, times: int, size: int, index_dir: Path | None = None) -> WindNeed:
    """The places and dates of one ROI of the raw dataset that need wind.

    The only place that decides this. `raws` are the raw paths `vcloud prepare --raw` takes (a
    folder of the downloaded archives, one archive, an extracted tree, or a plain folder of your
    own; one path or a list): the ROI's files are listed and read through the same sources as
    preparation (`archive.resolve_sources` + `layout.scan_roi`), dates parsed from the S2 file
    names, and each location's centre converted to lon/lat as `vcloud prepare` does: from the
    georeferencing of its first readable image (unreadable ones are skipped here; `vcloud
    prepare` reports them), or for a plain folder from its scene's header and the patch's
    window, the patches prepare cuts (their overlap moves no outermost centre, so the box is
    the same for any). A plain folder without a CRS is named: prepare could not place it either.
    """
    raws = [Path(raws)] if isinstance(raws, (str, Path)) else [Path(r) for r in raws]
    scan = scan_roi(resolve_sources(raws, roi, index_dir=index_dir, size=size), roi, times=times)
    dates = sorted({pair["s2"].date for pair in scan.images.values() if "s2" in pair})
    centres = []
    for patch in scan.patches:
        centre = _patch_centre(scan, patch, size)
        if centre is not None:
            centres.append(centre)
    if not centres:
        raise BadInputError(
            f"ROI {roi} under {', '.join(map(str, raws))}: no image with a CRS to place it on the ERA5 grid"
        )
    return WindNeed(roi=roi, lonlat=np.array(centres, dtype=np.float64), dates=tuple(dates))


def _patch_centre(scan, patch: int, size: int) -> tuple[float, float] | None:
    if isinstance(scan.sources.get("s2"), FolderSource):
        return _folder_patch_centre(scan.sources["s2"], patch, size)
    kinds = {"s2": (len(S2_BANDS), np.uint16), "s1": (len(S1_BANDS), np.float32)}
    for (p, _t), pair in sorted(scan.images.items()):
        if p != patch:
            continue
        for kind, name in sorted(pair.items(), reverse=True):  # S2 first, then S1
            bands, dtype = kinds[kind]
            try:
                _, georef = read_image(scan.open(name), bands=bands, size=size, dtype=dtype)
            except BadImageError:
                continue
            if georef.epsg:
                return centre_lonlat(georef, size)
    return None


def _folder_patch_centre(folder: FolderSource, patch: int, size: int) -> tuple[float, float]:
    """Where prepare places a plain folder's patch (FolderSource.patch_georef: its scene's header,
    shifted to its window; a tile of the patch size is its own window)."""
    georef = folder.patch_georef(patch)
    if not georef.epsg:
        first = folder.files[("s2", folder.patches[patch][0], 0)][1]
        raise BadInputError(
            f"{first}: no georeferencing (an EPSG CRS and a transform) to place the location on the ERA5 grid; "
            "write its S2 GeoTIFFs with their CRS, or set data.wind_table: null to train without wind"
        )
    return centre_lonlat(georef, size)


# --- the source ----------------------------------------------------------------------------


def no_network_hint(source: str, out: Path) -> str:
    return (
        f"on a machine with network run the same `vcloud era5-wind ... --out {out}` and copy "
        f"{out} here, or set data.wind_table: null to train without wind"
    )


def open_source(source: str, out: Path):
    """The ERA5 store as a lazy xarray Dataset with u10/v10; one line when it cannot be read."""
    import xarray as xr

    try:
        ds = xr.open_zarr(source, consolidated=None, chunks=None)
    except Exception as err:  # aiohttp, fsspec, zarr and OS errors: all mean "not reachable"
        reason = " ".join(str(err).split())[:200] or type(err).__name__
        raise BadInputError(
            f"{source}: cannot read the ERA5 store ({type(err).__name__}: {reason}); " + no_network_hint(source, out)
        ) from None
    missing = [name for name in (U10, V10, "time", "latitude", "longitude") if name not in ds.variables]
    if missing:
        raise BadInputError(f"{source}: not an ARCO-ERA5 store, lacks {', '.join(missing)}")
    return ds[[U10, V10]]


def _centre_lon(lons: np.ndarray) -> float:
    """Mean longitude on the circle (degrees, -180..180): right for a ROI across 180 deg too."""
    rad = np.radians(lons)
    return float(np.degrees(np.arctan2(np.sin(rad).mean(), np.cos(rad).mean())))


def _box(need: WindNeed, lon: np.ndarray, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the grid longitudes and latitudes covering the ROI's locations plus a margin.

    Longitudes are matched on the circle, so a ROI near 0 or 180 deg gets both sides.
    """
    lons, lats = need.lonlat[:, 0], need.lonlat[:, 1]
    lat_idx = np.flatnonzero((lat >= lats.min() - MARGIN_DEG) & (lat <= lats.max() + MARGIN_DEG))
    centre = _centre_lon(lons)
    offset = (lon - centre + 180.0) % 360.0 - 180.0  # grid longitudes relative to the centre
    rel = (lons - centre + 180.0) % 360.0 - 180.0
    lon_idx = np.flatnonzero((offset >= rel.min() - MARGIN_DEG) & (offset <= rel.max() + MARGIN_DEG))
    return lon_idx, lat_idx


@dataclass(frozen=True)
class _Frame:
    """Where one ROI's box lies in the ERA5 grid, and its coordinates as written."""

    lat_idx: np.ndarray  # grid row of each output latitude (ascending)
    lon_idx: np.ndarray  # grid column of each output longitude (increasing in the ROI's frame)
    latitude: np.ndarray
    longitude: np.ndarray

    def cut(self, field: np.ndarray) -> np.ndarray:  # (lat, lon) global -> (y, x) box
        return field[np.ix_(self.lat_idx, self.lon_idx)]


def _frame(need: WindNeed, lon: np.ndarray, lat: np.ndarray) -> _Frame:
    lon_idx, lat_idx = _box(need, lon, lat)
    centre_lon = _centre_lon(need.lonlat[:, 0])
    # Longitudes written in a frame around the ROI (centre +- 180) so that they increase
    # across 0 or 180 deg; WindSource moves a location's longitude into the same frame.
    lon_out = (lon[lon_idx] - centre_lon + 180.0) % 360.0 - 180.0 + centre_lon
    lon_order, lat_order = np.argsort(lon_out), np.argsort(lat[lat_idx])
    return _Frame(lat_idx[lat_order], lon_idx[lon_order], lat[lat_idx][lat_order], lon_out[lon_order])


def _hours(need: WindNeed) -> np.ndarray:
    return np.array([np.datetime64(d, "ns") + NOON for d in need.dates], dtype="datetime64[ns]")


def _roi_grid(need: WindNeed, frame: _Frame, boxes: dict, source: str):
    """One ROI's xarray Dataset: u10/v10 (time, latitude ascending, longitude continuous)
    from its boxes {hour: (u (y, x), v (y, x))}."""
    import xarray as xr

    when = _hours(need)
    u = np.stack([boxes[t][0] for t in when])
    v = np.stack([boxes[t][1] for t in when])
    dims = ("time", "latitude", "longitude")
    return xr.Dataset(
        {"u10": (dims, u.astype(np.float32)), "v10": (dims, v.astype(np.float32))},
        coords={"time": when, "latitude": frame.latitude, "longitude": frame.longitude},
        attrs={
            "roi": str(need.roi),
            "source": source,
            "variables": f"{U10}, {V10}",
            "hours": "noon UTC of each acquisition date",
            "vcloud_version": __version__,
        },
    )


def fetch(source: str | None, needs: list[WindNeed], out: Path, *, workers: int = 4) -> dict:
    """Read every needed hour once from `source` (None: ARCO-ERA5), write one group per ROI
    to `out` (atomic). Each hour's global field is cut into the ROIs' boxes at once, so
    memory holds boxes, not hundreds of global fields."""
    out = Path(out)
    source = source or ARCO_ERA5
    ds = open_source(source, out)
    lon = ds["longitude"].values.astype(np.float64)
    lat = ds["latitude"].values.astype(np.float64)
    hours = sorted({t for need in needs for t in _hours(need)})
    available = ds["time"].values
    absent = [h for h in hours if h not in set(available)]
    if absent:
        raise BadInputError(
            f"{source}: no ERA5 hour {str(absent[0])[:16]} (and {len(absent) - 1} more); the store "
            f"covers {str(available[0])[:10]} to {str(available[-1])[:10]}"
        )
    frames = {need.roi.slug: _frame(need, lon, lat) for need in needs}
    users = {t: [n.roi.slug for n in needs if t in set(_hours(n))] for t in hours}

    def load(hour):
        try:
            at = ds.sel(time=hour)
            u, v = np.asarray(at[U10].values), np.asarray(at[V10].values)
        except Exception as err:  # a dropped connection mid-fetch: one line, nothing written
            reason = " ".join(str(err).split())[:200]
            raise BadInputError(
                f"{source}: reading ERA5 hour {str(hour)[:16]} failed "
                f"({type(err).__name__}: {reason}); " + no_network_hint(source, out)
            ) from None
        return hour, {slug: (frames[slug].cut(u), frames[slug].cut(v)) for slug in users[hour]}

    log.info("reading %d ERA5 hours for %d ROIs from %s", len(hours), len(needs), source)
    boxes: dict[str, dict] = {slug: {} for slug in frames}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for hour, cut in pool.map(load, hours):
            for slug, pair in cut.items():
                boxes[slug][hour] = pair
    grids = {n.roi.slug: _roi_grid(n, frames[n.roi.slug], boxes[n.roi.slug], source) for n in needs}
    _write_atomic(out, grids)
    return {"rois": len(grids), "hours": len(hours), "bytes": _folder_bytes(out)}


def _write_atomic(out: Path, grids: dict) -> None:
    """All groups into a temp folder beside `out`, then one rename: never half a store."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        for slug, grid in grids.items():
            grid.to_zarr(tmp, group=slug, mode="w", consolidated=True)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise VcloudError(f"{out}: cannot write the ERA5 wind ({err.strerror or err})") from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())

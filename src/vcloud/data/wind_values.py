"""Wind per (location, date) for the prepared store: a CSV table or a gridded ERA5 file.

- CSV with columns rois,roi,date,u,v (the synthetic tree writes one): exact ROI and date.
- ERA5 10 m wind (variables u10/v10, or u/v; dims time or valid_time, latitude, longitude),
  any file xarray opens (netCDF, or a .zarr folder): interpolated linearly with xarray to
  each location's centre (its CRS + geotransform, converted to lon/lat with pyproj) and to
  each acquisition date (noon UTC). A .zarr folder with one group per ROI slug (what
  `vcloud era5-wind` writes, see data/era5.py) gives each ROI its own small grid.
"""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

import numpy as np

from vcloud.data.layout import RoiId
from vcloud.errors import BadInputError


class WindSource:
    """Wind lookups for one ROI: `at(georef, dates (T,) datetime64, size=px) -> (u (T,), v (T,))`."""

    def __init__(self, path: Path, roi: RoiId):
        self.path = Path(path)
        if not self.path.exists():
            raise BadInputError(f"{self.path}: wind file not found")
        self.roi = roi
        if self.path.suffix.lower() == ".csv":
            self.table, self.grid = _read_table(self.path, roi), None
        else:
            self.table, self.grid = None, _open_era5(self.path, roi)

    def at(self, georef, dates: np.ndarray, *, size: int) -> tuple[np.ndarray, np.ndarray]:
        u = np.full(len(dates), np.nan, np.float32)
        v = np.full(len(dates), np.nan, np.float32)
        known = ~np.isnat(dates)
        if self.table is not None:
            for t in np.flatnonzero(known):
                if dates[t] in self.table:
                    u[t], v[t] = self.table[dates[t]]
            return u, v
        if not known.any():
            return u, v
        if not georef.epsg:
            raise BadInputError(f"{self.path}: the images of {self.roi} carry no CRS to place them on the ERA5 grid")
        lon, lat = centre_lonlat(georef, size)
        ds, time_name = self.grid
        # ERA5 grids run 0..360, ours from `vcloud era5-wind` around the ROI: same frame.
        west, east = float(ds["longitude"].min()), float(ds["longitude"].max())
        if lon < west:
            lon += 360.0
        elif lon > east:
            lon -= 360.0
        when = (dates[known].astype("datetime64[D]") + np.timedelta64(12, "h")).astype("datetime64[ns]")
        if np.isin(when, ds[time_name].values).all():
            ds = ds.sel({time_name: when})  # the hours themselves (one date is enough)
        else:
            ds = ds.interp({time_name: when}, method="linear")
        point = ds.interp({"latitude": lat, "longitude": lon}, method="linear")
        u[known] = point["u"].values.astype(np.float32)
        v[known] = point["v"].values.astype(np.float32)
        return u, v


def _read_table(path: Path, roi: RoiId) -> dict[np.datetime64, tuple[float, float]]:
    table = {}
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"rois", "roi", "date", "u", "v"} - set(reader.fieldnames or ())
        if missing:
            raise BadInputError(f"{path}: wind table lacks column(s) {', '.join(sorted(missing))}")
        for line, row in enumerate(reader, start=2):
            try:
                if row["rois"] == roi.rois and int(row["roi"]) == roi.roi:
                    date = np.datetime64(dt.date.fromisoformat(row["date"]), "ns")
                    table[date] = (float(row["u"]), float(row["v"]))
            except ValueError as err:
                raise BadInputError(f"{path}:{line}: {err}") from None
    return table


def _open_era5(path: Path, roi: RoiId):
    import xarray as xr

    group = None
    if path.is_dir() and _has_roi_groups(path):
        group = roi.slug
        if not (path / group).is_dir():
            raise BadInputError(f"{path}: no wind for {roi} (no group {group}); rerun `vcloud era5-wind` with this ROI")
    try:
        ds = xr.open_zarr(path, group=group) if path.is_dir() else xr.open_dataset(path)
    except Exception as err:  # engines raise many types for an unreadable file
        raise BadInputError(f"{path}: not a readable wind grid ({type(err).__name__}: {err})") from None
    names = {"u10": "u", "v10": "v"} if "u10" in ds else {}
    ds = ds.rename(names)
    time_name = "valid_time" if "valid_time" in ds.coords else "time"
    for need in ("u", "v", time_name, "latitude", "longitude"):
        if need not in ds.variables:
            raise BadInputError(
                f"{path}: wind grid lacks '{need}' (expected ERA5 u10/v10 on time, latitude, longitude)"
            )
    return ds[["u", "v"]].load(), time_name


def _has_roi_groups(path: Path) -> bool:
    """True for a `vcloud era5-wind` store: sub-groups named like ROIs1868_119."""
    return any(child.is_dir() and child.name.startswith("ROIs") for child in path.iterdir())


def centre_lonlat(georef, size: int) -> tuple[float, float]:
    from pyproj import Transformer

    x0, px, _, y0, _, py = georef.transform
    to_lonlat = Transformer.from_crs(georef.epsg, 4326, always_xy=True)
    lon, lat = to_lonlat.transform(x0 + size / 2 * px, y0 + size / 2 * py)
    return float(lon), float(lat)

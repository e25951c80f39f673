"""Wind for the store from an ERA5-like grid: interpolated to each location and date."""

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from vcloud.data.prepare import prepare_roi
from vcloud.data.store import open_store
from vcloud.data.wind_values import WindSource, centre_lonlat
from vcloud.errors import BadInputError

from ..conftest import TINY, TINY_ROIS


def _era5(path, lon0, lat0):
    """u10 linear in longitude, v10 linear in time (hours since 2018-01-01): exact under linear interp."""
    time = pd.date_range("2017-12-31", "2019-01-02", freq="6h")
    lat = np.arange(lat0 + 2.0, lat0 - 2.0, -0.25)  # ERA5 runs north to south
    lon = np.arange(lon0 - 2.0, lon0 + 2.0, 0.25)
    hours = ((time - pd.Timestamp("2018-01-01")) / pd.Timedelta(hours=1)).to_numpy()
    u = np.broadcast_to(lon[None, None, :] * 0.5, (len(time), len(lat), len(lon)))
    v = np.broadcast_to(hours[:, None, None] * 0.001, (len(time), len(lat), len(lon)))
    ds = xr.Dataset(
        {
            "u10": (("valid_time", "latitude", "longitude"), u.copy()),
            "v10": (("valid_time", "latitude", "longitude"), v.copy()),
        },
        coords={"valid_time": time, "latitude": lat, "longitude": lon},
    )
    ds.to_zarr(path, mode="w")
    return path


def test_era5_grid_is_interpolated_to_each_location_and_date(tiny_raw_master, tmp_path):
    from vcloud.data.geotiff import read_image

    roi = TINY_ROIS[0]
    first = next((tiny_raw_master / roi.rois / str(roi.roi) / "S2/0").glob("*_patch_0.tif"))
    _, georef = read_image(first, bands=13, size=TINY["size"], dtype=np.uint16)
    lon, lat = centre_lonlat(georef, TINY["size"])
    grid = _era5(tmp_path / "era5.zarr", lon, lat)
    out = tmp_path / "store.zarr"
    prepare_roi(raw=tiny_raw_master, roi=roi, out=out, times=TINY["times"], size=TINY["size"], wind_table=grid)
    ds = open_store(out)
    dates = ds["date_s2"].values[0]
    hours = (dates.astype("datetime64[D]") + np.timedelta64(12, "h") - np.datetime64("2018-01-01")) / np.timedelta64(
        1, "h"
    )
    np.testing.assert_allclose(ds["wind_u"].values[0], lon * 0.5, rtol=1e-5)
    np.testing.assert_allclose(ds["wind_v"].values[0], hours * 0.001, rtol=1e-5)
    assert not np.allclose(ds["wind_u"].values[0], ds["wind_u"].values[1])  # another place, another wind


def test_bad_wind_files_are_named(tmp_path):
    with pytest.raises(BadInputError, match="wind file not found"):
        WindSource(tmp_path / "none.nc", TINY_ROIS[0])
    xr.Dataset({"t2m": (("time",), [1.0])}, coords={"time": [np.datetime64("2018-01-01")]}).to_zarr(tmp_path / "x.zarr")
    with pytest.raises(BadInputError, match="x.zarr: wind grid lacks 'u'"):
        WindSource(tmp_path / "x.zarr", TINY_ROIS[0])
    (tmp_path / "w.csv").write_text("rois,roi,when,u,v\n")
    with pytest.raises(BadInputError, match="w.csv: wind table lacks column"):
        WindSource(tmp_path / "w.csv", TINY_ROIS[0])

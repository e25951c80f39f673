"""ERA5 wind for your own locations (data.source: folder): `vcloud era5-wind --location FOLDER ROI`
places each patch that `vcloud prepare` cuts from the scene's GeoTIFF header and dates it by its
file names; the prepared store then holds the wind of each patch's centre at noon of each date.

The ERA5 stand-in is a small regional grid laid out as ARCO-ERA5 (latitude descending, hourly
time, the public store's variable names) whose wind is linear in latitude, longitude and time:
bilinear interpolation gives it back exactly at any point, so the expected value is the field
itself at a centre computed here with pyproj, and a centre 80 m off changes u by ~0.03 m/s.
"""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest
import xarray as xr

from tests.unit.scene_fixtures import DATES, ORIGIN, write_scene
from vcloud.cli import main
from vcloud.data.era5 import U10, V10, wind_needs
from vcloud.data.layout import RoiId
from vcloud.data.store import open_store

SIZE = 32  # patches of 32 px; default overlap 16
OTHER_ORIGIN = (600000.0, 5100000.0)  # the second location, ~130 km north-east, one 32 px tile
# The 48 x 40 scene's patches, (row, column) of their windows, row by row: starts(48) = 0, 16;
# starts(40) = 0, 8 (the last snapped to 40 - 32).
WINDOWS = [(0, 0), (0, 8), (16, 0), (16, 8)]
NOON = [np.datetime64(dt.datetime.strptime(d, "%Y%m%d").date(), "ns") + np.timedelta64(12, "h") for d in DATES]
EPOCH = np.datetime64("2019-03-01T00", "ns")


def u_field(lat, lon, hours):
    return 40.0 * (lat - 45.0) - 30.0 * (lon - 15.0) + 0.05 * hours


def v_field(lat, lon, hours):
    return -20.0 * (lat - 45.0) + 35.0 * (lon - 15.0) - 0.03 * hours


def centre(origin, row, col):
    """lon, lat of the centre of the 32 px window at (row, col) of a 10 m UTM 33N scene at origin."""
    from pyproj import Transformer

    x, y = origin[0] + (col + SIZE / 2) * 10.0, origin[1] - (row + SIZE / 2) * 10.0
    return Transformer.from_crs(32633, 4326, always_xy=True).transform(x, y)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mine")
    write_scene(root / "alpha", 48, 40)  # cut into the 4 patches of WINDOWS
    write_scene(root / "bravo", SIZE, SIZE, origin=OTHER_ORIGIN)  # one tile, one patch
    return root


@pytest.fixture(scope="module")
def era5(tmp_path_factory):
    lat = np.arange(48.0, 42.0 - 0.125, -0.25)  # 90..-90 in ARCO: descending
    lon = np.arange(12.0, 19.0 + 0.125, 0.25)
    times = np.array(NOON + [NOON[0] - np.timedelta64(1, "h")], dtype="datetime64[ns]")  # one hour nobody needs
    hours = ((times - EPOCH) / np.timedelta64(1, "h"))[:, None, None]
    grid = np.meshgrid(lat, lon, indexing="ij")
    dims = ("time", "latitude", "longitude")
    ds = xr.Dataset(
        {
            U10: (dims, u_field(grid[0][None], grid[1][None], hours).astype(np.float32)),
            V10: (dims, v_field(grid[0][None], grid[1][None], hours).astype(np.float32)),
        },
        coords={"time": times, "latitude": lat, "longitude": lon},
    )
    path = tmp_path_factory.mktemp("arco") / "era5.zarr"
    ds.to_zarr(path, zarr_format=2, consolidated=True, mode="w")
    return path


def era5_wind(out, era5, *locations):
    argv = ["era5-wind", "--out", str(out), "--source", str(era5), "--size", str(SIZE)]
    for folder, roi in locations:
        argv += ["--location", str(folder), roi]
    return main(argv)


def test_wind_needs_of_a_folder_location_are_its_patch_centres_and_file_dates(folders):
    need = wind_needs(folders / "alpha", RoiId("ROIs9000", 1), times=len(DATES), size=SIZE)
    assert [d.strftime("%Y%m%d") for d in need.dates] == list(DATES)
    np.testing.assert_allclose(need.lonlat, [centre(ORIGIN, *w) for w in WINDOWS], atol=1e-9)


def test_prepared_folder_locations_hold_the_era5_wind_of_each_patch_centre_and_date(
    folders, era5, tmp_path, capsys, one_thread
):
    out = tmp_path / "resources/wind/era5_u10v10.zarr"
    assert era5_wind(out, era5, (folders / "alpha", "ROIs9000/1"), (folders / "bravo", "ROIs9000/2")) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["rois"] == 2 and summary["hours"] == len(DATES)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["ROIs9000_1", "ROIs9000_2"]

    expected = {"alpha": [centre(ORIGIN, *w) for w in WINDOWS], "bravo": [centre(OTHER_ORIGIN, 0, 0)]}
    hours = (np.array(NOON) - EPOCH) / np.timedelta64(1, "h")
    for number, name in enumerate(("alpha", "bravo"), start=1):
        store = tmp_path / f"{name}.zarr"
        argv = ["prepare", "--raw", str(folders / name), "--roi", f"ROIs9000/{number}", "--out", str(store)]
        assert main([*argv, "--size", str(SIZE), "--wind", str(out)]) == 0
        ds = open_store(store)
        assert list(ds["location"].values) == [f"ROIs9000_{number}_p{p}" for p in range(len(expected[name]))]
        assert (ds["date_s2"].values.astype("datetime64[D]") == np.array(NOON, "datetime64[D]")).all()
        for p, (lon, lat) in enumerate(expected[name]):
            np.testing.assert_allclose(ds["wind_u"].values[p], u_field(lat, lon, hours), atol=2e-3)
            np.testing.assert_allclose(ds["wind_v"].values[p], v_field(lat, lon, hours), atol=2e-3)
    alpha = open_store(tmp_path / "alpha.zarr")["wind_u"].values
    assert np.abs(np.diff(alpha[:, 0])).min() > 0.02  # every patch its own centre, not the scene's


def test_a_folder_location_without_georeferencing_is_named_and_nothing_is_written(era5, tmp_path, capsys):
    import tifffile

    s2 = tmp_path / "mine" / "plain" / "S2"
    s2.mkdir(parents=True)
    for date in DATES:  # a plain TIFF: pixels, no CRS, no transform
        tifffile.imwrite(s2 / f"T33_{date}.tif", np.full((13, SIZE, SIZE), 1500, np.uint16), planarconfig="separate")
    out = tmp_path / "wind" / "era5.zarr"
    assert era5_wind(out, era5, (s2.parent, "ROIs9000/1")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"vcloud era5-wind: error: {s2 / f'T33_{DATES[0]}.tif'}: no georeferencing"), err[0]
    assert not (tmp_path / "wind").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "nothing to fetch: give --raw with --roi"),
        (["--roi", "ROIs1868/119"], "--raw and --roi go together"),
        (["--location", "{tmp}", "ROIs9000/1"], "not a plain folder"),
        (["--location", "{alpha}", "ROIs9000/1", "--location", "{alpha}", "ROIs9000/1"], "ROIs9000/1: given twice"),
    ],
)
def test_era5_wind_arguments_are_refused_in_one_line(folders, tmp_path, capsys, argv, message):
    argv = [a.format(tmp=tmp_path, alpha=folders / "alpha") for a in argv]
    out = tmp_path / "era5.zarr"
    assert main(["era5-wind", "--out", str(out), "--source", str(tmp_path / "none.zarr"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()

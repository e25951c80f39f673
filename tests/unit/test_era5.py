"""ERA5 wind for the real dataset: `vcloud era5-wind` against a local store laid out as ARCO-ERA5.

No network here: the stand-in has the public store's variable names, dims and conventions
(latitude 90..-90, longitude 0..359.75 at 0.25 deg, hourly `time`, one chunk per hour).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from vcloud.cli import main
from vcloud.data.era5 import ARCO_ERA5, U10, V10, WindNeed, _frame, _roi_grid, wind_needs
from vcloud.data.layout import RoiId
from vcloud.data.prepare import prepare_roi
from vcloud.data.store import open_store
from vcloud.data.wind_values import WindSource

from ..conftest import TINY, TINY_ROIS

LAT = np.linspace(90.0, -90.0, 721)
LON = np.arange(1440) * 0.25


def u_field(lat, lon, hour):
    """Nonlinear in place and time, so interpolation is checked, not a linear identity."""
    return 8.0 * np.sin(np.radians(lat) * 7.0) + 3.0 * np.cos(np.radians(lon) * 5.0) + 0.01 * hour


def v_field(lat, lon, hour):
    return -5.0 * np.cos(np.radians(lat) * 3.0) * np.sin(np.radians(lon) * 4.0) - 0.02 * hour


def hours_of(times):
    return ((times - np.datetime64("2018-01-01T00", "ns")) / np.timedelta64(1, "h")).astype(np.float64)


def write_arco_like(path, times):
    hour = hours_of(times)[:, None, None]
    lat, lon = LAT[None, :, None], LON[None, None, :]
    dims = ("time", "latitude", "longitude")
    ds = xr.Dataset(
        {
            U10: (dims, u_field(lat, lon, hour).astype(np.float32)),
            V10: (dims, v_field(lat, lon, hour).astype(np.float32)),
            "2m_temperature": (dims, np.zeros((len(times), 721, 1440), np.float32)),
        },
        coords={"time": times, "latitude": LAT, "longitude": LON},
    )
    encoding = {name: {"chunks": (1, 721, 1440)} for name in ds.data_vars}  # one chunk per hour
    ds.to_zarr(path, zarr_format=2, consolidated=True, mode="w", encoding=encoding)
    return path


@pytest.fixture(scope="module")
def needs(tiny_raw_master):
    return [wind_needs(tiny_raw_master, roi, times=TINY["times"], size=TINY["size"]) for roi in TINY_ROIS]


@pytest.fixture(scope="module")
def arco(needs, tmp_path_factory):
    noon = sorted({np.datetime64(d, "ns") + np.timedelta64(12, "h") for n in needs for d in n.dates})
    extra = [noon[0] - np.timedelta64(1, "h")]  # an hour nobody needs: must not matter
    times = np.array(sorted(noon + extra), dtype="datetime64[ns]")
    return write_arco_like(tmp_path_factory.mktemp("arco") / "era5.zarr", times)


def run_cli(raw, out, source, rois=TINY_ROIS):
    argv = [
        "era5-wind",
        "--raw",
        str(raw),
        "--out",
        str(out),
        "--source",
        str(source),
        "--times",
        str(TINY["times"]),
        "--size",
        str(TINY["size"]),
    ]
    for roi in rois:
        argv += ["--roi", str(roi)]
    return main(argv)


def test_wind_needs_lists_every_location_and_date(tiny_raw_master, needs):
    from vcloud.data.geotiff import read_image
    from vcloud.data.wind_values import centre_lonlat

    need = needs[0]
    assert need.roi == TINY_ROIS[0] and need.lonlat.shape == (TINY["patches"], 2)
    files = sorted((tiny_raw_master / "ROIs1868/119/S2").glob("*/*_patch_1.tif"))
    assert len(need.dates) == TINY["times"]
    assert [d.isoformat() for d in need.dates] == sorted(f.name.split("_")[5] for f in files)
    _, georef = read_image(files[0], bands=13, size=TINY["size"], dtype=np.uint16)
    np.testing.assert_allclose(need.lonlat[1], centre_lonlat(georef, TINY["size"]))


def test_rule_command_then_prepare_interpolates_to_a_hand_computed_value(
    tiny_raw_master, needs, arco, tmp_path, capsys
):
    out = tmp_path / "resources/wind/era5_u10v10.zarr"
    assert run_cli(tiny_raw_master, out, arco) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["rois"] == 2 and summary["hours"] == len({d for n in needs for d in n.dates})
    assert summary["bytes"] < 200_000  # a small file: boxes around the ROIs, not the globe
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["ROIs1158_119", "ROIs1868_119"]

    store = tmp_path / "roi.zarr"
    prepare_roi(
        raw=tiny_raw_master, roi=TINY_ROIS[0], out=store, times=TINY["times"], size=TINY["size"], wind_table=out
    )
    ds = open_store(store)
    lon, lat = needs[0].lonlat[1]  # location 1 (patch 1)
    date = ds["date_s2"].values[1, 2].astype("datetime64[D]")
    hour = hours_of(np.array([date + np.timedelta64(12, "h")], dtype="datetime64[ns]"))[0]
    # Bilinear by hand on the 0.25-deg cell around the location (ARCO longitudes 0..360).
    east = lon % 360.0
    lon0, lat0 = np.floor(east / 0.25) * 0.25, np.floor(lat / 0.25) * 0.25
    wx, wy = (east - lon0) / 0.25, (lat - lat0) / 0.25
    corners = [
        (lat0, lon0, (1 - wy) * (1 - wx)),
        (lat0, lon0 + 0.25, (1 - wy) * wx),
        (lat0 + 0.25, lon0, wy * (1 - wx)),
        (lat0 + 0.25, lon0 + 0.25, wy * wx),
    ]
    u = sum(w * np.float32(u_field(a, o, hour)) for a, o, w in corners)
    v = sum(w * np.float32(v_field(a, o, hour)) for a, o, w in corners)
    assert ds["wind_u"].values[1, 2] == pytest.approx(u, abs=1e-4)
    assert ds["wind_v"].values[1, 2] == pytest.approx(v, abs=1e-4)
    assert abs(u) > 0.5  # not a trivially zero field
    assert np.isfinite(ds["wind_u"].values).all() and np.isfinite(ds["wind_v"].values).all()


def test_no_network_is_one_line_saying_what_to_do(tiny_raw_master, tmp_path, capsys):
    out = tmp_path / "era5.zarr"
    code = run_cli(tiny_raw_master, out, "http://127.0.0.1:9/era5.zarr", rois=TINY_ROIS[:1])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "http://127.0.0.1:9/era5.zarr: cannot read the ERA5 store" in err[0]
    assert "vcloud era5-wind" in err[0] and "data.wind_table: null" in err[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_missing_hour_is_named(tiny_raw_master, needs, tmp_path, capsys):
    first = np.datetime64(needs[0].dates[0], "ns") + np.timedelta64(12, "h")
    source = write_arco_like(tmp_path / "short.zarr", np.array([first], dtype="datetime64[ns]"))
    assert run_cli(tiny_raw_master, tmp_path / "out.zarr", source, rois=TINY_ROIS[:1]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no ERA5 hour" in err[0] and str(source) in err[0]
    assert not (tmp_path / "out.zarr").exists()


def test_store_without_the_roi_is_named(tiny_raw_master, arco, tmp_path):
    from vcloud.errors import BadInputError

    out = tmp_path / "era5.zarr"
    assert run_cli(tiny_raw_master, out, arco, rois=TINY_ROIS[:1]) == 0
    with pytest.raises(BadInputError, match=r"no wind for ROIs1158/119 .*rerun `vcloud era5-wind`"):
        WindSource(out, TINY_ROIS[1])


def test_box_across_the_antimeridian_keeps_longitudes_increasing():
    need = WindNeed(
        roi=RoiId("ROIs1868", 1),
        lonlat=np.array([[179.9, 10.0], [-179.95, 10.1]]),
        dates=(np.datetime64("2018-01-01", "D").astype(object),),
    )
    when = np.datetime64("2018-01-01T12", "ns")
    frame = _frame(need, LON, LAT)
    boxes = {when: (frame.cut(np.tile(LON, (721, 1))), frame.cut(np.zeros((721, 1440))))}  # u10 = ARCO lon
    grid = _roi_grid(need, frame, boxes, "test")
    lon = grid["longitude"].values
    assert (np.diff(lon) > 0).all() and lon.min() < 179.9 and lon.max() > 180.05
    assert {179.75, 180.0, 180.25} <= set(np.round(lon, 2))
    # The values travel with their longitudes: 180.25 in the frame is ARCO's 180.25.
    assert float(grid["u10"].sel(longitude=180.25, latitude=10.0).values[0]) == pytest.approx(180.25)
    assert grid["latitude"].values[0] < grid["latitude"].values[-1]  # ascending


def test_default_source_is_the_public_arco_store():
    assert ARCO_ERA5.startswith("https://storage.googleapis.com/gcp-public-data-arco-era5/ar/")
    assert ARCO_ERA5.endswith("full_37-1h-0p25deg-chunk-1.zarr-v3")

"""Preparation of one ROI: the store contract, and every kind of bad input under both policies."""

import csv
import shutil

import numpy as np
import pytest
import tifffile
import zarr

from vcloud.cli import main
from vcloud.constants import CLOUD_CLASSES, S1_CLIP_DB, STORE_FORMAT_VERSION
from vcloud.data.geotiff import GeoRef, read_image, write_image
from vcloud.data.layout import RoiId, parse_name
from vcloud.data.prepare import bad_tsv_path, prepare_roi
from vcloud.data.store import open_store

from ..conftest import TINY

ROI = RoiId("ROIs1868", 119)


def _prepare(raw, out, policy="fail", **kw):
    return prepare_roi(raw=raw, roi=ROI, out=out, on_bad_image=policy, times=TINY["times"], size=TINY["size"], **kw)


def _cli(raw, out, policy="fail"):
    return main(
        [
            "prepare",
            "--raw",
            str(raw),
            "--roi",
            str(ROI),
            "--out",
            str(out),
            "--on-bad-image",
            policy,
            "--times",
            str(TINY["times"]),
            "--size",
            str(TINY["size"]),
        ]
    )


def _s2_file(raw, patch=0, t=1):
    return next((raw / "ROIs1868/119/S2" / str(t)).glob(f"*_patch_{patch}.tif"))


def _s1_file(raw, patch=0, t=1):
    return next((raw / "ROIs1868/119/S1" / str(t)).glob(f"*_patch_{patch}.tif"))


def test_store_follows_the_contract(tiny_raw, tmp_path):
    out = tmp_path / "ROIs1868_119.zarr"
    counts = _prepare(tiny_raw, out)
    ds = open_store(out)
    n, t, s = TINY["patches"], TINY["times"], TINY["size"]
    assert dict(ds.sizes) == {"location": n, "time": t, "band_s2": 13, "band_s1": 2, "y": s, "x": s, "gt": 6}
    assert ds["s2"].dtype == np.uint16 and ds["s1"].dtype == np.float32
    assert list(ds["location"].values) == [f"ROIs1868_119_p{p}" for p in range(n)]
    assert list(ds["rois"].values) == ["ROIs1868"] * n and list(ds["roi"].values) == [119] * n
    assert list(ds["band_s2"].values)[8] == "B8A"
    # One chunk = one (location, time) image.
    group = zarr.open_group(str(out), mode="r")
    assert group["s2"].chunks == (1, 1, 13, s, s)
    assert group["s1"].chunks == (1, 1, 2, s, s)
    assert group["cloud_prob"].chunks == (1, 1, s, s)
    assert group["cloud_prob"].dtype == np.uint8  # stored compactly
    # Pixels, dates and georeferencing are those of the raw files, paired by patch id.
    s2_path, s1_path = _s2_file(tiny_raw, 1, 2), _s1_file(tiny_raw, 1, 2)
    raw_s2, georef = read_image(s2_path, bands=13, size=s, dtype=np.uint16)
    raw_s1, _ = read_image(s1_path, bands=2, size=s, dtype=np.float32)
    np.testing.assert_array_equal(ds["s2"].values[1, 2], raw_s2)
    np.testing.assert_array_equal(ds["s1"].values[1, 2], np.where(np.isnan(raw_s1), S1_CLIP_DB[0], raw_s1))
    assert str(ds["date_s2"].values[1, 2])[:10] == parse_name(s2_path.name).date.isoformat()
    assert str(ds["date_s1"].values[1, 2])[:10] == parse_name(s1_path.name).date.isoformat()
    assert ds["crs"].values[1] == georef.crs
    np.testing.assert_array_equal(ds["transform"].values[1], georef.transform)
    # Cloud products.
    prob = ds["cloud_prob"].values
    assert prob.min() >= 0 and prob.max() <= 1
    assert set(np.unique(ds["cloud_class"].values)) <= set(range(len(CLOUD_CLASSES)))
    cover = ds["cloud_cover"].values
    assert ((cover >= 0) & (cover <= 1)).all()
    assert ds["valid_s2"].values.all() and ds["valid_s1"].values.all()
    # Attributes record source, bands, normalisation, version and producer.
    assert ds.attrs["format_version"] == STORE_FORMAT_VERSION
    assert ds.attrs["normalisation"]["s1"]["clip_db"] == [-25.0, 0.0]
    assert ds.attrs["producer"]["options"]["roi"] == "ROIs1868/119"
    assert counts["locations"] == n and counts["bad_files"] == 0
    assert bad_tsv_path(out).read_text() == "path\tkind\tpatch\tt\treason\n"


def test_s1_nan_pixels_go_to_the_clip_floor_and_are_counted(tiny_raw, tmp_path):
    path = _s1_file(tiny_raw, 0, 3)
    data, georef = read_image(path, bands=2, size=TINY["size"], dtype=np.float32)
    data = np.where(np.isnan(data), -10.0, data).astype(np.float32)
    data[0, :3, :5] = np.nan
    write_image(path, data, georef)
    _prepare(tiny_raw, tmp_path / "o.zarr")
    ds = open_store(tmp_path / "o.zarr")
    assert ds["s1_nan_pixels"].values[0, 3] == 15
    assert (ds["s1"].values[0, 3, 0, :3, :5] == S1_CLIP_DB[0]).all()
    assert not np.isnan(ds["s1"].values).any()


def _truncate(raw):
    path = _s2_file(raw)
    path.write_bytes(path.read_bytes()[:200])
    return path, "not a readable TIFF"


def _not_tiff(raw):
    path = _s2_file(raw)
    path.write_text("<html>404</html>")
    return path, "not a readable TIFF"


def _band_count(raw):
    path = _s2_file(raw)
    write_image(path, np.zeros((12, TINY["size"], TINY["size"]), np.uint16), GeoRef(32632, (0, 10, 0, 0, 0, -10)))
    return path, "wrong band count"


def _size(raw):
    path = _s1_file(raw)
    write_image(path, np.zeros((2, 16, 16), np.float32), GeoRef(32632, (0, 10, 0, 0, 0, -10)))
    return path, "wrong size"


def _dtype(raw):
    path = _s2_file(raw)
    write_image(path, np.zeros((13, TINY["size"], TINY["size"]), np.float32), GeoRef(32632, (0, 10, 0, 0, 0, -10)))
    return path, "wrong dtype"


def _inf(raw):
    path = _s1_file(raw)
    data, georef = read_image(path, bands=2, size=TINY["size"], dtype=np.float32)
    data[1, 4, 4] = -np.inf
    write_image(path, data, georef)
    return path, "infinite pixels"


def _all_nan(raw):
    path = _s1_file(raw)
    write_image(
        path, np.full((2, TINY["size"], TINY["size"]), np.nan, np.float32), GeoRef(32632, (0, 10, 0, 0, 0, -10))
    )
    return path, "every pixel is NaN"


def _s1_without_s2(raw):
    _s2_file(raw).unlink()
    return raw / "ROIs1868/119/S2/1", "S2 partner missing"


def _missing_time_folder(raw):
    shutil.rmtree(raw / "ROIs1868/119/S2/2")
    return raw / "ROIs1868/119/S2/2", "missing time folder"


def _bad_name(raw):
    path = _s2_file(raw)
    target = path.with_name(path.name.replace("_patch_", "_tile_"))
    path.rename(target)
    return target, "file name does not parse"


BAD_INPUTS = [
    _truncate,
    _not_tiff,
    _band_count,
    _size,
    _dtype,
    _inf,
    _all_nan,
    _s1_without_s2,
    _missing_time_folder,
    _bad_name,
]


@pytest.mark.parametrize("damage", BAD_INPUTS, ids=lambda f: f.__name__.strip("_"))
def test_fail_policy_names_the_file_and_leaves_nothing(tiny_raw, tmp_path, capsys, damage):
    path, reason = damage(tiny_raw)
    out = tmp_path / "rois" / "ROIs1868_119.zarr"
    assert _cli(tiny_raw, out, "fail") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert str(path) in err[0] and reason in err[0]
    assert not out.exists() and not bad_tsv_path(out).exists()
    leftovers = list((tmp_path / "rois").iterdir()) if (tmp_path / "rois").exists() else []
    assert leftovers == []  # no temporary left either


@pytest.mark.parametrize("damage", BAD_INPUTS, ids=lambda f: f.__name__.strip("_"))
def test_skip_policy_marks_missing_lists_reason_and_keeps_the_good(tiny_raw, tmp_path, damage):
    path, reason = damage(tiny_raw)
    out = tmp_path / "ROIs1868_119.zarr"
    assert _cli(tiny_raw, out, "skip") == 0
    ds = open_store(out)
    with bad_tsv_path(out).open() as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    assert any(row["path"] == str(path) and reason in row["reason"] for row in rows)
    valid = ds["valid_s2"].values & ds["valid_s1"].values
    n_images = TINY["patches"] * TINY["times"]
    lost = n_images - int(valid.sum())
    if damage is _missing_time_folder:
        assert lost == TINY["patches"]  # every location misses S2 at t=2, nothing else
        assert not ds["valid_s2"].values[:, 2].any() and ds["valid_s1"].values.all()
    elif damage is _bad_name:
        assert lost == 1 and not ds["valid_s2"].values[0, 1]
    else:
        assert lost == 1  # exactly the damaged image's (location, time); everything else kept
        kind = "valid_s2" if "S2" in str(path) else "valid_s1"
        assert not ds[kind].values[0, 1]
    missing = ~ds["valid_s2"].values
    assert (ds["cloud_class"].values[missing] == -1).all()
    assert np.isnan(ds["cloud_cover"].values[missing]).all()


def test_empty_roi_fails_under_both_policies(tmp_path, capsys):
    (tmp_path / "raw/ROIs1868/119/S1/0").mkdir(parents=True)
    for policy in ("fail", "skip"):
        assert _cli(tmp_path / "raw", tmp_path / "o.zarr", policy) == 2
        assert "empty ROI" in capsys.readouterr().err
    assert not (tmp_path / "o.zarr").exists()


def test_a_failed_rerun_keeps_the_previous_complete_store(tiny_raw, tmp_path):
    out = tmp_path / "o.zarr"
    _prepare(tiny_raw, out)
    _truncate(tiny_raw)
    with pytest.raises(Exception, match="not a readable TIFF"):
        _prepare(tiny_raw, out)
    assert open_store(out).sizes["location"] == TINY["patches"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.bad.tsv", "o.zarr", "raw"]


def test_wind_table_is_stored_per_date(tiny_raw, tmp_path):
    _prepare(tiny_raw, tmp_path / "o.zarr", wind_table=tiny_raw / "wind.csv")
    ds = open_store(tmp_path / "o.zarr")
    with (tiny_raw / "wind.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["rois"] == "ROIs1868" and r["roi"] == "119"]
    by_date = {r["date"]: (float(r["u"]), float(r["v"])) for r in rows}
    date = str(ds["date_s2"].values[0, 1])[:10]
    assert ds["wind_u"].values[0, 1] == pytest.approx(by_date[date][0], abs=1e-5)
    assert ds["wind_v"].values[0, 1] == pytest.approx(by_date[date][1], abs=1e-5)


def test_tiff_written_by_another_tool_without_georef_is_accepted(tiny_raw, tmp_path):
    path = _s2_file(tiny_raw, 0, 0)
    data, _ = read_image(path, bands=13, size=TINY["size"], dtype=np.uint16)
    tifffile.imwrite(path, data, planarconfig="separate", photometric="minisblack")
    _prepare(tiny_raw, tmp_path / "o.zarr")
    assert open_store(tmp_path / "o.zarr")["valid_s2"].values[0, 0]


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_date_without_s1_is_data_kept_counted_and_named(tiny_raw, tmp_path, caplog, policy):
    """No S1 file (patch 0, t=1) and no S1 time folder (t=2): S2 kept, valid_s1 False, not a bad file."""
    _s1_file(tiny_raw, 0, 1).unlink()
    shutil.rmtree(tiny_raw / "ROIs1868/119/S1/2")
    out = tmp_path / "ROIs1868_119.zarr"
    with caplog.at_level("INFO", logger="vcloud.data.prepare"):
        counts = _prepare(tiny_raw, out, policy)
    ds = open_store(out)
    assert ds["valid_s2"].values.all()
    s1_missing = ~ds["valid_s1"].values
    assert s1_missing[0, 1] and s1_missing[:, 2].all() and s1_missing.sum() == 1 + TINY["patches"]
    assert (ds["s1"].values[s1_missing] == S1_CLIP_DB[0]).all()  # the missing-image value: 0 once normalised
    assert counts["bad_files"] == 0 and counts["dates_s2_only"] == 1 + TINY["patches"]
    assert ds.attrs["counts"]["dates_s2_only"] == 1 + TINY["patches"]
    assert bad_tsv_path(out).read_text() == "path\tkind\tpatch\tt\treason\n"
    assert "ROIs1868_119_p0: S1 missing at t=1-2: kept with S2 only" in caplog.text
    assert "ROIs1868_119_p1: S1 missing at t=2: kept with S2 only" in caplog.text


def test_a_roi_without_any_s1_is_prepared_with_s2_only(tiny_raw, tmp_path, caplog):
    shutil.rmtree(tiny_raw / "ROIs1868/119/S1")
    with caplog.at_level("INFO", logger="vcloud.data.prepare"):
        counts = _prepare(tiny_raw, tmp_path / "o.zarr")
    ds = open_store(tmp_path / "o.zarr")
    assert ds["valid_s2"].values.all() and not ds["valid_s1"].values.any()
    assert counts["dates_s2_only"] == TINY["patches"] * TINY["times"] and counts["bad_files"] == 0
    assert f"no S1 image at all: its {TINY['patches'] * TINY['times']} S2 images are kept" in caplog.text


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_short_series_is_prepared_with_the_dates_it_has(tiny_raw, tmp_path, caplog, policy):
    """Time folders 2 and 3 absent (a series of 2 dates, times 4): prepared, the absent dates missing."""
    for kind in ("S1", "S2"):
        for t in (2, 3):
            shutil.rmtree(tiny_raw / f"ROIs1868/119/{kind}/{t}")
    out = tmp_path / "o.zarr"
    with caplog.at_level("INFO", logger="vcloud.data.prepare"):
        counts = _prepare(tiny_raw, out, policy)
    ds = open_store(out)
    assert ds.sizes["time"] == TINY["times"]  # every store keeps the configured dates: splits assemble
    assert ds["valid_s2"].values[:, :2].all() and not ds["valid_s2"].values[:, 2:].any()
    assert not ds["valid_s1"].values[:, 2:].any()
    assert counts["times_absent"] == 2 and counts["locations_short"] == TINY["patches"] and counts["bad_files"] == 0
    assert ds.attrs["series"] == {"times": TINY["times"], "absent": [2, 3], "beyond": []}
    assert ds.attrs["counts"]["locations_short"] == TINY["patches"]
    assert "ROIs1868/119: a series of 2 of 4 dates: t=2-3 absent" in caplog.text
    # One location lacks a date the other has: named too.
    for kind in ("s1", "s2"):
        (_s1_file if kind == "s1" else _s2_file)(tiny_raw, 1, 1).unlink()
    with caplog.at_level("INFO", logger="vcloud.data.prepare"):
        _prepare(tiny_raw, out, policy)
    assert "ROIs1868_119_p1: no image at t=1: stored as missing" in caplog.text
    assert not open_store(out)["valid_s2"].values[1, 1]


def test_time_folders_past_times_are_named_not_silently_dropped(tiny_raw, tmp_path, caplog):
    with caplog.at_level("INFO", logger="vcloud.data.prepare"):
        counts = prepare_roi(raw=tiny_raw, roi=ROI, out=tmp_path / "o.zarr", times=2, size=TINY["size"])
    assert counts["times_beyond"] == 2
    assert "ROIs1868/119: 2 time folders past times=2 not prepared (t=2-3)" in caplog.text

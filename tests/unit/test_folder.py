"""Your own imagery: a plain folder of dated GeoTIFFs (data/folder.py) prepared and predicted.

The folder is written with rasterio (GDAL's pixel-interleaved GeoTIFFs, as a user's export would
be) from the images of the tiny synthetic raw tree: its dates renamed, one date without S1, one
S1 two days off its S2 date, and one S1 far from every S2 date."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.unit.predict_fixtures import tiny_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")

S2_DATES = ["20190301", "20190311", "20190321", "20190331"]
S1_DATES = {"20190301": "2019-03-01", "20190311": "2019-03-13", "20190331": "2019-03-31"}  # 0321: none
FAR_S1 = "2019-05-01"  # no S2 date within S1_MAX_DAYS: not read


def _write(path, data, georef):
    import rasterio
    from rasterio.transform import Affine

    path.parent.mkdir(parents=True, exist_ok=True)
    profile = {
        "driver": "GTiff",
        "dtype": data.dtype.name,
        "count": data.shape[0],
        "height": data.shape[1],
        "width": data.shape[2],
        "crs": georef.crs,
        "transform": Affine.from_gdal(*georef.transform),
    }
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)


def _images(raw, kind):
    """The tiny raw tree's images of ROIs1868/119 patch 0 for `kind`, in time order."""
    from vcloud.data.geotiff import read_image

    bands, dtype = (13, np.uint16) if kind == "s2" else (2, np.float32)
    paths = sorted(raw.glob(f"ROIs1868/119/{kind.upper()}/*/{kind}_*_patch_0.tif"), key=lambda p: int(p.parent.name))
    return [read_image(p, bands=bands, size=32, dtype=dtype) for p in paths]


@pytest.fixture
def folder(tiny_raw_master, tmp_path):
    root = tmp_path / "mine"
    s2, s1 = _images(tiny_raw_master, "s2"), _images(tiny_raw_master, "s1")
    for (data, georef), date in zip(s2, S2_DATES):
        _write(root / "S2" / f"tile_{date}.tif", data, georef)
    for i, s1_date in enumerate(S1_DATES.values()):
        _write(root / "S1" / f"S1_{s1_date}.tif", *s1[i])
    _write(root / "S1" / f"S1_{FAR_S1}.tif", *s1[3])
    (root / "S2" / "tile_20190301.tif.aux.xml").write_text("<PAMDataset/>")  # GDAL's sidecar: not an image
    return root, s2[0][1]


def test_plain_folder_is_prepared_and_predicted(folder, tmp_path):
    import rasterio

    from vcloud.cli import main
    from vcloud.data.store import open_store

    root, georef = folder
    store = tmp_path / "mine.zarr"
    # the default policy (fail): a date without S1 is data, not a problem
    args = ["prepare", "--raw", str(root), "--roi", "ROIs9000/1", "--out", str(store), "--size", "32"]
    assert main(args) == 0
    ds = open_store(store)
    assert list(ds["location"].values) == ["ROIs9000_1_p0"]
    assert ds.sizes["time"] == len(S2_DATES)  # --times from the folder
    dates = [str(d)[:10] for d in ds["date_s2"].values[0]]
    assert dates == ["2019-03-01", "2019-03-11", "2019-03-21", "2019-03-31"]
    assert ds["valid_s2"].values[0].all()
    assert ds["valid_s1"].values[0].tolist() == [True, True, False, True]
    assert str(ds["date_s1"].values[0][1])[:10] == "2019-03-13"  # the nearest S1, 2 days off
    assert ds["crs"].values[0] == georef.crs
    assert tuple(ds["transform"].values[0]) == pytest.approx(georef.transform)
    s2 = _images_of(root)
    np.testing.assert_array_equal(ds["s2"].values[0, 2], s2)

    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    out = tmp_path / "out"
    predict = [
        "predict",
        "--stage",
        "1",
        "--store",
        str(store),
        "--out",
        str(out),
        "--stage1",
        str(ckpt[1]),
        "--config",
        str(ckpt["config"]),
        "--device",
        "cpu",
        "--min-cover",
        "-1",
    ]
    assert main(predict) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["outputs"]) == [f"ROIs9000_1_p0_{d}" for d in dates]
    assert manifest["outputs"]["ROIs9000_1_p0_2019-03-21"]["s1"].startswith("missing")
    assert "2019-03-21" not in manifest["outputs"]["ROIs9000_1_p0_2019-03-31"]["input_dates"][:-1]
    with rasterio.open(out / "ROIs9000_1_p0_2019-03-21.tif") as src:
        assert src.crs.to_string() == georef.crs and src.count == 13
        assert src.transform.to_gdal() == pytest.approx(georef.transform)


def _images_of(root):
    import rasterio

    with rasterio.open(root / "S2" / "tile_20190321.tif") as src:
        return src.read()


def test_several_tiles_are_locations_and_bad_names_are_one_line(folder, tmp_path, capsys):
    import shutil

    from vcloud.cli import main
    from vcloud.data.folder import FolderSource
    from vcloud.data.layout import RoiId

    root, _ = folder
    area = tmp_path / "area"
    shutil.copytree(root, area / "a")
    shutil.copytree(root / "S2", area / "b" / "S2")  # a tile without S1, one date fewer
    (area / "b" / "S2" / "tile_20190331.tif").unlink()
    source = FolderSource(area)
    roi = RoiId("ROIs9000", 1)
    assert source.times == 4
    assert [name for name, _ in source.list_folder(roi, "s2", 3)] == ["s2_ROIs9000_1_ImgNo_3_2019-03-31_patch_0.tif"]
    assert len(source.list_folder(roi, "s2", 0)) == 2 and len(source.list_folder(roi, "s1", 0)) == 1
    assert source.list_folder(roi, "s1", 2) == []  # no S1 near 2019-03-21 in either tile
    assert source.open(_parse(source, roi)) == area / "b" / "S2" / "tile_20190311.tif"

    (root / "S2" / "tile_latest.tif").write_bytes(b"")
    out = tmp_path / "bad.zarr"
    assert main(["prepare", "--raw", str(root), "--roi", "ROIs9000/1", "--out", str(out), "--size", "32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"vcloud prepare: error: {root / 'S2' / 'tile_latest.tif'}: no date at the end of the file name "
        "(expected <anything>_YYYYMMDD.tif or <anything>_YYYY-MM-DD.tif)"
    )
    assert not out.exists()


def _parse(source, roi):
    from vcloud.data.layout import parse_name

    return parse_name(source.list_folder(roi, "s2", 1)[1][0])


@pytest.mark.parametrize(
    ("days", "paired"),
    [(0, ["2019-03-01", None, None, "2019-03-31"]), (10, ["2019-03-01", "2019-03-13", "2019-03-13", "2019-03-31"])],
)
def test_the_s1_window_is_a_setting(folder, tmp_path, days, paired):
    """--s1-max-days: 0 pairs only same-day S1 (03-13 is 2 days from 03-11); 10 gives 03-21 the
    S1 of 03-13 (8 days off, nearer than 03-31's 10). The window is recorded in the store."""
    from vcloud.cli import main
    from vcloud.data.store import open_store

    root, _ = folder
    store = tmp_path / f"w{days}.zarr"
    args = ["prepare", "--raw", str(root), "--roi", "ROIs9000/1", "--out", str(store), "--size", "32"]
    assert main([*args, "--s1-max-days", str(days)]) == 0
    ds = open_store(store)
    got = [str(d)[:10] if ok else None for d, ok in zip(ds["date_s1"].values[0], ds["valid_s1"].values[0])]
    assert got == paired
    assert ds.attrs["producer"]["options"]["s1_max_days"] == days


def test_a_negative_s1_window_is_one_line(folder, tmp_path, capsys):
    from vcloud.cli import main

    root, _ = folder
    out = tmp_path / "x.zarr"
    assert (
        main(
            [
                "prepare",
                "--raw",
                str(root),
                "--roi",
                "ROIs9000/1",
                "--out",
                str(out),
                "--size",
                "32",
                "--s1-max-days",
                "-1",
            ]
        )
        == 2
    )
    assert (
        capsys.readouterr().err.strip()
        == "vcloud prepare: error: --s1-max-days -1: expected a whole number of days, 0 or more"
    )
    assert not out.exists()

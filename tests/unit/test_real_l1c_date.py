"""Real pixels through prepare and predict (issue #35, outcome 5): one real Sentinel-2 Level-1C
date, 70 x 100 px with its real georeferencing (tests/unit/data/real_s2_l1c, source and licence
in its README). Prepared as the l1c band set with s2cloudless run on its real top-of-atmosphere
bands, refused as l2a, cut into overlapping 32 px patches and predicted with tiny untrained
models into one COG on the scene's own grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.unit.predict_fixtures import fails_in_one_line, tiny_checkpoints
from tests.unit.scene_fixtures import prepare_args

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors on a shared machine

RAW = Path(__file__).parent / "data" / "real_s2_l1c"
IMAGE = RAW / "S2" / "T33UUU_20170216.tif"
BANDS = ("B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B8A", "B9", "B10", "B11", "B12")


@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    from vcloud.cli import main

    store = tmp_path_factory.mktemp("real") / "real.zarr"
    assert main(prepare_args(RAW, store)) == 0
    return store


def test_the_kept_file_is_what_its_readme_says():
    import rasterio

    with rasterio.open(IMAGE) as src:
        assert (src.count, src.shape, src.dtypes[0], src.crs.to_epsg()) == (13, (70, 100), "uint16", 32633)
        assert src.descriptions == BANDS and src.tags()["PROCESSING_LEVEL"] == "Level-1C"
        assert (src.transform.a, src.transform.c, src.transform.f) == (10.0, 336500.0, 5816140.0)
        s2 = src.read()
    assert (s2 > 0).all()  # no band padded with zeros
    assert s2[10].max() < 100 < s2[1].min()  # B10 (cirrus, 1375 nm) dark; B2 (blue) bright: real TOA


def test_prepared_as_l1c_with_s2cloudless_on_the_real_bands(real_store):
    import rasterio
    import zarr

    from vcloud.data.shards import ShardReader

    attrs = dict(zarr.open_group(str(real_store), mode="r").attrs)
    assert tuple(attrs["s2_bands"]) == BANDS and attrs["s2_product_level"] == "L1C"
    assert attrs["cloud_mask"]["source"] == "s2cloudless"
    reader = ShardReader(real_store)
    windows = [tuple(int(v) for v in w) for w in reader.window]
    # 70 x 100 in 32 px patches overlapping by 16: rows 0, 16, 32, 38 (snapped), columns 0 .. 64, 68
    assert windows == [(r, c, 32, 32) for r in (0, 16, 32, 38) for c in (0, 16, 32, 48, 64, 68)]
    assert (reader.scene_shape == [70, 100]).all()
    with rasterio.open(IMAGE) as src:
        scene = src.read()
        assert tuple(reader.scene_transform[0]) == src.transform.to_gdal()
    for location, (r, c, h, w) in enumerate(windows):  # every stored value is the file's, unchanged
        np.testing.assert_array_equal(reader.read_raw(location, [0]).s2[0], scene[:, r : r + h, c : c + w])
    cover = zarr.open_group(str(real_store), mode="r")["cloud_cover"][:, 0]
    # s2cloudless on these real bands: cloud over the western columns, clear ground in the east
    assert cover.max() > 0.7 and cover.min() < 0.05
    assert cover[0] > 0.5 and cover[5] < 0.05  # first row: west cloudy, east clear


def test_refused_as_another_band_set_or_level(tmp_path, capsys):
    import shutil

    import rasterio

    out = tmp_path / "no_mask.zarr"  # any set but 13 bands of L1C needs a mask beside it
    fails_in_one_line(capsys, prepare_args(RAW, out, "--bands", "10m_20m"), out, "no cloud mask", "10m_20m")
    # A copy with a mask (all clear; test scaffolding, not data) reaches the file's own checks.
    raw = shutil.copytree(RAW, tmp_path / "with_mask")
    (raw / "MASK").mkdir()
    with rasterio.open(IMAGE) as src:
        profile = {**src.profile, "count": 1, "dtype": "uint8"}
    with rasterio.open(raw / "MASK" / IMAGE.name, "w", **profile) as dst:
        dst.write(np.zeros((1, 70, 100), np.uint8))
    image = str(raw / "S2" / IMAGE.name)
    for declared, expected in ((("--bands", "l2a"), "expected 12 (l2a)"), (("--bands", "10m_20m"), "expected 10")):
        out = tmp_path / f"{declared[1]}.zarr"
        args = prepare_args(raw, out, *declared, "--level", "L2A", "--boa-offset", "0")
        fails_in_one_line(capsys, args, out, image, "wrong band count: 13", expected, "--bands l1c")
    out = tmp_path / "as_l2a_level.zarr"
    args = prepare_args(raw, out, "--level", "L2A", "--boa-offset", "0")
    fails_in_one_line(capsys, args, out, image, "metadata say L1C, declared L2A")


def test_predicted_into_one_cog_on_the_real_grid(real_store, tmp_path):
    import rasterio
    from rio_cogeo.cogeo import cog_validate

    from vcloud.cli import main

    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    out = tmp_path / "out"
    args = ["predict", "--stage", "1", "--store", str(real_store), "--out", str(out), "--stage1", str(ckpt[1])]
    assert main([*args, "--config", str(ckpt["config"]), "--device", "cpu", "--dates", "2017-02-16"]) == 0
    cog_path, cloud_path = out / "ROIs9000_1_s0_2017-02-16.tif", out / "ROIs9000_1_s0_2017-02-16_cloud.tif"
    assert sorted(p.name for p in out.glob("*.tif")) == sorted([cog_path.name, cloud_path.name])
    assert cog_validate(cog_path)[0]
    with rasterio.open(cog_path) as cog, rasterio.open(IMAGE) as src:
        assert (cog.crs, cog.transform, cog.shape, cog.count) == (src.crs, src.transform, (70, 100), 13)
        assert cog.descriptions == BANDS
        predicted, observed = cog.read(), src.read()
    with rasterio.open(cloud_path) as cloud:
        mask = cloud.read(1)
    clear = mask == 0
    assert clear.any() and (~clear).any()  # the real date has both
    np.testing.assert_array_equal(predicted[:, clear], observed[:, clear])  # kept byte for byte
    assert (predicted[:, ~clear] != observed[:, ~clear]).any()  # the model's values under the cloud

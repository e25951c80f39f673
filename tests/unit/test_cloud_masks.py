"""A cloud mask you can trust (data/masks.py, data/clouds.py): SCL/ and MASK/ of a plain folder.

The folder is the tiny synthetic series written as a user's GeoTIFFs (tests/unit/test_folder.py).
Its SCL layers are constructed, not downloaded: GeoTIFFs of Sen2Cor's class codes (4 vegetation,
5 not vegetated, 6 water, 3 cloud shadows, 9 cloud high probability, 10 thin cirrus) laid out by
hand, so that cover, class and mask have values worked out here:

    date 0  land and water only                      cover 0                       clear
    date 1  a 12 x 20 block of 9, a 6 x 10 block of 3 cover 300/1024, mean p 0.9  thick
    date 2  10 (thin cirrus) everywhere               cover 1, mean p 0.5          thin
    date 3  9 everywhere                              cover 1, mean p 1            opaque
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.unit.test_folder import S2_DATES, _images, _write

pytestmark = pytest.mark.usefixtures("one_thread")

SIZE = 32
ROI = ["--roi", "ROIs9000/1", "--size", str(SIZE)]


def _scl_layers() -> list[np.ndarray]:
    ground = np.full((SIZE, SIZE), 4, np.uint8)
    ground[:, :8] = 6
    ground[20:, 10:] = 5
    clouded = ground.copy()
    clouded[4:16, 6:26] = 9
    clouded[20:26, 12:22] = 3
    return [ground, clouded, np.full_like(ground, 10), np.full_like(ground, 9)]


EXPECTED_COVER = [0.0, 300 / 1024, 1.0, 1.0]
EXPECTED_CLASS = ["clear", "thick", "thin", "opaque"]


@pytest.fixture
def series(tiny_raw_master, tmp_path):
    """A plain folder: S2 and S1 of the tiny series, and SCL/ of every S2 date; and its georef."""
    root = tmp_path / "mine"
    s2 = _images(tiny_raw_master, "s2")
    s1 = _images(tiny_raw_master, "s1")
    for (data, georef), date in zip(s2, S2_DATES):
        _write(root / "S2" / f"T32TQM_{date}.tif", data, georef)
    for (data, georef), date in zip(s1, S2_DATES):
        _write(root / "S1" / f"S1_{date}.tif", data, georef)
    for layer, date in zip(_scl_layers(), S2_DATES):
        _write(root / "SCL" / f"SCL_T32TQM_{date}.tif", layer[None], s2[0][1])
    return root, s2[0][1]


def _prepare(root, out, *extra):
    from vcloud.cli import main

    return main(["prepare", "--raw", str(root), "--out", str(out), *ROI, *extra])


def test_scl_is_the_mask_as_stored_and_s2cloudless_is_kept_beside_it(series, tmp_path, capsys):
    from vcloud.constants import CLOUD_CLASSES
    from vcloud.data.clouds import cloud_mask, cloud_probability
    from vcloud.data.store import open_store

    root, _ = series
    store = tmp_path / "scl.zarr"
    assert _prepare(root, store) == 0
    ds = open_store(store)
    assert ds.attrs["cloud_mask"]["source"] == "scl"
    assert ds.attrs["cloud_mask"]["scl_cloud_prob"] == {"0": 1.0, "1": 1.0, "3": 0.5, "8": 0.8, "9": 1.0, "10": 0.5}
    prob = ds["cloud_prob"].values[0]
    layers = _scl_layers()
    np.testing.assert_array_equal(prob[1][layers[1] == 9], 1.0)
    np.testing.assert_array_equal(prob[1][layers[1] == 3], 0.5)
    np.testing.assert_array_equal(prob[1][np.isin(layers[1], (4, 5, 6))], 0.0)
    np.testing.assert_allclose(ds["cloud_cover"].values[0], EXPECTED_COVER)
    assert [CLOUD_CLASSES[c] for c in ds["cloud_class"].values[0]] == EXPECTED_CLASS

    # s2cloudless on the same L1C bands, kept as its cover and its agreement with the SCL mask
    computed = cloud_mask(cloud_probability(ds["s2"].values[0], num_threads=1))
    ours = np.isin(np.stack(layers), (3, 9, 10))
    np.testing.assert_allclose(ds["cloud_cover_s2cloudless"].values[0], computed.mean(axis=(1, 2)), atol=1e-6)
    np.testing.assert_allclose(ds["cloud_agreement"].values[0], (ours == computed).mean(axis=(1, 2)), atol=1e-6)

    from vcloud.cli import main

    assert main(["verify", str(store)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    agree = (ours == computed).mean(axis=(1, 2))
    assert lines[1] == (
        f"{store}: cloud mask SCL against s2cloudless over 4 images: pixels agreeing {agree.mean():.3f} on average, "
        f"lowest {agree.min():.3f} (ROIs9000_1_p0 at {_iso(S2_DATES[int(np.argmin(agree))])})"
    )
    assert lines[2].startswith(f"{store}: mean cloud cover SCL {np.mean(EXPECTED_COVER):.3f}, s2cloudless ")
    assert lines[2].endswith(
        f"clear (cover < 0.05): SCL 1, s2cloudless {int((computed.mean(axis=(1, 2)) < 0.05).sum())}"
    )


def _iso(date: str) -> str:
    return f"{date[:4]}-{date[4:6]}-{date[6:]}"


def test_the_scl_table_is_a_setting(series, tmp_path):
    from vcloud.constants import CLOUD_CLASSES
    from vcloud.data.store import open_store

    root, _ = series
    store = tmp_path / "clouds_only.zarr"
    assert _prepare(root, store, "--scl", "9=1.0") == 0  # shadows and cirrus no longer count
    ds = open_store(store)
    np.testing.assert_allclose(ds["cloud_cover"].values[0], [0.0, 240 / 1024, 0.0, 1.0])
    assert [CLOUD_CLASSES[c] for c in ds["cloud_class"].values[0]] == ["clear", "thick", "clear", "opaque"]
    assert ds.attrs["cloud_mask"]["scl_cloud_prob"] == {"9": 1.0}


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_a_mask_of_your_own(series, tmp_path, dtype):
    from vcloud.data.store import open_store

    root, georef = series
    shutil.rmtree(root / "SCL")
    for t, date in enumerate(S2_DATES):
        mask = np.zeros((SIZE, SIZE), np.float32)
        mask[: 8 * t] = 1.0 if dtype == "uint8" else 0.75
        mask[8 * t : 8 * t + 4] = 0.0 if dtype == "uint8" else 0.3  # a probability below 0.4: not masked
        _write(root / "MASK" / f"m_{date}.tif", mask.astype(dtype)[None], georef)
    store = tmp_path / "mask.zarr"
    assert _prepare(root, store) == 0
    ds = open_store(store)
    assert ds.attrs["cloud_mask"]["source"] == "mask"
    np.testing.assert_allclose(ds["cloud_cover"].values[0], [0.0, 0.25, 0.5, 0.75])
    stored = ds["cloud_prob"].values[0, 2]
    np.testing.assert_allclose(stored[:16], 1.0 if dtype == "uint8" else 0.75, atol=1 / 500)  # steps of 1/250
    np.testing.assert_allclose(stored[16:20], 0.0 if dtype == "uint8" else 0.3, atol=1 / 500)


def _zero_bands(root, georef):
    from vcloud.data.geotiff import read_image

    path = root / "S2" / f"T32TQM_{S2_DATES[1]}.tif"
    data, _ = read_image(path, bands=13, size=SIZE, dtype=np.uint16)
    data[[0, 9, 10]] = 0  # B1, B9, B10: a Level-2A file padded to 13 bands
    _write(path, data, georef)
    return path, "B1, B9, B10 0 at every pixel: padding is not reflectance"


def _scl_code_12(root, georef):
    path = root / "SCL" / f"SCL_T32TQM_{S2_DATES[2]}.tif"
    layer = _scl_layers()[2]
    layer[0, :3] = [12, 13, 255]
    _write(path, layer[None], georef)
    return path, "values 12, 13, 255 are not SCL class codes (0..11)"


def _scl_uint16(root, georef):
    path = root / "SCL" / f"SCL_T32TQM_{S2_DATES[0]}.tif"
    _write(path, _scl_layers()[0].astype(np.uint16)[None], georef)
    return path, "wrong dtype: uint16, expected uint8 (SCL/ holds the scene classification"


def _scl_missing_date(root, georef):
    (root / "SCL" / f"SCL_T32TQM_{S2_DATES[3]}.tif").unlink()
    return root / "SCL", f"no image of {_iso(S2_DATES[3])} (for T32TQM_{S2_DATES[3]}.tif); every S2 date needs its mask"


def _scl_truncated(root, georef):
    path = root / "SCL" / f"SCL_T32TQM_{S2_DATES[1]}.tif"
    path.write_bytes(path.read_bytes()[:200])
    return path, "not a readable TIFF"


def _scl_other_grid(root, georef):
    from vcloud.data.geotiff import GeoRef

    path = root / "SCL" / f"SCL_T32TQM_{S2_DATES[1]}.tif"
    shifted = GeoRef(georef.epsg, (georef.transform[0] + 20.0, *georef.transform[1:]))
    _write(path, _scl_layers()[1][None], shifted)
    return path, "on another grid than its S2 image"


def _scl_and_mask(root, georef):
    shutil.copytree(root / "SCL", root / "MASK")
    return root, "both SCL/ and MASK/; keep the one the cloud mask should come from"


def _mask_value_2(root, georef):
    shutil.rmtree(root / "SCL")
    for date in S2_DATES:
        _write(root / "MASK" / f"m_{date}.tif", np.zeros((1, SIZE, SIZE), np.uint8), georef)
    path = root / "MASK" / f"m_{S2_DATES[2]}.tif"
    _write(path, np.full((1, SIZE, SIZE), 2, np.uint8), georef)
    return path, "uint8 values 2; a uint8 mask holds 0 (clear) and 1 (cloud)"


def _mask_nan(root, georef):
    _mask_value_2(root, georef)
    path = root / "MASK" / f"m_{S2_DATES[2]}.tif"
    prob = np.full((1, SIZE, SIZE), 0.2, np.float32)
    prob[0, 0, :2] = [np.nan, 1.5]
    _write(path, prob, georef)
    return path, "2 pixels outside 0..1 (a float32 mask is a probability)"


def _mask_float64(root, georef):
    _mask_value_2(root, georef)
    path = root / "MASK" / f"m_{S2_DATES[2]}.tif"
    _write(path, np.zeros((1, SIZE, SIZE), np.float64), georef)
    return path, "wrong dtype: float64, expected uint8 or float32"


BAD = [
    _zero_bands,
    _scl_code_12,
    _scl_uint16,
    _scl_missing_date,
    _scl_truncated,
    _scl_other_grid,
    _scl_and_mask,
    _mask_value_2,
    _mask_nan,
    _mask_float64,
]


@pytest.mark.parametrize("damage", BAD, ids=[f.__name__.lstrip("_") for f in BAD])
def test_a_mask_that_cannot_be_trusted_is_one_line_and_nothing_written(series, tmp_path, capsys, damage):
    root, georef = series
    if damage is _zero_bands:
        shutil.rmtree(root / "SCL")  # s2cloudless is the mask: the case that called cloudy dates clear
    path, reason = damage(root, georef)
    out = tmp_path / "bad.zarr"
    assert _prepare(root, out, "--on-bad-image", "skip") == 2  # refused under either policy
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"vcloud prepare: error: {path}: "), err
    assert reason in err
    assert not out.exists() and not out.with_name("bad.bad.tsv").exists()


def test_an_scl_table_with_unknown_codes_is_refused(series, tmp_path, capsys):
    root, _ = series
    assert _prepare(root, tmp_path / "x.zarr", "--scl", "12=1.0") == 2
    assert capsys.readouterr().err.strip() == (
        "vcloud prepare: error: data.scl_cloud_prob: 12 is not an SCL class code (0..11)"
    )
    assert _prepare(root, tmp_path / "x.zarr", "--scl", "9:1") == 2
    assert "--scl 9:1: expected CODE=PROBABILITY" in capsys.readouterr().err
    assert not (tmp_path / "x.zarr").exists()


def test_predict_uses_the_stored_mask_and_says_which(series, tmp_path):
    import rasterio

    from tests.unit.predict_fixtures import tiny_checkpoints
    from vcloud.cli import main

    root, _ = series
    store = tmp_path / "scl.zarr"
    assert _prepare(root, store) == 0
    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    out = tmp_path / "out"
    args = ["predict", "--stage", "1", "--store", str(store), "--out", str(out), "--stage1", str(ckpt[1])]
    assert main([*args, "--config", str(ckpt["config"]), "--device", "cpu", "--dates", _iso(S2_DATES[1])]) == 0
    layer = _scl_layers()[1]
    with rasterio.open(out / f"ROIs9000_1_p0_{_iso(S2_DATES[1])}_cloud.tif") as src:
        mask = src.read(1)
    np.testing.assert_array_equal(mask, np.isin(layer, (3, 9)).astype(np.uint8))  # as stored: no dilation
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["cloud_mask"] == "SCL mask that came with the data: stored probability >= 0.4, as stored"


def test_a_split_takes_one_kind_of_mask(series, tiny_store, tmp_path, capsys):
    from vcloud.cli import main

    root, _ = series
    scl = tmp_path / "scl.zarr"
    assert _prepare(root, scl) == 0
    out = tmp_path / "split.zarr"
    assert main(["assemble", "--out", str(out), str(tiny_store), str(scl)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"vcloud assemble: error: {scl}: cloud mask ") and "a split takes one kind of mask" in err
    assert not out.exists()

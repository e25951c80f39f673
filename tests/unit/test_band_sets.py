"""Band sets are data (vcloud/bands.py, data/s2files.py): a plain folder of Level-2A or 10-band
GeoTIFFs is prepared with its bands, level and offset recorded, and what does not fit is one line.

The L2A files are the tiny synthetic series re-encoded as Sen2Cor writes them from processing
baseline 04.00: B10 left out, DN = reflectance x 10000 + 1000, GDAL metadata with the band
descriptions (B01, B02, ...), PRODUCT_TYPE S2MSI2A and PROCESSING_BASELINE. Their mask is an SCL
layer constructed from Sen2Cor's codes (tests/unit/test_cloud_masks.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_cloud_masks import EXPECTED_COVER, _scl_layers
from tests.unit.test_folder import S2_DATES, _images

pytestmark = pytest.mark.usefixtures("one_thread")

SIZE = 32
L2A = ("B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B8A", "B9", "B11", "B12")
TEN = ("B2", "B3", "B4", "B5", "B6", "B7", "B8", "B8A", "B11", "B12")
L1C = ("B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B8A", "B9", "B10", "B11", "B12")


def _write(path, data, georef, *, tags=None, descriptions=None):
    import rasterio
    from rasterio.transform import Affine

    path.parent.mkdir(parents=True, exist_ok=True)
    profile = {"driver": "GTiff", "dtype": data.dtype.name, "count": data.shape[0], "height": SIZE, "width": SIZE}
    with rasterio.open(path, "w", **profile, crs=georef.crs, transform=Affine.from_gdal(*georef.transform)) as dst:
        dst.write(data)
        if tags:
            dst.update_tags(**tags)
        for i, name in enumerate(descriptions or []):
            dst.set_band_description(i + 1, name)


def _sen2cor(band: str) -> str:
    return f"B{int(band[1:-1]):02d}A" if band.endswith("A") else f"B{int(band[1:]):02d}"


@pytest.fixture
def l1c(tiny_raw_master):
    """The tiny series' L1C images (13, 32, 32) uint16 and their georef."""
    images = _images(tiny_raw_master, "s2")
    return [data for data, _ in images], images[0][1]


def _folder(root, l1c, bands, *, tags=None, offset=1000, describe=True, mask="SCL"):
    images, georef = l1c
    keep = [L1C.index(b) for b in bands]
    for data, date in zip(images, S2_DATES):
        dn = np.where(data[keep] > 0, data[keep].astype(np.int32) + offset, 0).astype(np.uint16)
        names = [_sen2cor(b) for b in bands] if describe else None
        _write(root / "S2" / f"T32TQM_{date}.tif", dn, georef, tags=tags, descriptions=names)
    for layer, date in zip(_scl_layers(), S2_DATES):
        if mask == "SCL":
            _write(root / "SCL" / f"SCL_{date}.tif", layer[None], georef)
        elif mask == "MASK":
            _write(root / "MASK" / f"m_{date}.tif", np.isin(layer, (3, 8, 9, 10)).astype(np.uint8)[None], georef)
    return root


def _prepare(root, out, *extra):
    from vcloud.cli import main

    return main(["prepare", "--raw", str(root), "--roi", "ROIs9000/1", "--out", str(out), "--size", str(SIZE), *extra])


BASELINE_05 = {"PRODUCT_TYPE": "S2MSI2A", "PROCESSING_BASELINE": "05.09"}


def test_level_2a_is_prepared_with_its_bands_and_offset(l1c, tmp_path):
    from vcloud.data.store import open_store

    root = _folder(tmp_path / "l2a", l1c, L2A, tags=BASELINE_05)
    store = tmp_path / "l2a.zarr"
    assert _prepare(root, store, "--bands", "l2a", "--level", "L2A") == 0
    ds = open_store(store)
    assert tuple(ds["band_s2"].values) == L2A and tuple(ds.attrs["s2_bands"]) == L2A
    assert ds.attrs["s2_product_level"] == "L2A"
    assert ds.attrs["producer"]["options"]["s2"]["band_set"] == "l2a"
    images, _ = l1c
    keep = [L1C.index(b) for b in L2A]
    for t in range(4):  # DN - 1000: the reflectance x 10000 of the L1C series, bit for bit
        np.testing.assert_array_equal(ds["s2"].values[0, t], images[t][keep])
    np.testing.assert_allclose(ds["cloud_cover"].values[0], EXPECTED_COVER)
    assert ds.attrs["cloud_mask"]["source"] == "scl"
    assert "cloud_agreement" not in ds  # no s2cloudless on L2A: nothing to compare


def test_ten_bands_with_a_mask_and_the_offset_flag(l1c, tmp_path):
    from vcloud.data.store import open_store

    root = _folder(tmp_path / "ten", l1c, TEN, describe=False, mask="MASK")  # no metadata at all
    store = tmp_path / "ten.zarr"
    assert _prepare(root, store, "--bands", "10m_20m", "--level", "L2A", "--boa-offset", "-1000") == 0
    ds = open_store(store)
    assert tuple(ds["band_s2"].values) == TEN
    images, _ = l1c
    np.testing.assert_array_equal(ds["s2"].values[0, 2], images[2][[L1C.index(b) for b in TEN]])


def test_an_old_baseline_has_no_offset(l1c, tmp_path):
    from vcloud.data.store import open_store

    root = _folder(tmp_path / "old", l1c, L2A, tags={"PROCESSING_BASELINE": "02.14"}, offset=0)
    assert _prepare(root, tmp_path / "old.zarr", "--bands", "l2a", "--level", "L2A") == 0
    images, _ = l1c
    np.testing.assert_array_equal(
        open_store(tmp_path / "old.zarr")["s2"].values[0, 1], images[1][[0, *range(1, 10), 11, 12]]
    )


def test_level_1c_from_baseline_04_00_has_its_radio_offset_removed(l1c, tmp_path):
    """L1C since 25 January 2022 is DN = 10000 x reflectance + 1000 (RADIO_ADD_OFFSET -1000):
    taken as it is, every pixel would read 0.1 brighter, s2cloudless and the models included."""
    from vcloud.data.store import open_store

    images, _ = l1c
    for name, tags in (
        ("offset", {"PRODUCT_TYPE": "S2MSI1C", "RADIO_ADD_OFFSET": "-1000"}),
        ("baseline", {"PRODUCT_TYPE": "S2MSI1C", "PROCESSING_BASELINE": "05.10"}),
    ):
        root = _folder(tmp_path / name, l1c, L1C, tags=tags, mask=None)
        assert _prepare(root, tmp_path / f"{name}.zarr") == 0, name
        np.testing.assert_array_equal(open_store(tmp_path / f"{name}.zarr")["s2"].values[0, 2], images[2])
    # no metadata (the dataset's files, and any before 2022): as they are
    root = _folder(tmp_path / "plain", l1c, L1C, describe=False, offset=0, mask=None)
    assert _prepare(root, tmp_path / "plain.zarr") == 0
    np.testing.assert_array_equal(open_store(tmp_path / "plain.zarr")["s2"].values[0, 2], images[2])


def _case(bands, *, flags, tags=BASELINE_05, describe=True, mask="SCL", offset=1000):
    return {"bands": bands, "flags": flags, "tags": tags, "describe": describe, "mask": mask, "offset": offset}


S2_FILE = "S2/T32TQM_20190301.tif"
BAD = {
    "ten_bands_as_l1c": (
        _case(TEN, flags=[], tags=None, describe=False),
        S2_FILE,
        "wrong band count: 10, expected 13 (l1c); 10 bands is the preset 10m_20m (B2 B3 B4 B5 B6 B7 B8 B8A B11 B12): "
        "prepare with --bands 10m_20m",
    ),
    "twenty_metre_bands_apart": (
        _case(("B2", "B3", "B4", "B8"), flags=["--bands", "l2a", "--level", "L2A"], describe=False),
        S2_FILE,
        "resample the 20 m bands to the 10 m grid and stack them with the 10 m bands into one file per date",
    ),
    "descriptions_disagree": (
        _case(L2A, flags=["--bands", "B1,B2,B3,B4,B5,B6,B7,B8,B8A,B9,B10,B11", "--level", "L2A"]),
        S2_FILE,
        "its band descriptions say B1 B2 B3 B4 B5 B6 B7 B8 B8A B9 B11 B12, the declared bands are "
        "B1 B2 B3 B4 B5 B6 B7 B8 B8A B9 B10 B11; prepare with --bands l2a",
    ),
    "l2a_declared_l1c": (
        _case(L1C, flags=[], offset=0),
        S2_FILE,
        "its metadata say L2A, declared L1C; prepare with --level L2A",
    ),
    "offset_unknown": (
        _case(L2A, flags=["--bands", "l2a", "--level", "L2A"], tags=None),
        S2_FILE,
        "Level-2A without BOA_ADD_OFFSET or PROCESSING_BASELINE in its metadata; give --boa-offset -1000",
    ),
    "offset_contradicted": (
        _case(L2A, flags=["--bands", "l2a", "--level", "L2A", "--boa-offset", "0"]),
        S2_FILE,
        "its processing baseline 05.09 gives an offset of -1000, --boa-offset says 0",
    ),
    "no_mask_for_l2a": (
        _case(L2A, flags=["--bands", "l2a", "--level", "L2A"], mask=None),
        "",
        "no cloud mask for L2A l2a: s2cloudless needs the 13 Level-1C bands; put the product's scene "
        "classification in SCL/",
    ),
}


@pytest.mark.parametrize("name", BAD)
def test_what_does_not_fit_is_one_line_naming_the_file(l1c, tmp_path, capsys, name):
    case, where, reason = BAD[name]
    root = _folder(
        tmp_path / "mine",
        l1c,
        case["bands"],
        tags=case["tags"],
        describe=case["describe"],
        mask=case["mask"],
        offset=case["offset"],
    )
    out = tmp_path / "bad.zarr"
    assert _prepare(root, out, *case["flags"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"vcloud prepare: error: {root / where}".rstrip("/")), err
    assert reason in err, err
    assert not out.exists()


def test_band_sets_and_the_dataset(tiny_raw_master, tmp_path, capsys):
    from vcloud.bands import BandSetError, resolve_bands

    assert resolve_bands("l2a") == L2A and resolve_bands("B2,B3,B4,B8") == ("B2", "B3", "B4", "B8")
    with pytest.raises(BandSetError, match=r"^bands: B13 not Sentinel-2 band names"):
        resolve_bands(["B2", "B3", "B4", "B13"])
    with pytest.raises(BandSetError, match="must name each band once, in Sentinel-2 order"):
        resolve_bands(["B3", "B2", "B4"])
    with pytest.raises(BandSetError, match="'l3a' is not a band set"):
        resolve_bands("l3a")
    raw = ["--raw", str(tiny_raw_master), "--roi", "ROIs1868/119", "--times", "4"]
    from vcloud.cli import main

    assert main(["prepare", *raw, "--out", str(tmp_path / "x.zarr"), "--size", "32", "--bands", "l2a"]) == 2
    assert "SEN12MS-CR-TS is Level-1C with the 13 bands" in capsys.readouterr().err
    assert not (tmp_path / "x.zarr").exists()


def test_a_model_refuses_a_store_of_other_bands(l1c, tmp_path, capsys):
    """train, evaluate, predict and bundle: one line naming the store and both band lists, exit 2,
    before anything is built or written."""
    from tests.unit.predict_fixtures import tiny_checkpoints
    from vcloud.cli import main

    store = tmp_path / "l2a.zarr"
    assert (
        _prepare(_folder(tmp_path / "l2a", l1c, L2A, tags=BASELINE_05), store, "--bands", "l2a", "--level", "L2A") == 0
    )
    capsys.readouterr()
    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    config, stage1 = str(ckpt["config"]), str(ckpt[1])
    out = tmp_path / "out"
    commands = {
        "train": ["--stage", "0", "--config", config, "--train", str(store), "--val", str(store), "--out", str(out)],
        "evaluate": ["--stage", "1", "--store", str(store), "--stage1", stage1, "--config", config, "--out", str(out)],
        "predict": ["--stage", "1", "--store", str(store), "--stage1", stage1, "--config", config, "--out", str(out)],
        "bundle": [
            "--stage",
            "1",
            "--stage1",
            stage1,
            "--config",
            config,
            "--train-store",
            str(store),
            "--out",
            str(out),
        ],
    }
    for command, args in commands.items():
        assert main([command, *args]) == 2, command
        err = capsys.readouterr().err.strip()
        assert err == (
            f"vcloud {command}: error: {store}: S2 bands {' '.join(L2A)} (l2a), but the model of {config} takes "
            f"{' '.join(L1C)} (l1c); prepare the store with the model's bands (vcloud prepare --bands)"
        ), err
        assert not out.exists(), command


@pytest.fixture
def l2a_store(l1c, tmp_path):
    store = tmp_path / "l2a.zarr"
    assert (
        _prepare(_folder(tmp_path / "l2a", l1c, L2A, tags=BASELINE_05), store, "--bands", "l2a", "--level", "L2A") == 0
    )
    return store


def test_samples_and_models_follow_the_band_set(l2a_store):
    """x holds the store's 12 bands + 4; the simulated cloud has the 12 bands' spectrum and, the
    store's mask being SCL's, its probability is the simulator's own (no s2cloudless on L2A)."""
    import torch

    from vcloud.data import cloudsim
    from vcloud.data.samples import CloudySamples, finish_batch
    from vcloud.models.build import build_cfdt

    plain = CloudySamples(l2a_store, dates=2, length=4, seed=0, kinds=("thick",))
    item = plain[0]
    assert item["x"].shape == (2, 12 + 4, SIZE, SIZE) and item["target"].shape == (12, SIZE, SIZE)
    slot = int(item["target_index"])
    rng, _, _ = plain._draw(0)
    opacity, shadow = cloudsim.simulate(rng, (SIZE, SIZE), "thick")
    expected = np.round(cloudsim.simulated_probability(opacity, shadow) * 250) / 250
    touched = (opacity > 0) | (shadow > 0)
    np.testing.assert_allclose(item["x"][slot, -1].numpy()[touched], expected[touched], atol=1e-6)
    np.testing.assert_array_equal(cloudsim.cloud_spectrum(L2A), np.delete(cloudsim.CLOUD_SPECTRUM, 10))

    raw = CloudySamples(l2a_store, dates=2, length=4, seed=0, kinds=("thick",), raw=True, detect="device")
    batch = finish_batch({k: v[None] for k, v in raw[0].items()})  # the device path: same values
    torch.testing.assert_close(batch["x"][0], item["x"], rtol=0, atol=1e-6)

    from dataclasses import replace

    from tests.workflow.snakemake_run import ROOT
    from vcloud.config import load_model_config

    cfg = load_model_config(ROOT / "tests/workflow/tiny_models.yaml")
    cfg = replace(
        cfg,
        data=replace(cfg.data, bands="l2a"),
        stage1=replace(cfg.stage1, model=replace(cfg.stage1.model, wind_scan=False)),
    )
    model = build_cfdt(cfg)
    draft = model(item["x"][None], item["days"][None].float(), item["target_index"][None])
    assert draft.shape == (1, 12, SIZE, SIZE)


def test_a_level_2a_model_evaluates_and_predicts_twelve_bands(l2a_store, tmp_path, capsys):
    import json

    import rasterio

    from tests.unit.predict_fixtures import predict_args, tiny_checkpoints
    from vcloud.cli import main

    ckpt = tiny_checkpoints(tmp_path / "ckpt", bands="l2a")
    report = tmp_path / "eval.json"
    args = ["--stage", "1", "--store", str(l2a_store), "--stage1", str(ckpt[1]), "--config", str(ckpt["config"])]
    assert main(["evaluate", *args, "--out", str(report)]) == 0
    assert json.loads(report.read_text())["protocols"]  # scored on the L2A store's own samples
    out = tmp_path / "pred"
    assert main(predict_args(l2a_store, out, ckpt, "--min-cover", "-1")) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["bands"] == list(L2A) and "(L2A, as the input)" in manifest["scale"]
    with rasterio.open(out / "ROIs9000_1_p0_2019-03-11.tif") as src:
        assert src.count == 12 and src.descriptions == L2A
    # The workflow's detection file of a supplied-mask store: nothing detected (the clouded targets
    # take the simulated cloud), the samples pinned; evaluating with it scores the same samples alike.
    detected = tmp_path / "f.npz"
    assert (
        main(["fixed-protocol", "--store", str(l2a_store), "--config", str(ckpt["config"]), "--out", str(detected)])
        == 0
    )
    with np.load(detected) as npz:
        assert npz["levels"].size == 0 and not npz["offsets"].any()
        assert json.loads(str(npz["meta"]))["target_probability"] == "simulated"
    again = tmp_path / "eval-with-file.json"
    assert main(["evaluate", *args, "--out", str(again), "--fixed-protocol", str(detected)]) == 0
    fixed = [json.loads(path.read_text())["protocols"]["fixed"] for path in (report, again)]
    assert fixed[0]["samples"] > 0 and fixed[0] == fixed[1]


@pytest.mark.slow  # two trainings of the tiny models, 12-18 s on a shared core: the fast tier has the pieces
def test_level_2a_trains_from_stage_0_to_stage_1(l2a_store, tmp_path):
    """Stages 0 and 1 train on an L2A store of 12 bands (its natural clouds from SCL, its simulated
    ones marked as SCL would) and their checkpoints take 12 bands."""
    from tests.unit.predict_fixtures import tiny_checkpoints
    from vcloud.cli import main
    from vcloud.weights import load_stage_weights

    config = str(tiny_checkpoints(tmp_path / "ckpt", bands="l2a")["config"])
    stores = ["--train", str(l2a_store), "--val", str(l2a_store)]
    assert main(["train", "--stage", "0", "--config", config, *stores, "--out", str(tmp_path / "s0")]) == 0
    stage0 = str(tmp_path / "s0" / "best.pt")
    assert (
        main(["train", "--stage", "1", "--config", config, *stores, "--out", str(tmp_path / "s1"), "--stage0", stage0])
        == 0
    )
    weights = load_stage_weights(tmp_path / "s1" / "best.pt", stage=1)
    stem = next(value for key, value in weights.items() if key.endswith("stem.weight"))
    assert stem.shape[1] == 12 + 4


def test_the_workflow_config_reaches_prepare():
    """data.bands / product_level / boa_offset of the workflow config become prepare's flags, and
    the parser reads back what the config said; absent keys add nothing (the default command)."""
    import shlex

    from vcloud.cli import build_parser
    from vcloud.data.s2files import prepare_flags

    assert prepare_flags({"times": 30}) == ""
    flags = prepare_flags({"bands": ["B2", "B3", "B4", "B8"], "product_level": "L2A", "boa_offset": -1000})
    args = build_parser().parse_args(
        ["prepare", "--raw", "x", "--roi", "ROIs9000/1", "--out", "y", *shlex.split(flags)]
    )
    assert (args.bands, args.level, args.boa_offset) == ("B2,B3,B4,B8", "L2A", -1000)


def test_dates_of_one_location_on_different_grids_are_refused(l1c, tmp_path, capsys):
    from vcloud.data.geotiff import GeoRef

    images, georef = l1c
    root = _folder(tmp_path / "grid", l1c, L1C, tags=None, offset=0, describe=False, mask=None)
    moved = GeoRef(georef.epsg, (georef.transform[0] + 320.0, *georef.transform[1:]))  # one tile east
    _write(root / "S2" / f"T32TQM_{S2_DATES[2]}.tif", images[2], moved)
    out = tmp_path / "grid.zarr"
    assert _prepare(root, out) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"vcloud prepare: error: {root / 'S2' / f'T32TQM_{S2_DATES[2]}.tif'}: on another grid")
    assert err.endswith("every date of a location must be on one grid") and len(err.splitlines()) == 1
    assert not out.exists()

"""vcloud fixed-protocol: the fixed protocol's detection done once, read by evaluate and the viewer."""

import json
import zipfile

import numpy as np
import pytest
import yaml

from tests.workflow.snakemake_run import ROOT
from vcloud.cli import main
from vcloud.config import load_model_config
from vcloud.data.store import CLOUD_PROB_SCALE
from vcloud.errors import BadInputError
from vcloud.evaluation.fixed_protocol import write_fixed_protocol
from vcloud.evaluation.protocols import fixed_samples


@pytest.fixture(scope="module")
def setup(tiny_store, tmp_path_factory):
    """The small model set (every tiny date may be a target) and its detection file."""
    root = tmp_path_factory.mktemp("fixed")
    models = yaml.safe_load((ROOT / "config/models/small.yaml").read_text())
    models["data"]["clear_target_max_cover"] = 1.01  # 2 locations x 4 dates x 3 kinds = 24 samples
    config = root / "small.yaml"
    config.write_text(yaml.safe_dump(models))
    out = root / "fixed_protocol.npz"
    assert (
        main(
            ["fixed-protocol", "--store", str(tiny_store), "--config", str(config), "--out", str(out), "--threads", "2"]
        )
        == 0
    )
    return config, out


def _rewrite(source, target, *, meta=None, **arrays):
    with np.load(source) as npz:
        content = {name: npz[name] for name in npz.files}
    content.update(arrays)
    if meta is not None:
        content["meta"] = np.array(json.dumps({**json.loads(str(content["meta"][()])), **meta}))
    np.savez(target, **content)
    return target


def test_file_holds_what_each_sample_detects_itself(setup, tiny_store):
    config, out = setup
    cfg = load_model_config(config)
    meta = json.loads(str(np.load(out)["meta"][()]))
    assert meta["samples"] == 24 and meta["seed"] == 2024 and meta["kinds"] == ["thin", "thick", "opaque"]
    assert meta["shape"] == [32, 32] and meta["dates"] == 4 and meta["pixels"] > 0
    own, read = fixed_samples(tiny_store, cfg), fixed_samples(tiny_store, cfg, detected=out)
    touched_some = 0
    for index in range(len(own)):
        a, b = own[index], read[index]
        assert set(a) == set(b)
        for key in a:
            assert np.array_equal(a[key].numpy(), b[key].numpy(), equal_nan=True), (index, key)
        _, touched = own.clouded_target(index)
        touched_some += bool(touched.any())
    assert touched_some == len(own)  # every sample has a cloud: the file is what the model sees


def _checkpoint(tmp_path, config):
    from vcloud.models.autoencoder import Autoencoder
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    path = tmp_path / "stage0.pt"
    model = Autoencoder(load_model_config(config).stage0.model)
    save_checkpoint(path, {**checkpoint_meta(stage=0, config_hash="t"), "model": model.state_dict()})
    return path


def test_evaluate_gives_the_same_numbers_and_never_detects_with_the_file(setup, tiny_store, tmp_path, monkeypatch):
    config, out = setup
    stage0 = _checkpoint(tmp_path, config)
    common = ["evaluate", "--stage", "0", "--stage0", str(stage0), "--store", str(tiny_store), "--config", str(config)]
    assert main([*common, "--out", str(tmp_path / "own.json")]) == 0

    def no_lightgbm(*args, **kwargs):
        raise AssertionError("s2cloudless ran although the detection file was given")

    monkeypatch.setattr("vcloud.data.clouds.cloud_probability", no_lightgbm)
    monkeypatch.setattr("vcloud.data.samples.cloud_probability", no_lightgbm)
    assert main([*common, "--out", str(tmp_path / "read.json"), "--fixed-protocol", str(out)]) == 0
    own = json.loads((tmp_path / "own.json").read_text())
    read = json.loads((tmp_path / "read.json").read_text())
    assert own["protocols"]["fixed"]["samples"] == 24
    assert own == read  # every number, every protocol
    # Without the file, the same evaluation has to detect: the patch above is what it calls.
    with pytest.raises(AssertionError, match="s2cloudless ran"):
        main([*common, "--out", str(tmp_path / "again.json")])


def test_viewer_images_are_the_same_with_the_file(setup, tiny_store, tmp_path, monkeypatch):
    from vcloud.export.viewer import export_viewer
    from vcloud.models.autoencoder import Autoencoder
    from vcloud.models.cfdt import CFDT
    from vcloud.models.refiner import Refiner
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    config, out = setup
    cfg = load_model_config(config)
    models = {
        0: Autoencoder(cfg.stage0.model),
        1: CFDT(cfg.stage1.model),
        2: Refiner(cfg.stage2.model),
        3: CFDT(cfg.stage1.model),
    }
    checkpoints = {}
    for stage, model in models.items():
        checkpoints[stage] = tmp_path / f"stage{stage}.pt"
        save_checkpoint(
            checkpoints[stage], {**checkpoint_meta(stage=stage, config_hash="t"), "model": model.state_dict()}
        )
    wind = tmp_path / "wind.npz"
    from vcloud.wind.scan_orders import write_cache

    grid = 32 // 2 ** (len(cfg.stage1.model.widths) - 1)
    write_cache(wind, grid_h=grid, grid_w=grid, sectors=cfg.stage1.model.wind_sectors)
    common = dict(store=tiny_store, checkpoints=checkpoints, config_path=config, samples=4, seed=0, wind_cache=wind)
    export_viewer(out=tmp_path / "own", **common)
    monkeypatch.setattr("vcloud.data.samples.cloud_probability", lambda *a, **k: 1 / 0)
    export_viewer(out=tmp_path / "read", fixed_protocol=out, **common)
    files = sorted(p.relative_to(tmp_path / "own") for p in (tmp_path / "own").rglob("*") if p.is_file())
    assert len(files) > 4
    for name in files:
        assert (tmp_path / "own" / name).read_bytes() == (tmp_path / "read" / name).read_bytes(), name


@pytest.mark.parametrize(
    "change, message",
    [
        ({"meta": {"seed": 7}}, "made for another seed: 7 in the file (made from "),
        ({"meta": {"samples": 30}}, "made for another sample count: 30 in the file"),
        ({"meta": {"kinds": ["thin"]}}, "made for another cloud kinds"),
        ({"meta": {"shape": [64, 64]}}, "made for another sample shape: [64, 64] in the file"),
        ({"meta": {"clear_max_cover": 0.05}}, "made for another clear-target threshold"),
        ({"meta": {"s2cloudless": {"version": "0.0"}}}, "made for another s2cloudless settings"),
        ({"levels": np.zeros(3, np.uint8)}, "checksum mismatch, the file is damaged"),
        ({"meta": {"format_version": 9}}, "format version 9, this vcloud reads 1"),
    ],
)
def test_a_file_that_does_not_match_is_refused_in_one_line(setup, tiny_store, tmp_path, capsys, change, message):
    config, out = setup
    bad = _rewrite(out, tmp_path / "bad.npz", **change)
    status = main(
        [
            "evaluate",
            "--stage",
            "0",
            "--stage0",
            str(_checkpoint(tmp_path, config)),
            "--store",
            str(tiny_store),
            "--config",
            str(config),
            "--out",
            str(tmp_path / "e.json"),
            "--fixed-protocol",
            str(bad),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert f"{bad}: " in err and message in err, err
    assert not (tmp_path / "e.json").exists()


def test_a_file_of_another_store_or_truncated_is_refused(setup, tiny_raw_master, tiny_store, tmp_path):
    from tests.conftest import TINY, TINY_ROIS
    from vcloud.data.prepare import prepare_roi

    config, out = setup
    cfg = load_model_config(config)
    other = tmp_path / "other.zarr"
    prepare_roi(raw=tiny_raw_master, roi=TINY_ROIS[1], out=other, times=TINY["times"], size=TINY["size"])
    with pytest.raises(BadInputError, match=r"made for another store \(location ids.* in the file \(made from "):
        fixed_samples(other, cfg, detected=out)
    data = out.read_bytes()
    for cut in (len(data) // 2, len(data) - 30):
        (tmp_path / "cut.npz").write_bytes(data[:cut])
        with pytest.raises(BadInputError, match=r"cut.npz: not a readable fixed-protocol detection"):
            fixed_samples(tiny_store, cfg, detected=tmp_path / "cut.npz")
    with pytest.raises(BadInputError, match="fixed-protocol detection not found"):
        fixed_samples(tiny_store, cfg, detected=tmp_path / "none.npz")
    with pytest.raises(BadInputError, match="24 samples, 30 asked for"):
        fixed_samples(tiny_store, cfg, samples=30, detected=out)


def test_a_cloud_that_touches_other_pixels_than_the_file_is_refused(setup, tiny_store, tmp_path):
    config, out = setup
    with np.load(out) as npz:
        offsets = npz["offsets"].copy()
    offsets[1] += 1  # sample 0 one pixel longer, sample 1 one shorter: still a partition
    meta = json.loads(str(np.load(out)["meta"][()]))
    bad = _rewrite(out, tmp_path / "shifted.npz", offsets=offsets)
    from vcloud.evaluation import fixed_protocol as fp

    with np.load(bad) as npz:
        arrays = {name: npz[name] for name in fp.ARRAY_KEYS}
    bad = _rewrite(bad, bad, meta={**meta, "checksum_sha256": fp._checksum(arrays)})
    dataset = fixed_samples(tiny_store, load_model_config(config), detected=bad)
    with pytest.raises(BadInputError, match=r"sample 0 has \d+ detected pixels, its cloud here touches \d+"):
        dataset[0]


def test_the_file_is_written_whole_or_not_at_all(setup, tiny_store, tmp_path, monkeypatch):
    config, out = setup
    target = tmp_path / "fp.npz"
    target.write_bytes(b"old")

    def fail_midway(*args, **kwargs):
        raise RuntimeError("LightGBM died")

    monkeypatch.setattr("vcloud.evaluation.fixed_protocol.detected_probability", fail_midway)
    with pytest.raises(RuntimeError):
        write_fixed_protocol(tiny_store, load_model_config(config), target)
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["fp.npz"]

    def fail_in_write(*args, **kwargs):
        np.savez(args[0], levels=np.zeros(5, np.uint8))  # half a file in the temporary, then a crash
        raise OSError(28, "No space left on device")

    monkeypatch.undo()
    monkeypatch.setattr("vcloud.evaluation.fixed_protocol.np.savez_compressed", fail_in_write)
    status = main(["fixed-protocol", "--store", str(tiny_store), "--config", str(config), "--out", str(target)])
    assert status == 2 and target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["fp.npz"]
    with zipfile.ZipFile(out) as archive:  # the real file: every member whole
        assert archive.testzip() is None
    assert np.load(out)["levels"].max() <= CLOUD_PROB_SCALE

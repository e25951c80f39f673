"""A command opens its prepared store once and hands the reader down (vcloud predict, evaluate,
export-viewer): before, predict opened it four times (its reader, the georeferencing, the ROI
names, the wind check) and evaluate once per protocol and sampler."""

from __future__ import annotations

import pytest

from tests.unit.predict_fixtures import predict_args, tiny_checkpoints


@pytest.fixture
def opens(monkeypatch):
    """Every path xarray opens as a zarr store, in order (open_store goes through it)."""
    import xarray

    seen, real = [], xarray.open_zarr

    def counting(path, *args, **kwargs):
        seen.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(xarray, "open_zarr", counting)
    return seen


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny stage 1-3 checkpoints: stage 3 holds a CFDT (the draft model it fine-tunes)."""
    import torch

    from vcloud.config import load_model_config
    from vcloud.models.cfdt import CFDT
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    ckpt = tiny_checkpoints(tmp_path_factory.mktemp("ckpt"))
    cfg = load_model_config(ckpt["config"])
    ckpt[3] = ckpt[1].with_name("stage3.pt")
    torch.manual_seed(1)
    save_checkpoint(
        ckpt[3], {**checkpoint_meta(stage=3, config_hash="t"), "model": CFDT(cfg.stage1.model).state_dict()}
    )
    return ckpt


def test_predict_opens_its_store_once(tiny_store, checkpoints, tmp_path, opens):
    from vcloud.cli import main

    out = tmp_path / "out"
    assert main(predict_args(tiny_store, out, checkpoints, "--dates", "2018-05-17")) == 0
    assert opens.count(str(tiny_store)) == 1, opens


def test_evaluate_opens_its_store_once(tiny_store, checkpoints, tmp_path, opens):
    from vcloud.cli import main

    args = ["evaluate", "--stage", "2", "--store", str(tiny_store), "--out", str(tmp_path / "e.json")]
    args += ["--stage1", str(checkpoints[1]), "--stage2", str(checkpoints[2]), "--config", str(checkpoints["config"])]
    assert main(args) == 0
    assert opens.count(str(tiny_store)) == 1, opens


def test_the_viewer_opens_its_store_once(tiny_store, checkpoints, tmp_path, opens):
    from vcloud.cli import main

    args = ["export-viewer", "--store", str(tiny_store), "--out", str(tmp_path / "viewer"), "--samples", "2"]
    args += ["--config", str(checkpoints["config"])]
    args += [item for n in (1, 2, 3) for item in (f"--stage{n}", str(checkpoints[n]))]
    assert main(args) == 0
    assert opens.count(str(tiny_store)) == 1, opens

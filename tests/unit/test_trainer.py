"""The shared training loop, on a tiny task: resume bit-identity, signals, guards, logs."""

import json
import math
import os
import signal

import pytest
import torch
from torch import nn

from vcloud.config import DataConfig, TrainConfig
from vcloud.data.samples import ClearImages
from vcloud.errors import ConfigError, StopRequested
from vcloud.train import checkpoint as ckpt
from vcloud.train.distributed import DistEnv
from vcloud.train.metrics import compute_all
from vcloud.train.trainer import StageTask, Trainer, TrainingDiverged, check_precision, loader_kwargs

SINGLE = DistEnv(rank=0, world_size=1, local_rank=0, master_addr="", master_port=0, source="single")
DATA = DataConfig(input_dates=2, num_workers=0, samples_per_epoch=6, val_samples=2)


def _task(store, *, hook=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(13, 8, 3, padding=1), nn.SiLU(), nn.Conv2d(8, 13, 3, padding=1))

    def loss(m, batch):
        value = nn.functional.l1_loss(m(batch["target"]) + batch["target"] * 0.0, batch["target"] * 0.5)
        return hook(value) if hook else value

    def validate(m, batch):
        return compute_all(m(batch["target"]).clamp(0, 1), batch["target"] * 0.5)

    return StageTask(
        stage=0,
        model=model,
        train_set=ClearImages(store, length=6, seed=1, crop=16, clear_max_cover=1.01),
        val_set=ClearImages(store, length=2, seed=2, clear_max_cover=1.01),
        loss=loss,
        validate=validate,
    )


def _trainer(store, out, *, epochs=3, hook=None, config_hash="h1", **train):
    cfg = TrainConfig(epochs=epochs, batch_size=2, lr=1e-2, seed=0, **train)
    return Trainer(
        _task(store, hook=hook), train_cfg=cfg, data_cfg=DATA, out_dir=out, config_hash=config_hash,
        config={"test": True}, env=SINGLE, device="cpu", progress=False,
    )  # fmt: skip


def _weights(path):
    return ckpt.load_checkpoint(path)["model"]


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def reference(tiny_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    _trainer(tiny_store, out).fit()
    return out


def test_uninterrupted_run_writes_checkpoints_and_metrics(reference):
    latest = ckpt.load_checkpoint(reference / "latest.pt")
    assert latest["finished"] and latest["epoch"] == 3 and latest["stage"] == 0
    best = ckpt.load_checkpoint(reference / "best.pt")
    assert best["best_metric"] == "psnr" and math.isfinite(best["best_value"])
    lines = [json.loads(line) for line in (reference / "metrics.jsonl").read_text().splitlines()]
    assert [line["epoch"] for line in lines] == [0, 1, 2]
    for key in ("loss", "val_psnr", "val_ssim", "val_sam", "samples_per_s", "peak_memory_mb", "epoch_s"):
        assert all(math.isfinite(line[key]) for line in lines), key
    assert lines[-1]["loss"] < lines[0]["loss"]  # it learns


@pytest.mark.parametrize("stop_at", [1, 3, 7])  # mid-epoch, end of epoch 0 boundary, epoch 2
def test_killed_and_resumed_run_is_bit_identical(tiny_store, reference, tmp_path, stop_at):
    calls = {"n": 0}

    def signal_once(value):
        calls["n"] += 1
        if calls["n"] == stop_at:
            os.kill(os.getpid(), signal.SIGUSR1)  # as SLURM does before the time limit
        return value

    with pytest.raises(StopRequested, match="SIGUSR1"):
        _trainer(tiny_store, tmp_path, hook=signal_once).fit()
    state = ckpt.load_checkpoint(tmp_path / "latest.pt")
    assert not state["finished"]
    _trainer(tiny_store, tmp_path).fit()  # a new process would build everything again
    _assert_same(_weights(tmp_path / "latest.pt"), _weights(reference / "latest.pt"))
    ref_opt = ckpt.load_checkpoint(reference / "latest.pt")["optimizer"]["state"]
    new_opt = ckpt.load_checkpoint(tmp_path / "latest.pt")["optimizer"]["state"]
    for key in ref_opt:
        assert torch.equal(ref_opt[key]["exp_avg"], new_opt[key]["exp_avg"])


def test_crash_during_checkpoint_write_resumes_from_the_previous_one(tiny_store, reference, tmp_path, monkeypatch):
    real_save = torch.save
    writes = {"n": 0}

    def dying_save(obj, f, *args, **kwargs):
        writes["n"] += 1
        if writes["n"] == 3:  # epoch 1's latest.pt (epoch 0 wrote latest + best)
            f.write(b"half a checkpoint")
            raise KeyboardInterrupt("killed while writing")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        _trainer(tiny_store, tmp_path).fit()
    monkeypatch.setattr(torch, "save", real_save)
    assert ckpt.load_checkpoint(tmp_path / "latest.pt")["epoch"] == 1  # the complete one survived
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "latest.pt", "metrics.jsonl", "tensorboard"]
    _trainer(tiny_store, tmp_path).fit()
    _assert_same(_weights(tmp_path / "latest.pt"), _weights(reference / "latest.pt"))


def test_finished_stage_does_nothing_unless_best_was_deleted(tiny_store, reference, tmp_path):
    import shutil

    shutil.copytree(reference, tmp_path / "run")
    before = (tmp_path / "run/latest.pt").stat().st_mtime_ns
    _trainer(tiny_store, tmp_path / "run").fit()
    assert (tmp_path / "run/latest.pt").stat().st_mtime_ns == before
    (tmp_path / "run/best.pt").unlink()  # what `snakemake -R train_stage0` does
    _trainer(tiny_store, tmp_path / "run", epochs=1).fit()
    assert ckpt.load_checkpoint(tmp_path / "run/latest.pt")["epoch"] == 1  # trained again from 0
    assert len((tmp_path / "run/metrics.jsonl").read_text().splitlines()) == 1


def test_changed_hyperparameters_start_fresh(tiny_store, tmp_path):
    calls = {"n": 0}

    def stop_early(value):
        calls["n"] += 1
        if calls["n"] == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return value

    with pytest.raises(StopRequested, match="SIGTERM"):
        _trainer(tiny_store, tmp_path, hook=stop_early).fit()
    _trainer(tiny_store, tmp_path, epochs=1, config_hash="other").fit()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [0]


def test_nan_loss_stops_with_stage_epoch_step_and_keeps_the_last_checkpoint(tiny_store, tmp_path):
    calls = {"n": 0}

    def poison(value):
        calls["n"] += 1
        return value * float("nan") if calls["n"] == 5 else value

    with pytest.raises(TrainingDiverged, match=r"stage 0, epoch 1, step 1: loss is nan"):
        _trainer(tiny_store, tmp_path, hook=poison).fit()
    assert ckpt.load_checkpoint(tmp_path / "latest.pt")["epoch"] == 1


def test_grad_scaler_with_bf16_is_refused():
    with pytest.raises(ConfigError, match="bf16 and grad_scaler are both true"):
        check_precision(TrainConfig(epochs=1, batch_size=1, lr=1.0, bf16=True, grad_scaler=True), 1)
    check_precision(TrainConfig(epochs=1, batch_size=1, lr=1.0, bf16=True), 1)


def test_bf16_autocast_trains_on_cpu(tiny_store, tmp_path):
    _trainer(tiny_store, tmp_path, epochs=1, bf16=True).fit()
    assert ckpt.load_checkpoint(tmp_path / "latest.pt")["finished"]


def test_multiprocessing_loader_options_only_with_workers(tiny_store):
    from torch.utils.data import DataLoader

    plain = loader_kwargs(DataConfig(input_dates=2, num_workers=0, prefetch_factor=4), batch_size=2)
    assert "prefetch_factor" not in plain and "persistent_workers" not in plain
    DataLoader(ClearImages(tiny_store, clear_max_cover=1.01), **plain)  # torch would raise otherwise
    workers = loader_kwargs(DataConfig(input_dates=2, num_workers=2, prefetch_factor=4), batch_size=2)
    assert workers["prefetch_factor"] == 4 and workers["multiprocessing_context"] == "spawn"
    batches = list(DataLoader(ClearImages(tiny_store, length=4, clear_max_cover=1.01), **workers))
    assert sum(len(b["target"]) for b in batches) == 4  # workers open the store themselves

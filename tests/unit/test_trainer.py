"""The shared training loop, on a tiny task: resume bit-identity, signals, guards, logs."""

import json
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from torch import nn

from vcloud.config import DataConfig, TrainConfig
from vcloud.data.samples import ClearImages
from vcloud.errors import ConfigError, StopRequested
from vcloud.evaluation.metrics import compute_all
from vcloud.train import checkpoint as ckpt
from vcloud.train.distributed import DistEnv
from vcloud.train.trainer import StageTask, Trainer, TrainingDiverged, loader_kwargs

ROOT = Path(__file__).parents[2]
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


def _trainer(store, out, *, epochs=3, hook=None, config_hash="h1", fresh=False, **train):
    cfg = TrainConfig(**{"epochs": epochs, "batch_size": 2, "lr": 1e-2, "seed": 0, **train})
    return Trainer(
        _task(store, hook=hook),
        train_cfg=cfg,
        data_cfg=DATA,
        out_dir=out,
        config_hash=config_hash,
        config={"test": True},
        env=SINGLE,
        device="cpu",
        progress=False,
        fresh=fresh,
    )


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


def test_logged_lr_follows_the_warmup_cosine_schedule(reference):
    from vcloud.train.optim import warmup_cosine

    factor = warmup_cosine(3 * 3)  # 6 samples / batch 2 = 3 steps per epoch, 3 epochs
    assert [row["lr"] for row in _rows(reference)] == pytest.approx([1e-2 * factor(3 * (e + 1)) for e in range(3)])


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


def test_finished_stage_is_never_trained_again_unless_asked_with_fresh(tiny_store, reference, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(reference, run)
    before = (run / "latest.pt").stat().st_mtime_ns
    _trainer(tiny_store, run).fit()
    assert (run / "latest.pt").stat().st_mtime_ns == before
    (run / "best.pt").unlink()  # what snakemake does to an incomplete job's outputs (and -R)
    (run / "metrics.jsonl").unlink()
    _trainer(tiny_store, run, hook=lambda value: pytest.fail("trained a finished stage")).fit()
    assert (run / "latest.pt").stat().st_mtime_ns == before
    _assert_same(_weights(run / "best.pt"), _weights(reference / "best.pt"))
    assert (run / "metrics.jsonl").read_text() == (reference / "metrics.jsonl").read_text()

    _trainer(tiny_store, run, epochs=1, fresh=True).fit()  # the one way to train it again
    assert ckpt.load_checkpoint(run / "latest.pt")["epoch"] == 1  # trained again from 0
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1
    kept = run / "latest.h1.pt"  # the finished run, set aside under its identity's prefix
    assert ckpt.load_checkpoint(kept)["finished"]
    _assert_same(_weights(kept), _weights(reference / "latest.pt"))


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
    kept = ckpt.load_checkpoint(tmp_path / "latest.h1.pt")  # the interrupted run, set aside
    assert (kept["resume_key"], kept["finished"]) == ("h1", False)
    assert ckpt.load_checkpoint(tmp_path / "latest.pt")["resume_key"] == "other"


def test_nan_loss_stops_with_stage_epoch_step_and_keeps_the_last_checkpoint(tiny_store, tmp_path):
    calls = {"n": 0}

    def poison(value):
        calls["n"] += 1
        return value * float("nan") if calls["n"] == 5 else value

    with pytest.raises(TrainingDiverged, match=r"stage 0, epoch 1, step 1: loss is nan"):
        _trainer(tiny_store, tmp_path, hook=poison).fit()
    assert ckpt.load_checkpoint(tmp_path / "latest.pt")["epoch"] == 1


def test_grad_scaler_is_no_longer_a_key(tmp_path):
    """bf16 needs no GradScaler and fp16 is not supported: the key is refused as unknown."""
    import yaml

    from vcloud.config import load_model_config

    models = yaml.safe_load((ROOT / "config/models/small.yaml").read_text())
    models["stage0"]["train"]["grad_scaler"] = False  # even off
    bad = tmp_path / "small.yaml"
    bad.write_text(yaml.safe_dump(models))
    with pytest.raises(ConfigError, match=r"unknown key stage0\.train\.grad_scaler"):
        load_model_config(bad)


def _conv_dtypes(trainer):
    seen = []
    trainer.model[0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    return seen


def test_bf16_autocast_trains_on_cpu_in_bf16_with_fp32_weights(tiny_store, tmp_path):
    bf16 = _trainer(tiny_store, tmp_path / "bf16", epochs=1, bf16=True)
    seen = _conv_dtypes(bf16)
    bf16.fit()
    assert seen and set(seen) == {torch.bfloat16}  # the forward ran under autocast
    fp32 = _trainer(tiny_store, tmp_path / "fp32", epochs=1)
    seen32 = _conv_dtypes(fp32)
    fp32.fit()
    assert set(seen32) == {torch.float32}
    a, b = _weights(tmp_path / "bf16" / "latest.pt"), _weights(tmp_path / "fp32" / "latest.pt")
    assert all(v.dtype == torch.float32 for v in a.values())  # master weights stay fp32
    torch.manual_seed(0)
    initial = _task(tiny_store).model.state_dict()
    assert not torch.equal(a["0.weight"], initial["0.weight"])  # bf16 steps changed the weights
    assert not torch.equal(a["0.weight"], b["0.weight"])  # and not as fp32 steps do
    torch.testing.assert_close(a["0.weight"], b["0.weight"], atol=2e-2, rtol=0)  # yet close


def test_multiprocessing_loader_options_only_with_workers(tiny_store):
    from torch.utils.data import DataLoader

    plain = loader_kwargs(DataConfig(input_dates=2, num_workers=0, prefetch_factor=4), batch_size=2)
    assert "prefetch_factor" not in plain and "persistent_workers" not in plain
    DataLoader(ClearImages(tiny_store, clear_max_cover=1.01), **plain)  # torch would raise otherwise
    workers = loader_kwargs(DataConfig(input_dates=2, num_workers=2, prefetch_factor=4), batch_size=2)
    assert workers["prefetch_factor"] == 4 and workers["multiprocessing_context"] == "spawn"
    batches = list(DataLoader(ClearImages(tiny_store, length=4, clear_max_cover=1.01), **workers))
    assert sum(len(b["target"]) for b in batches) == 4  # workers open the store themselves


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _stop_at(step, signum=signal.SIGUSR1):
    calls = {"n": 0}

    def hook(value):
        calls["n"] += 1
        if calls["n"] == step:
            os.kill(os.getpid(), signum)
        return value

    return hook


def test_interrupted_epoch_logs_the_loss_of_all_its_steps(tiny_store, reference, tmp_path):
    with pytest.raises(StopRequested, match="SIGTERM"):
        _trainer(tiny_store, tmp_path, hook=_stop_at(5, signal.SIGTERM)).fit()  # epoch 1, step 2 of 3
    assert [row["epoch"] for row in _rows(tmp_path)] == [0]
    _trainer(tiny_store, tmp_path).fit()
    rows, ref = _rows(tmp_path), _rows(reference)
    assert [row["loss"] for row in rows] == [row["loss"] for row in ref]  # exactly, not post-resume only
    assert [row["val_psnr"] for row in rows] == [row["val_psnr"] for row in ref]


def _best_at_epoch_1(trainer):
    """Validation scores per epoch 1, 3, 2, 1: the best weights are those of epoch 1 of 4."""
    real = trainer.task.validate

    def validate(model, batch):
        metrics = real(model, batch)
        metrics["psnr"] = torch.full_like(metrics["psnr"], (1.0, 3.0, 2.0, 1.0)[trainer.epoch])
        return metrics

    trainer.task.validate = validate
    return trainer


def test_best_pt_deleted_by_snakemake_after_an_interruption_is_recreated(tiny_store, tmp_path):
    """The field case: best at an early epoch, killed late, snakemake removes the incomplete best.pt."""
    reference = tmp_path / "reference"
    _best_at_epoch_1(_trainer(tiny_store, reference, epochs=4)).fit()
    ref_best = ckpt.load_checkpoint(reference / "best.pt")
    assert ref_best["epoch"] == 2 and ref_best["best_value"] == 3.0
    out = tmp_path / "run"
    with pytest.raises(StopRequested):
        _best_at_epoch_1(_trainer(tiny_store, out, epochs=4, hook=_stop_at(11))).fit()  # epoch 3 of 4
    (out / "best.pt").unlink()  # what snakemake does to an incomplete job's output
    _best_at_epoch_1(_trainer(tiny_store, out, epochs=4)).fit()
    best = ckpt.load_checkpoint(out / "best.pt")
    assert best["epoch"] == ref_best["epoch"] and best["best_value"] == ref_best["best_value"]
    _assert_same(best["model"], ref_best["model"])
    assert ckpt.load_checkpoint(out / "latest.pt")["finished"]
    # Finished: a deleted best.pt (snakemake -R, or its output handling killed) is re-created, not retrained.
    (out / "best.pt").unlink()
    _best_at_epoch_1(_trainer(tiny_store, out, epochs=4, hook=lambda value: pytest.fail("retrained"))).fit()
    _assert_same(ckpt.load_checkpoint(out / "best.pt")["model"], ref_best["model"])
    assert ckpt.load_checkpoint(out / "latest.pt")["epoch"] == 4


def test_finished_stage_repairs_its_metrics_and_best_without_training(tiny_store, reference, tmp_path):
    import shutil

    shutil.copytree(reference, tmp_path / "run")
    lines = (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    (tmp_path / "run/metrics.jsonl").write_text("\n".join(lines[:1]) + "\n")  # killed before the rewrite
    before = (tmp_path / "run/latest.pt").stat().st_mtime_ns
    _trainer(tiny_store, tmp_path / "run").fit()
    assert (tmp_path / "run/latest.pt").stat().st_mtime_ns == before  # no training
    assert (tmp_path / "run/metrics.jsonl").read_text().splitlines() == lines


def test_second_run_on_the_same_folder_is_refused(tiny_store, tmp_path):
    from vcloud.train.lock import LockHeld, OutputLock

    with OutputLock(tmp_path):
        with pytest.raises(LockHeld, match=f"{tmp_path}: another training run holds this folder"):
            _trainer(tiny_store, tmp_path, epochs=1).fit()
    assert not (tmp_path / "latest.pt").exists()


def test_leftover_temp_files_of_killed_writes_are_removed(tiny_store, tmp_path):
    tmp_path.mkdir(exist_ok=True)
    leftovers = [tmp_path / ".latest.pt.tmp-999999", tmp_path / ".metrics.jsonl.tmp-12"]
    for path in leftovers:
        path.write_bytes(b"half")
    (tmp_path / "notes.tmp-1").write_text("not ours")  # no leading dot: not a temp file of ours
    _trainer(tiny_store, tmp_path, epochs=1).fit()
    assert not any(path.exists() for path in leftovers)
    assert (tmp_path / "notes.tmp-1").exists()


def test_another_stages_checkpoint_is_refused_not_overwritten(tiny_store, tmp_path):
    from vcloud.errors import BadInputError

    other = {**ckpt.checkpoint_meta(stage=1, config_hash="h1"), "finished": False, "model": {}}
    ckpt.save_checkpoint(tmp_path / "latest.pt", other)
    before = (tmp_path / "latest.pt").read_bytes()
    with pytest.raises(BadInputError, match=r"latest.pt: holds a stage 1 checkpoint, but this run trains stage 0"):
        _trainer(tiny_store, tmp_path, epochs=1).fit()
    assert (tmp_path / "latest.pt").read_bytes() == before
    assert not (tmp_path / ".train.lock").exists()


def test_nan_before_any_checkpoint_names_none(tiny_store, tmp_path):
    with pytest.raises(TrainingDiverged, match="step 0: loss is nan; stopped, no checkpoint was written yet$"):
        _trainer(tiny_store, tmp_path, hook=lambda value: value * float("nan")).fit()


def _scalars(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def test_tensorboard_has_each_epoch_once_after_a_resume(tiny_store, reference, tmp_path):
    with pytest.raises(StopRequested):
        _trainer(tiny_store, tmp_path, hook=_stop_at(7)).fit()
    _trainer(tiny_store, tmp_path).fit()
    expected = [(row["epoch"], pytest.approx(row["loss"])) for row in _rows(reference)]
    assert _scalars(tmp_path / "tensorboard", "train/loss") == expected
    assert [step for step, _ in _scalars(tmp_path / "tensorboard", "val/psnr")] == [0, 1, 2]


def test_tensorboard_off_with_one_key(tiny_store, tmp_path):
    _trainer(tiny_store, tmp_path, epochs=1, tensorboard=False).fit()
    assert not (tmp_path / "tensorboard").exists()
    assert len(_rows(tmp_path)) == 1


def test_partial_epoch_sums_survive_a_change_of_world_size():
    import types

    partial = {"world_size": 2, "per_rank": [[1.5, 3.0, 6.0, 0.1, 2.0], [2.5, 3.0, 6.0, 0.2, 3.0]]}

    def restore(rank, world):
        env = DistEnv(rank=rank, world_size=world, local_rank=rank, master_addr="", master_port=0, source="single")
        fake = types.SimpleNamespace(env=env, partial=dict(partial), step_in_epoch=3)
        return Trainer._restore_partial(fake)

    assert restore(1, 2) == (2.5, 3, 6, 0.2, 3.0)  # same world: each rank its own sums
    assert restore(0, 1) == (4.0, 6, 12, pytest.approx(0.3), 3.0)  # fewer ranks: rank 0 carries all
    assert restore(1, 4) == (0.0, 0, 0, 0.0, 0.0)


def test_cpu_steps_leave_the_workers_their_cores_and_validation_takes_them_all(tiny_store, tmp_path):
    """step_threads holds in the training loop only: validation (and whatever runs outside the
    loop) gets every core of the job back, and the process's setting is restored after."""
    seen = {"step": set(), "validate": set()}

    def hook(value):
        seen["step"].add(torch.get_num_threads())
        return value

    trainer = _trainer(tiny_store, tmp_path / "out", epochs=2, hook=hook)
    trainer.step_threads = 1
    validate = trainer.task.validate

    def counting(model, batch):
        seen["validate"].add(torch.get_num_threads())
        return validate(model, batch)

    trainer.task.validate = counting
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        trainer.fit()
        assert seen == {"step": {1}, "validate": {2}}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)

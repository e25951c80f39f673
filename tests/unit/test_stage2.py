"""Stage 2: the pixel-space refiner's guard (never ships worse than the draft), its seeded
sampler, its residual scale, and the trainer's initial validation that the guard rests on."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from vcloud.config import DataConfig, TrainConfig, load_model_config
from vcloud.constants import CLOUD_CHANNEL
from vcloud.data.samples import ClearImages, CloudySamples, finish_batch
from vcloud.errors import StopRequested
from vcloud.evaluation.metrics import compute_all
from vcloud.models.cfdt import CFDT
from vcloud.train import checkpoint as ckpt
from vcloud.train.distributed import DistEnv
from vcloud.train.stages import build_pipeline, cfdt_draft, fit_refiner_statistics, stage2
from vcloud.train.trainer import StageTask, Trainer

ROOT = Path(__file__).parents[2]
SINGLE = DistEnv(rank=0, world_size=1, local_rank=0, master_addr="", master_port=0, source="single")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tiny_store, tmp_path_factory):
    """(model config, stage-1 checkpoint): the tiny model set and an untrained stage-1 CFDT."""
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    root = tmp_path_factory.mktemp("stage2")
    models = yaml.safe_load((ROOT / "tests/workflow/tiny_models.yaml").read_text())
    models["data"]["clear_target_max_cover"] = 1.01  # every date of the tiny store may be a target
    models["stage1"]["model"]["wind_scan"] = False
    models["stage2"]["train"].update(epochs=2, batch_size=2, lr=3e-2)
    (root / "models.yaml").write_text(yaml.safe_dump(models))
    cfg = load_model_config(root / "models.yaml")
    torch.manual_seed(0)
    stage1 = root / "stage1.pt"
    save_checkpoint(stage1, {**checkpoint_meta(stage=1, config_hash="t"), "model": CFDT(cfg.stage1.model).state_dict()})
    return cfg, stage1


def _val_batch(cfg, store) -> dict:
    # random context: residuals well above the loss floor (LOSS_FLOOR), which the tests below assume
    samples = CloudySamples(
        store, dates=cfg.data.input_dates, length=2, seed=5, clear_max_cover=1.01, kinds=("thick",), policy="random"
    )
    return finish_batch({k: torch.stack([samples[i][k] for i in range(2)]) for k in samples[0]})


def _fit(task: StageTask, cfg, out: Path) -> None:
    Trainer(
        task,
        train_cfg=cfg.stage2.train,
        data_cfg=cfg.data,
        out_dir=out,
        config_hash="h",
        config={"test": True},
        env=SINGLE,
        device="cpu",
        progress=False,
    ).fit()


def test_a_refiner_that_makes_things_worse_is_not_shipped(tiny, tiny_store, tmp_path):
    cfg, stage1 = tiny
    torch.manual_seed(0)
    task = stage2(cfg, train=tiny_store, val=tiny_store, stage1_ckpt=stage1)
    honest = task.loss
    task.loss = lambda m, batch: -honest(m, batch)  # trains the refiner away from the residual
    _fit(task, cfg, tmp_path)

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [-1, 0, 1]
    assert rows[0]["best"] and not any(r["best"] for r in rows[1:])
    assert all(r["val_psnr"] < rows[0]["val_psnr"] for r in rows[1:])  # training did make it worse
    trained = ckpt.load_checkpoint(tmp_path / "latest.pt")["model"]
    assert trained["head.2.weight"].abs().sum() > 0  # ... and the harmful weights exist

    best = ckpt.load_checkpoint(tmp_path / "best.pt")
    # chosen on the mean over the validation protocols (fixed, and the natural ones the store has)
    assert best["epoch"] == 0 and best["best_value"] == rows[0].get("val_score", rows[0]["val_psnr"])
    pipeline = build_pipeline(cfg, stage1_ckpt=stage1)
    pipeline.load_state_dict(best["model"])
    pipeline.eval()
    batch = _val_batch(cfg, tiny_store)
    for seed in (0, 7):  # what ships is exactly the draft, whatever the seed
        torch.testing.assert_close(
            pipeline.sample(batch, steps=2, seed=seed),
            cfdt_draft(pipeline.cfdt, batch).float().clamp(0, 1),
            rtol=0,
            atol=0,
        )


def test_sampler_output_depends_on_the_seed_only(tiny, tiny_store):
    cfg, stage1 = tiny
    pipeline = build_pipeline(cfg, stage1_ckpt=stage1).eval()
    batch = _val_batch(cfg, tiny_store)
    draft = cfdt_draft(pipeline.cfdt, batch).float()
    untrained = pipeline.samples(batch, steps=2, seeds=[0, 1])
    assert torch.equal(untrained[0], untrained[1])  # zero head: no correction at all
    torch.nn.init.normal_(pipeline.refiner.head[-1].weight, std=0.05)  # as after some training
    first, again, other = (pipeline.sample(batch, steps=2, seed=s, ensemble=1) for s in (3, 3, 4))
    assert first.shape == draft.shape and torch.isfinite(first).all()
    assert torch.equal(first, again)
    assert (first - other).abs().mean() > 1e-3
    assert (first - draft.clamp(0, 1)).abs().mean() > 1e-3
    both = pipeline.samples(batch, steps=2, seeds=[3, 4])
    torch.testing.assert_close(both[0], first)
    torch.testing.assert_close(both[1], other)
    # an ensemble averages draws that differ, and still depends on its seed
    mean3, mean3_again, mean3_other = (pipeline.sample(batch, steps=2, seed=s, ensemble=3) for s in (3, 3, 4))
    assert torch.equal(mean3, mean3_again) and (mean3 - mean3_other).abs().mean() > 1e-4
    assert not torch.allclose(mean3, first, atol=1e-4)


def test_the_untrained_refiner_returns_the_draft_without_running(tiny, tiny_store, monkeypatch):
    """The shortcut the guard's shipped start takes: exactly what DDIM would give, no refiner pass."""
    cfg, stage1 = tiny
    pipeline = build_pipeline(cfg, stage1_ckpt=stage1).eval()
    batch = _val_batch(cfg, tiny_store)
    draft = cfdt_draft(pipeline.cfdt, batch).float().clamp(0, 1)
    assert pipeline.refiner.predicts_zero()
    sampled = pipeline.sample(batch, steps=2, seed=0)
    # What DDIM computes with the zero head (the shortcut switched off): the same bits.
    monkeypatch.setattr(type(pipeline.refiner), "predicts_zero", lambda self: False)
    assert torch.equal(pipeline.sample(batch, steps=2, seed=0), sampled)
    monkeypatch.undo()
    assert torch.equal(sampled, draft)
    monkeypatch.setattr(type(pipeline.refiner), "forward", lambda *a, **k: 1 / 0)
    assert torch.equal(pipeline.samples(batch, steps=2, seeds=[0, 1])[1], draft)
    monkeypatch.undo()
    with torch.no_grad():
        pipeline.refiner.head[-1].bias[0] = 1e-3  # any trained head runs the sampler
    assert not pipeline.refiner.predicts_zero()


def test_a_stage_can_take_its_own_samples_per_epoch(tiny, tiny_store):
    import dataclasses

    cfg, stage1 = tiny
    assert (
        len(stage2(cfg, train=tiny_store, val=tiny_store, stage1_ckpt=stage1).train_set) == cfg.data.samples_per_epoch
    )
    own = dataclasses.replace(cfg.stage2.train, samples_per_epoch=5)
    cfg = dataclasses.replace(cfg, stage2=dataclasses.replace(cfg.stage2, train=own))
    assert len(stage2(cfg, train=tiny_store, val=tiny_store, stage1_ckpt=stage1).train_set) == 5


def test_residual_scale_and_cloud_spectrum_are_measured_on_the_samples(tiny, tiny_store):
    cfg, stage1 = tiny
    pipeline = build_pipeline(cfg, stage1_ckpt=stage1)
    samples = CloudySamples(
        tiny_store, dates=cfg.data.input_dates, length=3, seed=1, clear_max_cover=1.01, kinds=("thin", "opaque")
    )
    scale, spectrum = fit_refiner_statistics(pipeline, samples, device="cpu")
    residuals, cloudy = [], []
    for i in range(3):
        batch = {k: v[None] for k, v in samples[i].items()}
        residuals.append(batch["target"] - cfdt_draft(pipeline.cfdt, batch))
        x = batch["x"][0].double()  # (T, 17, H, W)
        cloudy.append(x[:, :13].permute(1, 0, 2, 3)[:, x[:, CLOUD_CHANNEL] >= 0.9])  # (13, N_i)
    residual = torch.cat(residuals).double()  # (3, 13, H, W)
    expected = residual.transpose(0, 1).reshape(13, -1).std(dim=1, unbiased=False)
    torch.testing.assert_close(scale.double(), expected.clamp(min=1e-3), rtol=1e-4, atol=1e-6)
    pixels = torch.cat(cloudy, dim=1)
    assert pixels.shape[1] > 100  # the opaque sample's cloud at least
    torch.testing.assert_close(spectrum.double(), pixels.mean(dim=1), rtol=1e-5, atol=1e-6)
    assert torch.equal(pipeline.state_dict()["residual_scale"], scale)  # saved with the weights
    assert torch.equal(pipeline.state_dict()["cloud_spectrum"], spectrum)


def test_the_loss_weighs_every_sample_alike(tiny, tiny_store):
    """Each sample's error is divided by that of "no correction": the untrained refiner scores
    exactly 1 whatever the residuals' sizes, and a correction that halves one sample's residual
    counts the same whether that sample's residual is large or small."""
    cfg, stage1 = tiny
    pipeline = build_pipeline(cfg, stage1_ckpt=stage1)
    batch = _val_batch(cfg, tiny_store)
    draft, _ = pipeline.condition(batch)
    big = dict(batch, target=draft + 10 * (batch["target"] - draft))  # 10x the residual of sample 0
    big["target"][1] = batch["target"][1]
    for b in (batch, big):
        assert pipeline(b).item() == pytest.approx(1.0, abs=1e-6)

    class Halve(nn.Module):  # predicts half of the true normalised residual
        def __init__(self, r0):
            super().__init__()
            self.r0 = r0

        def forward(self, r_t, t, cond):
            return self.r0 / 2

    for b in (batch, big):
        r0 = (b["target"].float() - draft) / pipeline._scale()
        pipeline.refiner.forward = Halve(r0).forward
        assert pipeline(b).item() == pytest.approx(0.25, rel=1e-5)


def test_training_visits_the_sampler_levels(tiny):
    import dataclasses

    cfg, stage1 = tiny
    pipeline = build_pipeline(cfg, stage1_ckpt=stage1)
    levels = set(pipeline.schedule.sampling_timesteps(cfg.stage2.model.sample_steps))
    torch.manual_seed(0)
    assert set(pipeline.training_levels(200, "cpu").tolist()) == levels
    m = dataclasses.replace(cfg.stage2.model, train_levels="all")
    pipeline = build_pipeline(
        dataclasses.replace(cfg, stage2=dataclasses.replace(cfg.stage2, model=m)), stage1_ckpt=stage1
    )
    assert len(set(pipeline.training_levels(200, "cpu").tolist()) - levels) > cfg.stage2.model.timesteps // 2


# --- the trainer's initial validation, on a toy task --------------------------------------------

DATA = DataConfig(input_dates=2, num_workers=0, samples_per_epoch=6, val_samples=2)


def _toy_task(store, *, hook=None, validated=True) -> StageTask:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(13, 8, 3, padding=1), nn.SiLU(), nn.Conv2d(8, 13, 3, padding=1))

    def loss(m, batch):
        value = nn.functional.l1_loss(m(batch["target"]), batch["target"] * 0.5)
        return hook(value) if hook else value

    def validate(m, batch):
        return compute_all(m(batch["target"]).clamp(0, 1), batch["target"] * 0.5)

    return StageTask(
        stage=0,
        model=model,
        loss=loss,
        validate=validate,
        validate_initial=True,
        train_set=ClearImages(store, length=6, seed=1, crop=16, clear_max_cover=1.01),
        val_set=ClearImages(store, length=2, seed=2, clear_max_cover=1.01) if validated else None,
    )


def _toy_fit(store, out, *, hook=None, validated=True) -> None:
    cfg = TrainConfig(epochs=3, batch_size=2, lr=1e-2, seed=0)
    Trainer(
        _toy_task(store, hook=hook, validated=validated),
        train_cfg=cfg,
        data_cfg=DATA,
        out_dir=out,
        config_hash="h",
        config={"test": True},
        env=SINGLE,
        device="cpu",
        progress=False,
    ).fit()


def test_a_model_that_improves_replaces_its_starting_point(tiny_store, tmp_path):
    _toy_fit(tiny_store, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [-1, 0, 1, 2]
    assert rows[0]["best"] and "loss" not in rows[0]
    best = ckpt.load_checkpoint(tmp_path / "best.pt")
    assert best["epoch"] >= 1 and best["best_value"] == max(r["val_psnr"] for r in rows) > rows[0]["val_psnr"]


def test_without_a_validation_set_the_start_is_not_a_candidate(tiny_store, tmp_path):
    _toy_fit(tiny_store, tmp_path, validated=False)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1, 2]  # no row -1: nothing to beat
    assert not (tmp_path / "best.pt").exists()  # as without the guard: no score, no best; never the start


def test_a_stop_inside_epoch_0_resumes_with_the_initial_validation(tiny_store, tmp_path):
    _toy_fit(tiny_store, tmp_path / "whole")
    calls = {"n": 0}

    def signal_once(value):
        calls["n"] += 1
        if calls["n"] == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
        return value

    with pytest.raises(StopRequested):
        _toy_fit(tiny_store, tmp_path / "cut", hook=signal_once)
    assert [r["epoch"] for r in ckpt.load_checkpoint(tmp_path / "cut/latest.pt")["metrics_rows"]] == [-1]
    _toy_fit(tiny_store, tmp_path / "cut")

    def strip(path):
        return [
            {k: v for k, v in json.loads(line).items() if k in ("epoch", "val_psnr", "loss", "best")}
            for line in path.read_text().splitlines()
        ]

    assert strip(tmp_path / "cut/metrics.jsonl") == strip(tmp_path / "whole/metrics.jsonl")
    whole, cut = ckpt.load_checkpoint(tmp_path / "whole/best.pt"), ckpt.load_checkpoint(tmp_path / "cut/best.pt")
    assert whole["epoch"] == cut["epoch"]
    for key, value in whole["model"].items():
        assert torch.equal(value, cut["model"][key]), key


def test_stage3_starts_from_stage2_exactly(tiny, tiny_store, tmp_path):
    """Stage 3's student is the stage-1 draft model under the frozen stage-2 refiner: its
    untrained start scores exactly what stage 2's validation gives, so the guard makes stage 2 the
    value to beat and stage 3 never ships worse. Only the draft model trains, and only it is saved."""
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint
    from vcloud.train.stages import stage3

    cfg, stage1 = tiny
    pipeline = build_pipeline(cfg, stage1_ckpt=stage1)
    torch.manual_seed(1)
    torch.nn.init.normal_(pipeline.refiner.head[-1].weight, std=0.05)  # a refiner that corrects
    stage2_ckpt = tmp_path / "stage2.pt"
    save_checkpoint(stage2_ckpt, {**checkpoint_meta(stage=2, config_hash="t"), "model": pipeline.state_dict()})
    task = stage3(cfg, train=tiny_store, val=tiny_store, stage1_ckpt=stage1, stage2_ckpt=stage2_ckpt, device="cpu")
    assert task.validate_initial
    batch = _val_batch(cfg, tiny_store)
    scores = task.validate(task.model, batch)
    stage2_task = stage2(cfg, train=tiny_store, val=tiny_store, stage1_ckpt=stage1)
    stage2_task.model.load_state_dict(ckpt.load_checkpoint(stage2_ckpt)["model"])
    torch.testing.assert_close(scores["psnr"], stage2_task.validate(stage2_task.model, batch)["psnr"])
    draft_only = compute_all(cfdt_draft(pipeline.cfdt, batch).float().clamp(0, 1), batch["target"].float())
    assert not torch.allclose(scores["psnr"], draft_only["psnr"])  # the refiner is in the score
    trainable = {id(p) for p in task.model.parameters() if p.requires_grad}
    assert trainable == {id(p) for p in task.model.cfdt.parameters()}  # the stage-2 refiner stays frozen
    assert task.model.state_dict().keys() == pipeline.cfdt.state_dict().keys()  # a CFDT checkpoint


def test_stage3_predicts_its_draft_refined_by_the_stage2_refiner(tiny, tiny_store, tmp_path):
    """The stage-3 predictor reads stage 2 (the refiner) and stage 3 (the self-trained draft
    model), not stage 1: another stage-3 draft model gives another prediction; a stage-1 file in
    its place is refused in one line."""
    from vcloud.errors import BadInputError
    from vcloud.evaluation.predict import build_predictor
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    cfg, stage1 = tiny
    pipeline = build_pipeline(cfg, stage1_ckpt=stage1)
    torch.manual_seed(2)
    torch.nn.init.normal_(pipeline.refiner.head[-1].weight, std=0.05)
    stage2_ckpt = tmp_path / "stage2.pt"
    save_checkpoint(stage2_ckpt, {**checkpoint_meta(stage=2, config_hash="t"), "model": pipeline.state_dict()})
    draft = pipeline.cfdt.state_dict()
    stage3_ckpt = tmp_path / "stage3.pt"
    save_checkpoint(stage3_ckpt, {**checkpoint_meta(stage=3, config_hash="t"), "model": draft})
    batch = _val_batch(cfg, tiny_store)
    two = build_predictor(2, cfg, {1: stage1, 2: stage2_ckpt}, None)(batch)
    same = build_predictor(3, cfg, {2: stage2_ckpt, 3: stage3_ckpt}, None)(batch)
    torch.testing.assert_close(same, two, rtol=0, atol=0)  # stage 1's draft as stage 3's: stage 2 exactly
    changed = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in draft.items()}
    save_checkpoint(stage3_ckpt, {**checkpoint_meta(stage=3, config_hash="t"), "model": changed})
    three = build_predictor(3, cfg, {2: stage2_ckpt, 3: stage3_ckpt}, None)(batch)
    assert three.shape == two.shape and not torch.allclose(three, two)
    with pytest.raises(BadInputError, match="checkpoint of stage 1, expected stage 3"):
        build_predictor(3, cfg, {2: stage2_ckpt, 3: stage1}, None)

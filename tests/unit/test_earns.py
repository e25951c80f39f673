"""Every stage earns its GPU-hours: the seen pixels kept, the multi-protocol guard, natural truths."""

import math

import numpy as np
import pytest
import torch

from vcloud.constants import S2_CHANNELS, SAMPLE_CHANNELS
from vcloud.evaluation.protocols import ReferenceSamples, reference_truths
from vcloud.pipeline import keep_seen
from vcloud.train.distributed import DistEnv
from vcloud.train.trainer import guard

SINGLE = DistEnv(rank=0, world_size=1, local_rank=0, master_addr="", master_port=0, source="single")


def _batch(prob: torch.Tensor, observed: torch.Tensor) -> dict:
    b, _, h, w = observed.shape
    x = torch.rand(b, 3, SAMPLE_CHANNELS, h, w)  # (B, T, 17, H, W)
    x[:, 1, S2_CHANNELS] = observed
    return {"x": x, "target_index": torch.full((b,), 1), "target_prob": prob}


def test_a_clear_target_comes_back_as_observed_whatever_the_model_says():
    observed = torch.rand(2, 13, 8, 8)
    batch = _batch(torch.zeros(2, 8, 8), observed)
    wrong = torch.rand(2, 13, 8, 8)  # a model that damages the clear date
    torch.testing.assert_close(keep_seen(wrong, batch, 0.4), observed)
    torch.testing.assert_close(keep_seen(wrong, batch, None), wrong)  # switched off: the model's output


def test_cloudy_pixels_are_the_models_and_the_unsure_ones_a_blend():
    observed, model = torch.zeros(1, 13, 2, 2), torch.ones(1, 13, 2, 2)
    prob = torch.tensor([[[0.0, 0.2], [0.4, 0.9]]])
    out = keep_seen(model, _batch(prob, observed), 0.4)[0, 0]
    # weight of the observation 1 - p / 0.4: 1, 0.5, 0, 0 -> the model's share 0, 0.5, 1, 1
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.5], [1.0, 1.0]]))


def test_refined_and_draft_predictors_keep_a_clear_date(tiny_store, one_thread, tmp_path):
    """The whole predictor path: a target date seen everywhere comes back unchanged from stage 1
    and from a refiner that changes every pixel it is given."""
    import dataclasses

    from tests.unit.predict_fixtures import tiny_checkpoints
    from vcloud.config import load_model_config
    from vcloud.evaluation.predict import draft, refined

    found = tiny_checkpoints(tmp_path)
    cfg = load_model_config(found["config"])
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, keep_seen_max_prob=0.4))  # opt-in
    ds = ReferenceSamples(tiny_store, dates=2)
    batch = {k: v[None] for k, v in ds[0].items()}
    slot = int(batch["target_index"][0])
    observed = batch["x"][0, slot, S2_CHANNELS].float()
    changes = refined(cfg, {1: found[1], 2: found[2]}, None)
    assert (changes(batch)[0].float() - observed).abs().max() > 1e-3  # the slot is not all seen yet
    batch["target_prob"] = torch.zeros_like(batch["target_prob"])  # now the slot's date is seen everywhere
    for predict in (draft(cfg, {1: found[1]}, None), changes):
        torch.testing.assert_close(predict(batch)[0].float(), observed, atol=1e-6, rtol=0)


def test_guard_refuses_a_checkpoint_that_loses_on_one_protocol():
    start = {"fixed": [30.0, 31.0, 32.0, 33.0], "reference": [28.0, 29.0, 30.0, 31.0]}
    better_on_fixed_worse_on_natural = {"fixed": [31.0, 32.0, 33.0, 34.0], "reference": [27.0, 28.1, 28.9, 30.0]}
    verdict = guard(better_on_fixed_worse_on_natural, start)
    assert verdict["fixed"]["ok"] and not verdict["reference"]["ok"]
    # a loss within the paired SE is not a loss
    noisy = {"fixed": [30.5, 30.6, 32.4, 32.9], "reference": [28.0, 29.0, 30.0, 31.0]}
    assert all(v["ok"] for v in guard(noisy, start).values())
    assert guard(start, start)["fixed"] == {"difference": 0.0, "se": 0.0, "ok": True}


def test_trainer_keeps_the_start_when_an_epoch_loses_on_a_natural_protocol(tmp_path):
    """The trainer's selection: an epoch better on fixed and on the score but worse on reference by
    more than its SE is not best.pt; the start stays."""
    from torch import nn
    from torch.utils.data import Dataset

    from vcloud.config import DataConfig, TrainConfig
    from vcloud.train.trainer import StageTask, Trainer

    class Values(Dataset):
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return {"i": torch.tensor(i), "x": torch.zeros(1)}

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1))
            self.epoch = -1

    model = Model()
    # per-sample "psnr" by protocol and epoch: epoch 0 wins fixed by +3 and loses reference by 1
    table = {"fixed": {-1: [30.0] * 4, 0: [33.0] * 4}, "reference": {-1: [30.0, 31, 29, 30], 0: [29.0, 30, 28, 29.1]}}

    class Tagged(Values):
        def __init__(self, n, name):
            super().__init__(n)
            self.name = name

        def __getitem__(self, i):
            return {**super().__getitem__(i), "name": torch.tensor(0 if self.name == "fixed" else 1)}

    def validate(m, batch):
        name = "fixed" if int(batch["name"][0]) == 0 else "reference"
        values = torch.tensor([table[name][m.epoch][int(i)] for i in batch["i"]])
        return {"psnr": values}

    def loss(m, batch):
        return m.w.sum() * 0

    task = StageTask(
        stage=2,
        model=model,
        train_set=Values(2),
        val_set=Tagged(4, "fixed"),
        loss=loss,
        validate=validate,
        validate_initial=True,
        extra_val={"reference": Tagged(4, "reference")},
    )
    trainer = Trainer(
        task,
        train_cfg=TrainConfig(epochs=1, batch_size=2, lr=1e-3, tensorboard=False),
        data_cfg=DataConfig(input_dates=2),
        out_dir=tmp_path,
        config_hash="x",
        config={},
        env=SINGLE,
        device="cpu",
        progress=False,
    )
    original = trainer._train_epoch

    def train_epoch(stop):
        record = original(stop)
        model.epoch = 0
        return record

    trainer._train_epoch = train_epoch
    trainer.fit()
    rows = trainer.rows
    final = [r for r in rows if r["epoch"] == 0][0]
    assert final["val_psnr"] == pytest.approx(33.0) and final["val_score"] > rows[0]["val_score"]
    assert not final["guard"]["reference"]["ok"] and final["best"] is False
    assert trainer.best_epoch == -1


def test_reference_truths_spread_over_the_clear_dates():
    cover = np.array([0.0, 0.5, 0.0, 0.01, 0.9, 0.0, 0.0, math.inf])
    assert reference_truths(cover, truths=1, clear_max_cover=0.05) == [0]
    assert reference_truths(cover, truths=3, clear_max_cover=0.05) == [0, 3, 6]
    assert reference_truths(cover, truths=9, clear_max_cover=0.05) == [0, 2, 3, 5, 6]
    assert reference_truths(np.array([0.6, 0.3, math.inf]), truths=4, clear_max_cover=0.05) == [1]


def test_reference_protocol_with_several_truths_per_location(tiny_store):
    one, several = ReferenceSamples(tiny_store, dates=2), ReferenceSamples(tiny_store, dates=2, truths=3)
    assert len(several) >= len(one)
    for _location, truth, dates, slot, _ in several.items:
        assert truth not in dates and abs(dates[slot] - truth) == min(abs(d - truth) for d in dates)


def test_clear_share_teaches_the_refiner_clear_targets_as_observed(tiny_store):
    """clear_share: that share of training samples shows the target date as it is (kind "clear",
    no synthetic cloud): the input at the target slot is the truth, which the refiner must keep."""
    from vcloud.constants import CLOUD_CLASSES
    from vcloud.data.samples import CloudySamples, finish_batch

    plain = CloudySamples(tiny_store, dates=2, length=40, seed=3, clear_max_cover=1.01)
    mixed = CloudySamples(tiny_store, dates=2, length=40, seed=3, clear_max_cover=1.01, clear_share=0.5)
    clear = CLOUD_CLASSES.index("clear")
    assert all(int(plain[i]["cloud_class"]) != clear for i in range(len(plain)))  # 0: as before
    picked = [i for i in range(len(mixed)) if int(mixed[i]["cloud_class"]) == clear]
    assert 8 <= len(picked) <= 32
    for i in picked[:4]:
        item = finish_batch({k: v[None] for k, v in mixed[i].items()})
        slot = int(item["target_index"][0])
        torch.testing.assert_close(item["x"][0, slot, S2_CHANNELS], item["target"][0].float())
    unclear = next(i for i in range(len(mixed)) if i not in picked)
    item = finish_batch({k: v[None] for k, v in mixed[unclear].items()})
    slot = int(item["target_index"][0])
    assert not torch.allclose(item["x"][0, slot, S2_CHANNELS], item["target"][0].float())


def _report(stage: int, psnr: dict[str, list[float]], seen_mae: float = 0.01) -> dict:
    protocols = {}
    for name, values in psnr.items():
        protocols[name] = {
            "samples": len(values),
            "location": [i // 2 for i in range(len(values))],
            "protocol": {"protocol": name},
            "model": {"per_sample": {"psnr": values}, "seen_mae": seen_mae},
        }
    return {"stage": stage, "protocols": protocols}


def test_compare_stages_pairs_each_stage_with_the_one_before(tmp_path):
    import json

    from vcloud.errors import BadInputError
    from vcloud.evaluation.compare import compare_stages, markdown

    reports = []
    table = {
        1: {"fixed": [30, 31, 32, 33], "reference": [35, 36], "uncrtaints": [40, 41]},
        2: {"fixed": [31, 32, 33, 34.5], "reference": [35.5, 36.1], "uncrtaints": [39, 41]},
        3: {"fixed": [31, 32, 33, 34.5], "reference": [36, 36.6], "uncrtaints": [40, 42]},
    }
    for stage, psnr in table.items():
        path = tmp_path / f"stage{stage}.json"
        path.write_text(json.dumps(_report(stage, psnr)))
        reports.append(path)
    out = compare_stages(reports, stages=(1, 2, 3))
    fixed = out["protocols"]["fixed"]["difference"]["2 - 1"]
    assert fixed["difference"] == pytest.approx(1.125) and fixed["samples"] == 4 and fixed["se"] > 0
    natural = out["protocols"]["natural"]
    assert natural["samples"] == 4 and natural["pooled"] == ["reference", "uncrtaints"]
    assert natural["difference"]["3 - 2"]["difference"] == pytest.approx(0.75)  # (0.5 + 0.5 + 1 + 1) / 4
    assert natural["difference"]["2 - 1"]["difference"] == pytest.approx((0.5 + 0.1 - 1 + 0) / 4)
    text = markdown(out)
    assert "| fixed | 4 | 31.50 | 32.62 | 32.62 | +1.12" in text and "natural (reference + uncrtaints) | 4 |" in text
    # another store's report (other samples) is refused in one line naming the stages
    other = _report(3, {"fixed": [1.0, 2.0], "reference": [1.0, 2.0], "uncrtaints": [1.0, 2.0]})
    other["protocols"]["fixed"]["location"] = [7, 8]
    reports[2].write_text(json.dumps(other))
    with pytest.raises(BadInputError, match="stages 2 and 3 were scored on different samples"):
        compare_stages(reports, stages=(1, 2, 3))
    reports[2].write_text("{not json")
    with pytest.raises(BadInputError, match="stage3.json: not an evaluation report"):
        compare_stages(reports, stages=(1, 2, 3))


def test_natural_clouds_lay_a_cloudy_dates_cloud_on_a_clear_target(tiny_store, small):
    """Stage 3's natural-cloud samples: the target slot is the cloudy date's image where its cloud
    probability is 1, the clear truth where it is 0, and the truth is the clear date itself."""
    import dataclasses

    from vcloud.data.shards import ShardReader
    from vcloud.train.stages import NaturalClouds

    cfg = dataclasses.replace(
        small, data=dataclasses.replace(small.data, input_dates=2, crop=None, clear_target_max_cover=1.01)
    )
    reader = ShardReader(tiny_store)
    cover = np.nan_to_num(reader.cloud_cover, nan=1.0)
    clouds = NaturalClouds(tiny_store, cfg, length=6, seed=0)
    # The tiny store is made from a fixed seed (tests/conftest.py TINY): it has such dates, always.
    assert len(clouds), "the tiny store has no date with cloud cover >= 0.3: nothing to test"
    assert len(clouds) == 6 and cover[clouds.cloudy].min() >= 0.3
    item = clouds[0]
    slot = int(item["target_index"])
    veil = item["x"][slot, -1]  # the cloudy date's probability, now the slot's
    assert torch.equal(veil, item["target_prob"])
    clear = veil == 0
    if clear.any():
        torch.testing.assert_close(item["x"][slot, S2_CHANNELS][:, clear], item["target"][:, clear])
    assert not torch.allclose(item["x"][slot, S2_CHANNELS], item["target"])


def test_stage0_weights_reach_stage1(tiny_store, tmp_path):
    import dataclasses

    """Stage 1 (stage1.init_from_stage0) starts its per-date encoder's first level from stage 0's
    best.pt: the stem's S2 channels and the level-0 blocks are the autoencoder's, the rest is not."""
    import yaml

    from tests.workflow.snakemake_run import ROOT
    from vcloud.config import load_model_config
    from vcloud.models.autoencoder import Autoencoder
    from vcloud.registry import get_stage
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    models = yaml.safe_load((ROOT / "tests/workflow/tiny_models.yaml").read_text())
    models["stage1"]["model"]["wind_scan"] = False
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(models))
    cfg = load_model_config(tmp_path / "models.yaml")
    torch.manual_seed(1)
    ae = Autoencoder(cfg.stage0.model).state_dict()
    save_checkpoint(tmp_path / "stage0.pt", {**checkpoint_meta(stage=0, config_hash="t"), "model": ae})
    torch.manual_seed(0)
    task = get_stage(1).build(
        cfg, train=tiny_store, val=tiny_store, checkpoints={0: tmp_path / "stage0.pt"}, device="cpu"
    )
    pyramid = task.model.encoder.pyramid
    torch.testing.assert_close(pyramid.stem.weight[:, S2_CHANNELS], ae["encoder.0.weight"], rtol=0, atol=0)
    torch.testing.assert_close(pyramid.stem.bias, ae["encoder.0.bias"], rtol=0, atol=0)
    for name, value in pyramid.levels[0].state_dict().items():
        block, _, rest = name.partition(".")
        torch.testing.assert_close(value, ae[f"encoder.{int(block) + 1}.{rest}"], rtol=0, atol=0)
    # the rest keeps the initialisation it has without stage 0
    off = dataclasses.replace(cfg, stage1=dataclasses.replace(cfg.stage1, init_from_stage0=False))
    torch.manual_seed(0)
    plain = get_stage(1).build(off, train=tiny_store, val=tiny_store, checkpoints={}, device="cpu").model
    mine = task.model.state_dict()
    for name, value in plain.state_dict().items():
        if name.startswith(("encoder.pyramid.stem.", "encoder.pyramid.levels.0.")):
            continue
        torch.testing.assert_close(mine[name], value, rtol=0, atol=0, msg=name)
    s1_and_cloud = slice(S2_CHANNELS.stop, None)
    torch.testing.assert_close(pyramid.stem.weight[:, s1_and_cloud], plain.encoder.pyramid.stem.weight[:, s1_and_cloud])
    # another stage's file is refused in one line
    save_checkpoint(tmp_path / "stage2.pt", {**checkpoint_meta(stage=2, config_hash="t"), "model": ae})
    with pytest.raises(Exception, match=r"stage2.pt: checkpoint of stage 2, expected stage 0$"):
        get_stage(1).build(cfg, train=tiny_store, val=tiny_store, checkpoints={0: tmp_path / "stage2.pt"}, device="cpu")


def test_natural_pairs_are_the_reference_construction_on_the_split(tiny_store, small):
    """Stage 3's natural pairs: each clear date a truth, left out of the inputs, the slot the input
    date nearest to it; drawn per epoch, every pair once when length is None."""
    from vcloud.evaluation.protocols import ReferenceSamples
    from vcloud.train.stages import NaturalPairs

    pairs = NaturalPairs(tiny_store, small, length=None, seed=0)
    reference = ReferenceSamples(
        tiny_store, dates=small.data.input_dates, truths=10**6, clear_max_cover=small.data.clear_target_max_cover
    )
    assert len(pairs) == len(reference) > 0
    for _location, truth, dates, slot, _ in reference.items:
        assert truth not in dates and abs(dates[slot] - truth) == min(abs(d - truth) for d in dates)
    item = pairs[0]
    assert item["x"].shape[-1] == small.data.crop and item["target"].shape[-1] == small.data.crop
    # the loss counts where the reconstructed date is cloudy only (its seen pixels are their own truth)
    torch.testing.assert_close(item["pixel_weight"], (item["target_prob"] >= 0.4).float())
    drawn = NaturalPairs(tiny_store, small, length=3, seed=0)
    assert len(drawn) == 3
    torch.testing.assert_close(drawn[1]["x"], NaturalPairs(tiny_store, small, length=3, seed=0)[1]["x"])  # seeded
    targets = {drawn[i]["target"].sum().item() for i in range(30)}  # epochs draw every pair in turn
    assert len(targets) >= len(reference)


def test_stage3_trains_the_draft_under_the_frozen_refiner(tiny_store, tmp_path):
    """The student's checkpoint holds the CFDT (stage 1's shape); the refiner is frozen and its
    output is what is validated; the stage-3 predictor reads stages 2 and 3."""
    import yaml

    from tests.unit.predict_fixtures import tiny_checkpoints
    from vcloud.config import load_model_config
    from vcloud.evaluation.predict import redrafted
    from vcloud.registry import get_stage

    found = tiny_checkpoints(tmp_path)
    models = yaml.safe_load(found["config"].read_text())
    models["stage3"]["self_training"]["max_pseudo_labels"] = 2
    found["config"].write_text(yaml.safe_dump(models))
    cfg = load_model_config(found["config"])
    task = get_stage(3).build(cfg, train=tiny_store, val=tiny_store, checkpoints=found, device="cpu")
    student = task.model
    assert set(student.state_dict()) == set(torch.load(found[1], weights_only=True)["model"])  # the CFDT
    assert all(p.requires_grad for p in student.cfdt.parameters())
    assert not any(p.requires_grad for p in student.refiner.parameters())
    student.train()
    assert student.cfdt.training and not student.refiner.training
    assert task.summary["natural_pairs"] == cfg.stage3.self_training.natural_pairs
    # the loss: L1 over the pixels each sample's truth holds for (pixel_weight)
    batch = next(iter(torch.utils.data.DataLoader(task.train_set, batch_size=2)))
    assert set(batch["pixel_weight"].unique().tolist()) <= {0.0, 1.0}
    whole = task.loss(student, batch)
    batch["pixel_weight"] = torch.zeros_like(batch["pixel_weight"])
    batch["pixel_weight"][..., :1, :1] = 1.0  # one pixel counts: its error alone
    torch.manual_seed(1)  # the same sampler noise for the output and the loss
    output = student(batch).float()
    one = (output - batch["target"].float()).abs().mean(dim=1)[..., :1, :1].mean()
    torch.manual_seed(1)
    torch.testing.assert_close(task.loss(student, batch), one)
    assert whole > 0
    assert get_stage(3).predictor_needs == (2, 3)
    # the predictor of a stage-3 checkpoint: its draft under stage 2's refiner
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    save_checkpoint(
        tmp_path / "stage3.pt", {**checkpoint_meta(stage=3, config_hash="t"), "model": student.state_dict()}
    )
    predict = redrafted(cfg, {2: found[2], 3: tmp_path / "stage3.pt"}, None)
    ds = ReferenceSamples(tiny_store, dates=cfg.data.input_dates)
    batch = {k: v[None] for k, v in ds[0].items()}
    from vcloud.evaluation.predict import refined

    # the untrained student is stage 1's draft under stage 2's refiner: stage 2's prediction exactly
    torch.testing.assert_close(predict(batch), refined(cfg, {1: found[1], 2: found[2]}, None)(batch), rtol=0, atol=0)
    with torch.no_grad():
        next(student.cfdt.parameters()).add_(0.5)  # another draft model: another output
    save_checkpoint(
        tmp_path / "stage3.pt", {**checkpoint_meta(stage=3, config_hash="t"), "model": student.state_dict()}
    )
    assert not torch.equal(redrafted(cfg, {2: found[2], 3: tmp_path / "stage3.pt"}, None)(batch), predict(batch))


def test_stage3_loss_is_on_what_ships_and_reaches_only_the_draft_model(tiny_store, tmp_path):
    """loss_on refined: the student's output is one draw of its draft through the frozen refiner
    with the seen pixels kept, as the stage-3 predictor's sampler gives it for the same noise; the
    gradient reaches the CFDT only, through every sampler step or the last `grad_steps`; loss_on
    draft: the bare draft."""
    import dataclasses

    from tests.unit.predict_fixtures import tiny_checkpoints
    from vcloud.config import load_model_config
    from vcloud.pipeline import cfdt_draft
    from vcloud.registry import get_stage

    found = tiny_checkpoints(tmp_path)
    cfg = load_model_config(found["config"])
    assert cfg.stage3.self_training.loss_on == "refined" and cfg.stage2.model.sample_steps == 2

    def student_and_batch(**self_training):
        st = dataclasses.replace(cfg.stage3.self_training, max_pseudo_labels=0, **self_training)
        c = dataclasses.replace(cfg, stage3=dataclasses.replace(cfg.stage3, self_training=st))
        task = get_stage(3).build(c, train=tiny_store, val=tiny_store, checkpoints=found, device="cpu")
        torch.manual_seed(0)
        return task, next(iter(torch.utils.data.DataLoader(task.train_set, batch_size=2)))

    task, batch = student_and_batch()
    student = task.model.eval()
    with torch.no_grad():
        torch.manual_seed(5)
        output = student(batch)
        shipped = student.draws(batch, steps=cfg.stage2.model.sample_steps, seed=5, ensemble=1)[0]
    torch.testing.assert_close(output, shipped)
    assert not torch.allclose(output, cfdt_draft(student.cfdt, batch))  # the refiner changed it

    def gradients(task):
        task.model.train().zero_grad()
        torch.manual_seed(5)
        task.loss(task.model, batch).backward()
        assert all(p.grad is None for p in task.model.refiner.parameters())  # frozen
        return torch.cat([p.grad.flatten() for p in task.model.cfdt.parameters() if p.grad is not None])

    assert cfg.stage3.self_training.grad_steps == 1
    last = gradients(task)
    every = gradients(student_and_batch(grad_steps=None)[0])
    assert every.abs().sum() > 0
    assert last.abs().sum() > 0 and not torch.allclose(last, every)  # the first step's path is cut
    task, _ = student_and_batch(loss_on="draft")
    task.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(task.model(batch), cfdt_draft(task.model.cfdt, batch))

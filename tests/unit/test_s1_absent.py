"""A date without S1 reaches the models marked absent (x's S1 validity channel 0, S1 zeros), never
as backscatter; training removes S1 at random (data.s1_dropout); `vcloud evaluate --without-s1`
removes it from every date exactly as a store without S1 lacks it; predictors use such dates."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from tests.conftest import TINY, TINY_ROIS
from tests.unit.predict_fixtures import tiny_checkpoints
from vcloud.constants import S1_CHANNELS, S1_VALID_CHANNEL, S2_CHANNELS

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors on a shared machine

WITH_S1 = 0  # the only time index of `partial` that keeps its S1 images


def _prepare(raw_master, folder, *, keep_s1: set[int]):
    from vcloud.data.prepare import prepare_roi

    raw = folder / "raw"
    shutil.copytree(raw_master, raw)
    for t in range(TINY["times"]):
        if t not in keep_s1:
            shutil.rmtree(raw / f"ROIs1868/119/S1/{t}")
    out = folder / "store.zarr"
    prepare_roi(raw=raw, roi=TINY_ROIS[0], out=out, times=TINY["times"], size=TINY["size"])
    return out


@pytest.fixture(scope="module")
def partial(tiny_raw_master, tmp_path_factory):
    """The tiny store with S1 at time WITH_S1 only."""
    return _prepare(tiny_raw_master, tmp_path_factory.mktemp("partial"), keep_s1={WITH_S1})


@pytest.fixture(scope="module")
def no_s1(tiny_raw_master, tmp_path_factory):
    """The tiny store without any S1."""
    return _prepare(tiny_raw_master, tmp_path_factory.mktemp("no_s1"), keep_s1=set())


def assert_marked(batch: dict) -> None:
    """x's S1 validity channel is the batch's s1_valid; S1 is zero where it is 0 (B, T, C, H, W)."""
    x, valid = batch["x"], batch["s1_valid"]
    torch.testing.assert_close(x[:, :, S1_VALID_CHANNEL], valid[:, :, None, None].float().expand_as(x[:, :, 0]))
    assert not x[:, :, S1_CHANNELS][~valid].any()
    rows = torch.arange(len(x))
    assert torch.equal(x[rows, batch["target_index"], S1_VALID_CHANNEL].amax((-2, -1)).bool(), batch["target_s1_valid"])


# --- a date without S1 reaches the model marked absent ------------------------------------------


@pytest.mark.parametrize("raw", [False, True])
def test_a_date_without_s1_is_marked_absent_in_x_by_every_sampler(partial, raw):
    from vcloud.data.samples import CloudySamples, finish_batch
    from vcloud.data.shards import ShardReader
    from vcloud.evaluation.protocols import ReferenceSamples

    reader = ShardReader(partial)
    assert reader.valid_s1[:, WITH_S1].all() and reader.valid_s1.sum() == len(reader)
    cloudy = CloudySamples(partial, dates=3, length=6, seed=0, clear_max_cover=1.01, kinds=("thick",), raw=raw)
    batch = finish_batch(default_collate([cloudy[i] for i in range(6)]))
    assert (~batch["s1_valid"]).any() and batch["s1_valid"].any()  # both kinds of date are in it
    assert_marked(batch)
    for i in range(6):  # the marks are the store's
        location, _, dates, _, _ = cloudy.pick(i)
        np.testing.assert_array_equal(batch["s1_valid"][i].numpy(), reader.valid_s1[location, dates])
    if not raw:
        reference = ReferenceSamples(partial, dates=3)
        assert_marked(default_collate([reference[i] for i in range(len(reference))]))


def test_a_date_without_s1_differs_from_a_date_of_water_backscatter(small):
    """Missing S1 normalises to the S1 floor (-25 dB, open water): only the validity channel tells
    the two apart, and the CFDT and the refiner's condition see it."""
    from vcloud.models.cfdt import CFDT
    from vcloud.models.refiner import refiner_condition

    torch.manual_seed(0)
    model = CFDT(small.stage1.model).eval()
    x = torch.rand(1, 3, model.in_channels, 32, 32)
    x[:, :, S1_CHANNELS] = 0.0  # -25 dB at every date
    water, absent = x.clone(), x.clone()
    water[:, :, S1_VALID_CHANNEL], absent[:, :, S1_VALID_CHANNEL] = 1.0, 0.0
    days, target = torch.tensor([[-10.0, 0.0, 12.0]]), torch.tensor([1])
    with torch.no_grad():
        assert not torch.allclose(model(water, days, target), model(absent, days, target), atol=1e-5)
    parts = (torch.rand(1, 13, 8, 8), torch.rand(1, 13, 8, 8), torch.zeros(1, 2, 8, 8), torch.rand(1, 8, 8))
    common = {"spectrum": torch.full((13,), 0.5), "scale": torch.full((13,), 0.02)}
    with_s1 = refiner_condition(*parts, s1_valid=torch.tensor([True]), **common)
    without = refiner_condition(*parts, s1_valid=torch.tensor([False]), **common)
    assert not torch.equal(with_s1, without) and with_s1.shape == without.shape


# --- S1 dropout in training ---------------------------------------------------------------------


def _dropped(dataset, count: int) -> np.ndarray:
    """(count, T) bool: the dates whose S1 sample i lacks."""
    rows = []
    for i in range(count):
        location, _, dates, _, _ = dataset.pick(i)
        rows.append(~dataset.s1_valid(i, location, dates))
    return np.array(rows)


def test_s1_dropout_removes_s1_at_its_rate_with_a_fixed_seed_and_never_at_zero(tiny_store):
    from vcloud.data.samples import CloudySamples

    def samples(rate, seed=3):
        return CloudySamples(tiny_store, dates=3, length=400, seed=seed, clear_max_cover=1.01, s1_dropout=rate)

    assert not _dropped(samples(0.0), 400).any()  # the tiny store has S1 at every date
    dropped = _dropped(samples(0.3), 400)  # 1200 dates
    assert abs(dropped.mean() - 0.3) < 0.04, dropped.mean()
    np.testing.assert_array_equal(dropped, _dropped(samples(0.3), 400))  # the same seed, the same dates
    assert not np.array_equal(dropped, _dropped(samples(0.3, seed=4), 400))
    assert _dropped(samples(1.0), 20).all()
    # The dropped dates are marked as missing S1 is, and dropout draws nothing else differently.
    dropout, plain = samples(0.3), samples(0.0)
    index = int(np.flatnonzero(dropped.any(axis=1))[0])
    item, before = dropout[index], plain[index]
    assert torch.equal(item["s1_valid"], torch.from_numpy(~dropped[index]))
    assert_marked(default_collate([item]))
    assert torch.equal(item["x"][:, S2_CHANNELS], before["x"][:, S2_CHANNELS])
    assert torch.equal(item["target"], before["target"])
    kept = item["s1_valid"]
    assert torch.equal(item["x"][kept][:, S1_CHANNELS], before["x"][kept][:, S1_CHANNELS])


def test_training_samples_take_s1_dropout_from_the_config_and_validation_none(small, tiny_store):
    from vcloud.train.stages import _cloudy

    assert small.data.s1_dropout > 0
    train = _cloudy(small, tiny_store, train=True, stage_epochs=1)
    val = _cloudy(small, tiny_store, train=False, stage_epochs=1)
    assert (train.s1_dropout, val.s1_dropout) == (small.data.s1_dropout, 0.0)


# --- evaluate --without-s1 ----------------------------------------------------------------------


def test_without_s1_is_exactly_a_store_without_s1(tiny_store, no_s1):
    from vcloud.data.samples import WithoutS1
    from vcloud.evaluation.protocols import ReferenceSamples

    removed, missing = WithoutS1(ReferenceSamples(tiny_store, dates=3)), ReferenceSamples(no_s1, dates=3)
    assert len(removed) == len(missing) > 0
    for i in range(len(missing)):
        a, b = removed[i], missing[i]
        assert set(a) == set(b)
        for key in b:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, equal_nan=True, msg=key)
        assert not a["s1_valid"].any() and not a["x"][:, S1_VALID_CHANNEL].any()


def test_evaluate_without_s1_marks_every_date_absent_in_every_protocol(tiny_store, tmp_path, monkeypatch):
    import vcloud.evaluation.evaluate as evaluation
    from vcloud.cli import main

    seen: list[dict] = []

    def spy(dataset, predict, **_):
        batch = default_collate([dataset[i] for i in range(min(len(dataset), 3))])
        seen.append(batch)
        return {"samples": len(dataset)}

    monkeypatch.setattr(evaluation, "score", spy)
    monkeypatch.setattr(evaluation, "table", lambda report: "")
    ckpt = tiny_checkpoints(tmp_path / "ckpt")
    args = [
        "evaluate",
        "--stage",
        "1",
        "--store",
        str(tiny_store),
        "--stage1",
        str(ckpt[1]),
        "--config",
        str(ckpt["config"]),
    ]
    assert main([*args, "--out", str(tmp_path / "with.json")]) == 0
    assert len(seen) >= 2 and all(batch["s1_valid"].all() for batch in seen)  # the tiny store has S1
    seen.clear()
    assert main([*args, "--out", str(tmp_path / "without.json"), "--without-s1"]) == 0
    assert len(seen) >= 2  # fixed, reference (and uncrtaints where the store has its samples)
    for batch in seen:
        assert not batch["s1_valid"].any() and not batch["target_s1_valid"].any()
        assert_marked(batch)
        assert not batch["target_s1"].any()
    import json

    assert json.loads((tmp_path / "without.json").read_text())["without_s1"] is True


# --- predictors ---------------------------------------------------------------------------------


def test_a_predictor_given_a_date_without_s1_runs_and_uses_it(partial, tmp_path):
    from vcloud.apply.plan import plan_jobs, read_batch, roi_names
    from vcloud.config import load_model_config
    from vcloud.data.shards import ShardReader
    from vcloud.evaluation.predict import build_predictor

    ckpt = tiny_checkpoints(tmp_path / "ckpt")  # data.input_dates 2
    cfg = load_model_config(ckpt["config"])
    reader = ShardReader(partial)
    jobs = plan_jobs(reader, rois=roi_names(reader), input_dates=2, min_cover=-1.0)
    batch = read_batch(reader, jobs).tensors
    assert_marked(batch)
    # A sample whose context date (not the target) has no S1.
    i, other = next(
        (i, t)
        for i in range(len(jobs))
        for t in range(2)
        if t != int(batch["target_index"][i]) and not batch["s1_valid"][i, t]
    )
    one = {k: v[i : i + 1] for k, v in batch.items()}
    changed = {**one, "x": one["x"].clone()}
    changed["x"][0, other, S2_CHANNELS] = 1.0 - changed["x"][0, other, S2_CHANNELS]
    for stage, needs in ((1, {1: ckpt[1]}), (2, {1: ckpt[1], 2: ckpt[2]})):
        predict = build_predictor(stage, cfg, needs, None)
        with torch.no_grad():
            out, moved = predict(one), predict(changed)
        assert out.shape == (1, 13, *one["x"].shape[-2:]) and torch.isfinite(out).all(), stage
        assert not torch.allclose(out, moved, atol=1e-4), stage  # the date without S1 is an input
    # The refiner is told where the target date has no S1.
    pipeline = build_predictor(2, cfg, {1: ckpt[1], 2: ckpt[2]}, None).model
    target_absent = ~batch["target_s1_valid"]
    assert target_absent.any()
    _, cond = pipeline.condition(batch)
    assert not cond[target_absent, 26:29].any()  # S1 zeros and its validity 0
    assert cond[~target_absent, 28].eq(1).all()

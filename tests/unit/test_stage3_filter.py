"""Stage 3's pseudo-label acceptance: seeds that agree and a label that matches the pixels the
mask calls clear are kept; exactly the expected samples, with a fake teacher of known spread."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from vcloud.constants import SAMPLE_CHANNELS
from vcloud.train.stages import check_on_labelled, confidence, pseudo_label

H = W = 4
OBSERVED = 0.5  # the target date's input everywhere
SPREAD, VISIBLE = 0.015625, 0.03125  # thresholds, exact in float32 (so are the values below)

# (seed half-difference d, label offset e on visible pixels, any pixel visible) -> kept?
CASES = [
    (0.0078125, 0.0078125, True, True),  # both well inside
    (0.03125, 0.0, True, False),  # the seeds disagree
    (0.0, 0.0625, True, False),  # the label contradicts the clear pixels
    (SPREAD, VISIBLE, True, True),  # both on the threshold: kept (<=)
    (0.0, 0.0, False, False),  # nothing visible to check the label against
]


class FakeCFDT(nn.Module):
    wind = None

    def forward(self, x, days, target_index, sectors=None):  # the draft: the observed input
        return x[torch.arange(x.shape[0]), target_index, :13]


class FakeTeacher(nn.Module):
    """Seed s gives label + (-1)^s d: the seeds' mean is the label, their spread exactly d (each
    sample of a batch with its own d and e)."""

    def __init__(self):
        super().__init__()
        self.cfdt = FakeCFDT()
        self.batch_sizes: list[int] = []

    def samples(self, batch, *, steps, seeds, with_draft=False):
        self.batch_sizes.append(len(batch["x"]))
        d, e = (batch["case"][:, k].view(-1, 1, 1, 1) for k in (0, 1))  # (B, 1, 1, 1)
        visible = batch["visible"] if "visible" in batch else batch["target_prob"] < 0.4  # (B, H, W)
        label = torch.where(visible[:, None], OBSERVED + e, 0.875).expand(-1, 13, H, W)  # hidden: anything
        draws = torch.stack([label + (d if s % 2 == 0 else -d) for s in seeds])  # (S, B, 13, H, W)
        return (draws, self.cfdt(batch["x"], batch["days"], batch["target_index"])) if with_draft else draws


def _item(d, e, any_visible, *, labelled=False):
    x = torch.full((2, SAMPLE_CHANNELS, H, W), OBSERVED)
    visible = torch.zeros(H, W, dtype=torch.bool)
    if any_visible:
        visible[:, :2] = True
    item = {"x": x, "target_index": torch.tensor(1), "days": torch.tensor([-5.0, 0.0]), "case": torch.tensor([d, e])}
    if labelled:  # truth = the observed image: the label's error is e on the visible pixels
        item |= {"target_prob": torch.where(visible, 0.0, 1.0), "target": torch.full((13, H, W), OBSERVED)}
    else:
        item |= {"visible": visible}
    return item


@pytest.fixture
def cfg(small):
    rule = dataclasses.replace(
        small.stage3.self_training, sampler_seeds=2, max_seed_spread=SPREAD, max_visible_error=VISIBLE
    )
    return dataclasses.replace(small, stage3=dataclasses.replace(small.stage3, self_training=rule))


def test_exactly_the_confident_pseudo_labels_are_kept(cfg):
    samples = [_item(d, e, v) for d, e, v, _ in CASES]
    teacher = FakeTeacher()
    kept, scored = pseudo_label(teacher, samples, cfg, "cpu")
    assert teacher.batch_sizes == [4, 1]  # in batches of stage 3's batch size, each sample its own
    expected = [i for i, case in enumerate(CASES) if case[-1]]
    assert [index for index, _ in kept] == expected == [r["index"] for r in scored if r["kept"]]
    assert len(scored) == len(CASES)
    for (index, label), (_, e, _, _) in zip(kept, [CASES[i] for i in expected]):
        visible = samples[index]["visible"]
        assert torch.equal(label[:, visible], torch.full_like(label[:, visible], OBSERVED + e))  # seeds' mean
    assert [r["spread"] for r in scored] == pytest.approx([case[0] for case in CASES], abs=1e-6)
    assert scored[4]["visible_error"] == math.inf


def test_more_seeds_same_rule(cfg):
    three = dataclasses.replace(
        cfg,
        stage3=dataclasses.replace(
            cfg.stage3, self_training=dataclasses.replace(cfg.stage3.self_training, sampler_seeds=3)
        ),
    )
    # seeds +d, -d, +d: mean d/3, spread (2d/3 + 4d/3 + 2d/3) / 3 = 8d/9
    kept, scored = pseudo_label(FakeTeacher(), [_item(0.03125, 0.0, True)], three, "cpu")
    assert scored[0]["spread"] == pytest.approx(8 * 0.03125 / 9, rel=1e-5) and not kept


def test_confidence_measures_spread_and_visible_error_by_hand():
    draws = torch.stack([torch.full((13, 2, 2), 0.25), torch.full((13, 2, 2), 0.75)])
    observed = torch.full((13, 2, 2), 0.5)
    observed[:, 0, 0] = 0.0  # hidden pixel with a large error: not counted
    visible = torch.tensor([[False, True], [True, True]])
    label, spread, visible_error = confidence(draws, observed, visible)
    assert torch.equal(label, torch.full((13, 2, 2), 0.5))
    assert spread == 0.25 and visible_error == 0.0


def test_labelled_check_reports_kept_and_rejected_with_their_gain(cfg):
    samples = [_item(d, e, v, labelled=True) for d, e, v, _ in CASES[:4]]
    report = check_on_labelled(FakeTeacher(), samples, cfg, "cpu")
    assert report["kept"]["samples"] == 2 and report["rejected"]["samples"] == 2
    # the draft is the observed image = the truth here: labels can only lose
    assert report["kept"]["draft_psnr"] == report["rejected"]["draft_psnr"] > 60
    assert report["kept"]["gain_db"] < 0 and report["rejected"]["gain_db"] < 0
    assert report["kept"]["label_psnr"] > report["rejected"]["label_psnr"]  # the rule keeps the better labels

"""train/stages.py: the stage-3 pseudo-label acceptance rule, with a teacher whose answers are known.

The rule (stages.SELF_TRAINING_RULE): a sample is kept when the mean |seed_i - mean| of the
teacher's draws is at most stage3.self_training.max_seed_spread and the mean |label - input|
over the pixels the cloud mask calls clear is at most ...max_visible_error; the label is the
mean of the draws. The fake teacher below draws label +- spread (two seeds), so both numbers
are exact in float32 and the kept set is known in advance.
"""

import dataclasses

import pytest
import torch
from torch import nn

from vcloud.constants import S2_BANDS, S2_CHANNELS, SAMPLE_CHANNELS
from vcloud.train import stages

T, H, W = 3, 4, 4
SPREAD = 2.0**-6  # the configured max_seed_spread: exactly representable
ERROR = 2.0**-4  # the configured max_visible_error

# name: (seed spread, error on visible pixels, error on cloudy pixels, visible pixels)
CASES = {
    "confident": (2.0**-8, 2.0**-6, 0.0, "half"),
    "spread_at_the_limit": (SPREAD, 2.0**-6, 0.0, "half"),  # <= keeps it
    "spread_too_high": (2 * SPREAD, 0.0, 0.0, "half"),
    "error_at_the_limit": (0.0, ERROR, 0.0, "half"),
    "visible_error_too_high": (0.0, 2 * ERROR, 0.0, "half"),
    "error_only_under_the_cloud": (0.0, 0.0, 0.5, "half"),  # cloudy pixels do not count
    "nothing_visible": (0.0, 0.0, 0.0, "none"),  # no evidence: never kept
}
KEPT = ["confident", "spread_at_the_limit", "error_at_the_limit", "error_only_under_the_cloud"]


def _observed(index: int) -> torch.Tensor:
    return torch.full((len(S2_BANDS), H, W), 0.25 + index / 64)  # (13, H, W), exact in float32


class FakeSamples:
    """UnlabelledSamples' items: x with the target date's S2 at S2_CHANNELS, and `visible`."""

    def __len__(self):
        return len(CASES)

    def __getitem__(self, index):
        target_index = 1
        x = torch.zeros(T, SAMPLE_CHANNELS, H, W)
        x[target_index, S2_CHANNELS] = _observed(index)
        visible = torch.zeros(H, W, dtype=torch.bool)
        if list(CASES.values())[index][3] == "half":
            visible[:, : W // 2] = True
        return {"x": x, "target_index": torch.tensor(target_index), "visible": visible, "location": torch.tensor(index)}


class FakeTeacher(nn.Module):
    """samples() -> per seed the case's label +- its spread: seed 0 above, seed 1 below."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def samples(self, batch, *, steps, seeds):
        indices = batch["location"].tolist()
        self.calls.append((indices, steps, tuple(seeds)))
        labels = []
        for index in indices:
            spread, visible_error, cloudy_error, _ = list(CASES.values())[index]
            label = _observed(index).clone()
            label[:, :, : W // 2] += visible_error  # the visible half (when there is one)
            label[:, :, W // 2 :] += cloudy_error
            labels.append(torch.stack([label + (spread if seed == 0 else -spread) for seed in seeds]))
        return torch.stack(labels, dim=1)  # (S, B, 13, H, W)


@pytest.fixture
def cfg(small):
    st = dataclasses.replace(
        small.stage3.self_training, sampler_seeds=2, max_seed_spread=SPREAD, max_visible_error=ERROR
    )
    return dataclasses.replace(small, stage3=dataclasses.replace(small.stage3, self_training=st))


def test_pseudo_label_keeps_exactly_the_confident_samples(cfg):
    teacher = FakeTeacher()
    kept, scored = stages.pseudo_label(teacher, FakeSamples(), cfg, "cpu")
    names = list(CASES)
    assert [names[i] for i, _ in kept] == KEPT
    assert [s["index"] for s in scored] == list(range(len(CASES)))
    assert [names[s["index"]] for s in scored if s["kept"]] == KEPT
    by_name = {names[s["index"]]: s for s in scored}
    assert by_name["spread_too_high"]["spread"] == 2 * SPREAD
    assert by_name["visible_error_too_high"]["visible_error"] == 2 * ERROR
    assert by_name["error_only_under_the_cloud"]["visible_error"] == 0.0
    assert by_name["nothing_visible"]["visible_error"] == float("inf")
    # Each batch of stage 3's batch size asked the teacher once for all its seeds, with the
    # configured number of steps.
    steps, size = cfg.stage2.model.sample_steps, cfg.stage3.train.batch_size
    everyone = list(range(len(CASES)))
    assert teacher.calls == [(everyone[i : i + size], steps, (0, 1)) for i in range(0, len(CASES), size)]


def test_a_kept_label_is_the_mean_of_the_draws(cfg):
    kept, _ = stages.pseudo_label(FakeTeacher(), FakeSamples(), cfg, "cpu")
    index, label = kept[0]
    expected = _observed(index)
    expected[:, :, : W // 2] += CASES["confident"][1]
    assert label.device.type == "cpu" and label.shape == (len(S2_BANDS), H, W)
    torch.testing.assert_close(label, expected, rtol=0, atol=0)


def test_stricter_thresholds_keep_fewer(cfg):
    st = dataclasses.replace(cfg.stage3.self_training, max_seed_spread=SPREAD / 2, max_visible_error=ERROR / 2)
    strict = dataclasses.replace(cfg, stage3=dataclasses.replace(cfg.stage3, self_training=st))
    kept, _ = stages.pseudo_label(FakeTeacher(), FakeSamples(), strict, "cpu")
    assert [list(CASES)[i] for i, _ in kept] == ["confident", "error_only_under_the_cloud"]

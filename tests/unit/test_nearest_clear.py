"""Baseline nearest_clear_date on hand-made dates."""

import torch

from vcloud.constants import CLOUD_CHANNEL, SAMPLE_CHANNELS
from vcloud.evaluation.nearest_clear import nearest_clear, nearest_clear_index


def _sample(covers, days, *, prob=0.9):
    """One sample of T dates, 1 x 20 pixels: date t has S2 value t / 10 and covers[t] * 20 cloudy pixels."""
    x = torch.zeros(1, len(covers), SAMPLE_CHANNELS, 1, 20)
    for t, cover in enumerate(covers):
        x[0, t, :13] = t / 10
        x[0, t, CLOUD_CHANNEL, 0, : round(cover * 20)] = prob
    return x, torch.tensor([days], dtype=torch.float32)


def test_picks_the_clear_date_nearest_in_time_not_the_least_cloudy():
    x, days = _sample([0.0, 0.0, 1.0, 0.5, 0.0], [-30, -10, 0, 5, 40])
    assert nearest_clear_index(x, torch.tensor([2]), days).tolist() == [1]  # 10 days away, clear
    out = nearest_clear(x, torch.tensor([2]), days)
    assert out.shape == (1, 13, 1, 20) and torch.allclose(out, torch.full_like(out, 0.1))


def test_never_copies_the_target_slot():
    x, days = _sample([0.0, 0.0, 0.0], [-20, 0, 3])
    assert nearest_clear_index(x, torch.tensor([1]), days).tolist() == [2]


def test_equal_distances_go_to_the_lower_cover_then_the_earlier_date():
    x, days = _sample([0.05, 1.0, 0.0], [-10, 0, 10])
    assert nearest_clear_index(x, torch.tensor([1]), days).tolist() == [2]
    x, days = _sample([0.0, 1.0, 0.0], [-10, 0, 10])
    assert nearest_clear_index(x, torch.tensor([1]), days).tolist() == [0]


def test_threshold_decides_what_counts_as_clear():
    x, days = _sample([0.0, 0.1, 1.0], [-50, -5, 0])
    assert nearest_clear_index(x, torch.tensor([2]), days).tolist() == [0]  # 0.1 > 0.05: not clear
    assert nearest_clear_index(x, torch.tensor([2]), days, clear_max_cover=0.1).tolist() == [1]


def test_falls_back_to_the_least_cloudy_date():
    x, days = _sample([0.5, 1.0, 0.3, 0.6], [-5, 0, 30, 2])
    assert nearest_clear_index(x, torch.tensor([1]), days).tolist() == [2]  # lowest mean probability
    x[0, 2, CLOUD_CHANNEL] += 0.5  # now date 2's mean probability is the highest of the others
    assert nearest_clear_index(x, torch.tensor([1]), days).tolist() == [0]


def test_each_sample_of_a_batch_decides_alone():
    a, days_a = _sample([0.0, 0.0, 1.0, 0.5, 0.0], [-30, -10, 0, 5, 40])
    b, days_b = _sample([0.5, 1.0, 0.3, 0.6, 0.9], [-5, 0, 30, 2, 60])
    x, days = torch.cat([a, b]), torch.cat([days_a, days_b])
    assert nearest_clear_index(x, torch.tensor([2, 1]), days).tolist() == [1, 2]

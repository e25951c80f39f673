import torch

from vcloud.constants import CLOUD_CHANNEL, SAMPLE_CHANNELS
from vcloud.evaluation.baselines import least_cloudy, median_mosaic


def stack_sample(values, probs):
    """Dates with constant S2 value and cloud probability: (1, T, C, 2, 2)."""
    x = torch.zeros(1, len(values), SAMPLE_CHANNELS, 2, 2)
    for t, (v, p) in enumerate(zip(values, probs)):
        x[0, t, :13] = v
        x[0, t, CLOUD_CHANNEL] = p
    return x


def test_least_cloudy_skips_the_target_and_picks_the_clearest():
    x = stack_sample([0.1, 0.2, 0.3, 0.4], [0.9, 0.0, 0.5, 0.1])
    out = least_cloudy(x, torch.tensor([1]))  # date 1 is the target (clearest but excluded)
    assert torch.allclose(out, torch.full((1, 13, 2, 2), 0.4))


def test_median_mosaic_uses_clear_pixels_of_other_dates():
    x = stack_sample([0.1, 0.2, 0.3, 0.9, 0.5], [0.0, 0.0, 0.0, 0.0, 0.9])
    x[0, 1, CLOUD_CHANNEL, 0, 0] = 0.9  # date 1 cloudy at pixel (0, 0)
    out = median_mosaic(x, torch.tensor([3]))  # target 0.9 excluded; date 4 cloudy everywhere
    assert torch.allclose(out[0, :, 1, 1], torch.full((13,), 0.2))  # median of 0.1, 0.2, 0.3
    assert torch.allclose(out[0, :, 0, 0], torch.full((13,), 0.1))  # nanmedian of 0.1, 0.3 (lower)


def test_median_mosaic_falls_back_to_all_other_dates_when_none_is_clear():
    x = stack_sample([0.1, 0.2, 0.3], [0.9, 0.9, 0.9])
    out = median_mosaic(x, torch.tensor([0]))
    assert torch.allclose(out, torch.full((1, 13, 2, 2), 0.2))  # nanmedian(0.2, 0.3) = 0.2

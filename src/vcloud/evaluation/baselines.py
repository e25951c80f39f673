"""Reference baselines on the same samples as the models (S2 0..1 scale).

- least_cloudy: the input date (other than the target) with the lowest mean cloud probability.
- median_mosaic: per pixel, the temporal median of the other dates' cloud-free pixels (cloud
  probability below the s2cloudless threshold); where no date is clear, the median of all.
"""

from __future__ import annotations

import torch

from vcloud.constants import CLOUD_CHANNEL, S2_CHANNELS, S2CLOUDLESS_KWARGS

CLEAR_BELOW = S2CLOUDLESS_KWARGS["threshold"]


def _others(x: torch.Tensor, target_index: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: every date but the target."""
    dates = torch.arange(x.shape[1], device=x.device)[None]
    return dates != target_index[:, None]


def least_cloudy(x: torch.Tensor, target_index: torch.Tensor) -> torch.Tensor:
    """x (B, T, C, H, W) -> (B, 13, H, W): the clearest other date's S2."""
    cover = x[:, :, CLOUD_CHANNEL].mean(dim=(-2, -1))  # (B, T) mean cloud probability
    cover = cover.masked_fill(~_others(x, target_index), float("inf"))
    best = cover.argmin(dim=1)  # (B,)
    return x[torch.arange(len(x)), best, S2_CHANNELS]


def median_mosaic(x: torch.Tensor, target_index: torch.Tensor) -> torch.Tensor:
    """x (B, T, C, H, W) -> (B, 13, H, W): per-pixel median of the other dates' clear pixels."""
    s2 = x[:, :, S2_CHANNELS]  # (B, T, 13, H, W)
    others = _others(x, target_index)[:, :, None, None]  # (B, T, 1, 1)
    clear = (x[:, :, CLOUD_CHANNEL] < CLEAR_BELOW) & others  # (B, T, H, W)
    any_clear = clear.any(dim=1, keepdim=True)  # (B, 1, H, W)
    use = torch.where(any_clear, clear, others.expand_as(clear))  # fall back to every other date
    values = s2.masked_fill(~use[:, :, None], float("nan"))
    return torch.nanmedian(values, dim=1).values.nan_to_num(0.0)

"""Baseline `nearest_clear_date`: the clear input date nearest in time to the target.

Among the input dates other than the target slot, the clear ones (cloud cover at most
`clear_max_cover`, cover = the fraction of pixels whose cloud probability reaches the
s2cloudless threshold) are candidates; the one nearest in time to the target wins, equal
distances going to the lower cover, then to the earlier date. When no other date is clear,
the least-cloudy date (lowest mean cloud probability, as the least_cloudy_date baseline).

Least-cloudy ignores time, so on a changing scene (crops, snow, floods) a clear date months
away beats a nearly clear one next week; this baseline asks what "copy the nearest clear
date" - what a user does by hand - is worth.
"""

from __future__ import annotations

import torch

from vcloud.constants import CLOUD_CHANNEL, S2_CHANNELS, S2CLOUDLESS_KWARGS

CLOUDY_FROM = S2CLOUDLESS_KWARGS["threshold"]


def nearest_clear(
    x: torch.Tensor, target_index: torch.Tensor, days: torch.Tensor, *, clear_max_cover: float = 0.05
) -> torch.Tensor:
    """x (B, T, C, H, W), target_index (B,), days (B, T) offsets from the target -> (B, 13, H, W)."""
    chosen = nearest_clear_index(x, target_index, days, clear_max_cover=clear_max_cover)
    return x[torch.arange(len(x)), chosen, S2_CHANNELS]


def nearest_clear_index(
    x: torch.Tensor, target_index: torch.Tensor, days: torch.Tensor, *, clear_max_cover: float = 0.05
) -> torch.Tensor:
    """(B,) the date each sample copies."""
    prob = x[:, :, CLOUD_CHANNEL]  # (B, T, H, W)
    cover = (prob >= CLOUDY_FROM).float().mean(dim=(-2, -1))  # (B, T) cloudy fraction
    slots = torch.arange(x.shape[1], device=x.device)[None]  # (1, T)
    others = slots != target_index.to(x.device)[:, None]  # (B, T)
    clear = others & (cover <= clear_max_cover)
    distance = days.to(x.device).abs().masked_fill(~clear, float("inf"))  # (B, T)
    nearest = distance == distance.min(dim=1, keepdim=True).values  # ties in time (inf rows: all)
    tie_cover = cover.masked_fill(~(nearest & clear), float("inf"))
    chosen = tie_cover.argmin(dim=1)  # lowest cover among the nearest; argmin takes the earliest
    least_cloudy = prob.mean(dim=(-2, -1)).masked_fill(~others, float("inf")).argmin(dim=1)
    return torch.where(clear.any(dim=1), chosen, least_cloudy)

"""Optimizer and learning-rate schedule of every stage: AdamW, linear warmup, cosine decay.

The schedule is a function of the optimizer step alone, so a resumed run (optimizer and
scheduler state from latest.pt) continues on the same curve as an uninterrupted one. The
factor is a plain function (a closure), not a callable object: LambdaLR then keeps it out of
its state_dict, which holds only numbers and so loads with torch.load(weights_only=True).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from vcloud.config import TrainConfig

WARMUP_DIVISOR = 20  # the warmup takes the first 1/20 of the steps (at least one)


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable `params` with the stage's lr and weight decay."""
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def warmup_cosine(total_steps: int) -> Callable[[int], float]:
    """lr factor of step s (0-based) for `total_steps` steps in all.

    min(1, (s + 1) / warmup) * (1 + cos(pi * min(s, total) / total)) / 2 with
    warmup = max(1, total // 20): linear up to the full lr, then a cosine down to 0 at the
    last step; steps past the total stay at 0.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps: {total_steps}; a schedule needs at least one step")
    total = total_steps
    warmup = max(1, total // WARMUP_DIVISOR)

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, *, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The warmup-cosine schedule (`warmup_cosine`), stepped once per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(total_steps))

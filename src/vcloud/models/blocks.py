"""Building blocks shared by the stage models: norms, residual blocks, resampling, embeddings.

Precision under autocast. CUDA autocast runs group_norm and layer_norm in fp32, CPU autocast
does not, so a conv -> norm -> SiLU chain would store fp32 copies of bf16 activations on the
GPU but not on the laptop. The norms here always run in the dtype of their input (the
kernels accumulate statistics in fp32 either way), so the tensors saved for backward have
the same dtypes on both devices and a memory estimate made on the CPU holds on the GPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def num_groups(channels: int, *, groups: int = 8) -> int:
    """Largest group count <= `groups` that divides `channels`."""
    return math.gcd(groups, channels)


class GroupNorm(nn.GroupNorm):
    """GroupNorm that keeps the activation dtype under autocast (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None or x.dtype == self.weight.dtype:
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return F.group_norm(x, self.num_groups, self.weight.to(x.dtype), self.bias.to(x.dtype), self.eps)


class LayerNorm(nn.LayerNorm):
    """LayerNorm that keeps the activation dtype under autocast (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is None or x.dtype == self.weight.dtype:
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x, self.normalized_shape, self.weight.to(x.dtype), self.bias.to(x.dtype), self.eps)


def norm(channels: int, *, groups: int = 8) -> GroupNorm:
    return GroupNorm(num_groups(channels, groups=groups), channels)


class ResBlock(nn.Module):
    """x + conv(SiLU(norm(conv(SiLU(norm(x)))))), with an optional per-sample embedding.

    `emb_dim` adds a projected embedding (diffusion time) between the two convolutions.
    """

    def __init__(
        self,
        dim: int,
        dim_out: int | None = None,
        *,
        emb_dim: int | None = None,
        groups: int = 8,
    ) -> None:
        super().__init__()
        dim_out = dim if dim_out is None else dim_out
        self.norm1 = norm(dim, groups=groups)
        self.conv1 = nn.Conv2d(dim, dim_out, 3, padding=1)
        self.emb = nn.Linear(emb_dim, dim_out) if emb_dim is not None else None
        self.norm2 = norm(dim_out, groups=groups)
        self.conv2 = nn.Conv2d(dim_out, dim_out, 3, padding=1)
        self.skip = nn.Conv2d(dim, dim_out, 1) if dim != dim_out else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor | None = None) -> torch.Tensor:
        # x (B, C, H, W), emb (B, E) -> (B, C_out, H, W)
        h = self.conv1(F.silu(self.norm1(x)))
        if self.emb is not None:
            assert emb is not None, "this block needs an embedding"
            h = h + self.emb(F.silu(emb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class Downsample(nn.Module):
    """Strided 3x3 convolution: (B, C, H, W) -> (B, C_out, H/2, W/2)."""

    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(dim, dim_out, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[-2] % 2 == 0 and x.shape[-1] % 2 == 0, f"odd size {tuple(x.shape[-2:])}"
        return self.conv(x)


class Upsample(nn.Module):
    """Nearest x2 then 3x3 convolution: (B, C, H, W) -> (B, C_out, 2H, 2W)."""

    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(dim, dim_out, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def output_head(dim: int, dim_out: int) -> nn.Sequential:
    """norm -> SiLU -> 3x3 conv to the output channels."""
    return nn.Sequential(norm(dim), nn.SiLU(), nn.Conv2d(dim, dim_out, 3, padding=1))


def sinusoidal_embedding(values: torch.Tensor, dim: int, *, max_period: float = 10000.0) -> torch.Tensor:
    """(...,) float values -> (..., dim) fp32 sin/cos features at geometric frequencies."""
    assert dim % 2 == 0, f"embedding dim must be even, got {dim}"
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, device=values.device, dtype=torch.float32) / half
    )  # (half,)
    args = values.float()[..., None] * freqs  # (..., half)
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)  # (..., dim)


def maybe_checkpoint(fn, *args: torch.Tensor, enabled: bool):
    """fn(*args), recomputed in backward instead of storing its activations when enabled.

    Non-reentrant checkpointing (works with autocast and unused outputs). The models use
    no randomness, so the RNG state is not saved and restored.
    """
    if enabled and torch.is_grad_enabled():
        return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)
    return fn(*args)

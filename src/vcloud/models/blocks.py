"""Building blocks shared by the stage models: norms, residual blocks, resampling, embeddings.

Padding. Every spatial convolution pads by repeating the edge pixels (`ReplicateConv2d`), not
with zeros. A zero border is a step that a learned kernel answers wherever it reaches past the
image, and kernels that look one way (the data has shadows north of their clouds) answer it on
one side only: with zeros, the trained small models erred about twice as much in the top 4 rows
of every patch as inside (docs/patch-edges.md). With repeated edges a constant image stays
constant through every stage, whatever the weights (tests/unit/test_patch_edges.py).

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


class _ReplicatePad(torch.autograd.Function):
    """F.pad(mode="replicate") whose backward needs no saved tensor (module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, ph: int, pw: int) -> torch.Tensor:
        ctx.pads = (ph, pw)
        return F.pad(x, (pw, pw, ph, ph), mode="replicate")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ph, pw = ctx.pads  # each repeated row (column) gives its gradient back to the edge it repeats
        if ph:
            folded = grad[..., ph:-ph, :].clone()
            folded[..., :1, :] += grad[..., :ph, :].sum(-2, keepdim=True)
            folded[..., -1:, :] += grad[..., -ph:, :].sum(-2, keepdim=True)
            grad = folded
        if pw:
            folded = grad[..., pw:-pw].clone()
            folded[..., :1] += grad[..., :pw].sum(-1, keepdim=True)
            folded[..., -1:] += grad[..., -pw:].sum(-1, keepdim=True)
            grad = folded
        return grad, None, None


def replicate_pad(x: torch.Tensor, padding: tuple[int, int]) -> torch.Tensor:
    """(B, C, H, W) -> (B, C, H + 2 ph, W + 2 pw), the edge rows and columns repeated.

    The values of F.pad(mode="replicate") in one allocation, but nothing kept for backward:
    replication_pad2d keeps its input, so a padded convolution would store its activation twice
    (the convolution keeps the padded copy for its weight gradient).
    """
    ph, pw = padding
    return _ReplicatePad.apply(x, ph, pw) if ph or pw else x


class ReplicateConv2d(nn.Conv2d):
    """nn.Conv2d padded with repeated edge pixels (see the module docstring); same parameters
    and state dict as nn.Conv2d, so only the border arithmetic differs."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        assert isinstance(self.padding, tuple), f"numeric padding only, got {self.padding!r}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if any(self.padding):
            x = replicate_pad(x, self.padding)
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


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
        self.conv1 = ReplicateConv2d(dim, dim_out, 3, padding=1)
        self.emb = nn.Linear(emb_dim, dim_out) if emb_dim is not None else None
        self.norm2 = norm(dim_out, groups=groups)
        self.conv2 = ReplicateConv2d(dim_out, dim_out, 3, padding=1)
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
        self.conv = ReplicateConv2d(dim, dim_out, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[-2] % 2 == 0 and x.shape[-1] % 2 == 0, f"odd size {tuple(x.shape[-2:])}"
        return self.conv(x)


class Upsample(nn.Module):
    """Nearest x2 then 3x3 convolution: (B, C, H, W) -> (B, C_out, 2H, 2W)."""

    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        self.conv = ReplicateConv2d(dim, dim_out, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def output_head(dim: int, dim_out: int) -> nn.Sequential:
    """norm -> SiLU -> 3x3 conv to the output channels."""
    return nn.Sequential(norm(dim), nn.SiLU(), ReplicateConv2d(dim, dim_out, 3, padding=1))


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

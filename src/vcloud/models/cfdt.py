"""Stage 1: the cloud-free draft transformer (CFDT) over T dates of S2 + S1 + S1 validity + cloud
probability (constants: a date without S1 has zeros there and 0 in its validity channel, which the
stem and the gate see like any other input; trained with S1 removed at random, data.s1_dropout).

    gate = ChangeGate(x)                          (B, T, 1, H, W), one smooth map per date
    coarsest, levels = DateEncoder(x)             (B, T, C3, H/8, W/8) for every date, and
                                                  the target date's levels 0..2 only
    fused = TMT(coarsest * gate, days)            (B, C3, H/8, W/8) at the target date
    fused = WindScanMixing(fused, sectors)        if wind_scan
    draft = clear_composite(x, gate logits)       (B, 13, H, W) clear-sky prior, per-date weights
            + DraftDecoder(fused, levels * gate[target])    learned correction

Change gate. For every ordered pair (i, j), i != j, of one sample's dates a small CNN on the
concatenated per-date gate features gives a score map c_ij, "date j is reliable seen from
date i". Date j's gate is sigmoid(mean_i c_ij + c_target,j) (the second term is 0 for the
target itself): the consensus term flags what is transient (clouds, shadows), the target
term what differs from the target. We use all T(T-1) ordered pairs (240 at T=16), not only
the T-1 (target, other) pairs, because the consensus term needs them. The gate scales each
date's coarsest tokens before the TMT and the target's skip features before the decoder, and
its logits are added to the clear-sky prior's log weights: the prior is learned per date.

Memory optimisations (`Optimisations`; bf16 autocast is applied by the caller):
    grad_checkpoint      per-date encoder calls, the gate embedding and each gate chunk
                         are recomputed in backward instead of stored. (Without it the
                         encoder runs on all dates in one batched call.)
    gate_resolution      the gate is computed at this size (antialiased bilinear down) and
                         bilinearly upsampled back; it is a smooth map.
    target_only_pyramid  only the target date's levels 0..2 are kept as the encoder runs;
                         other dates keep their coarsest level. Same output; it matters
                         together with grad_checkpoint, when the encoder outputs are all
                         that is held of the encoder.
    gate_chunk           date pairs go through the gate CNN this many at a time. Same
                         output and same bytes saved for backward; it bounds the working
                         set of the gate (and of its recomputation under grad_checkpoint).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from vcloud.config import CFDTConfig, Optimisations
from vcloud.constants import CLOUD_CHANNEL, OUTPUT_CHANNELS, S2_CHANNELS, S2CLOUDLESS_KWARGS, SAMPLE_CHANNELS
from vcloud.models.blocks import (
    Downsample,
    LayerNorm,
    ReplicateConv2d,
    ResBlock,
    Upsample,
    maybe_checkpoint,
    output_head,
    replicate_pad,
    sinusoidal_embedding,
)
from vcloud.models.grid import token_stride
from vcloud.models.wind_scan import WindScanMixing

LEVELS = 4  # pyramid levels; the coarsest is H/8 x W/8
CLEAR_BELOW = S2CLOUDLESS_KWARGS["threshold"]  # the clear prior: a pixel is clear below this probability
# Clear-sky prior (clear_composite): weight (1 - date cloudiness)^8 * (1 - pixel probability)^1.
# Untrained, on the default run's 108 fixed-protocol samples: 34.1 dB; date term alone 33.2 (a
# sharpness of 16: 33.3), the least-cloudy date 33.1. Probabilities are capped at 1 - PRIOR_FLOOR
# so that an all-cloudy sample still averages its dates.
PRIOR_DATE_SHARPNESS = 8.0
PRIOR_PIXEL_SHARPNESS = 1.0
PRIOR_FLOOR = 1e-3
GATE_LOGIT_ONE_DATE = 20.0  # a single date's gate logit: sigmoid(20) is 1 in float32


class PyramidEncoder(nn.Module):
    """One date: (N, C_in, H, W) -> LEVELS maps (N, widths[l], H / 2**l, W / 2**l)."""

    def __init__(self, in_channels: int, widths: tuple[int, ...], *, blocks_per_level: int) -> None:
        super().__init__()
        self.stem = ReplicateConv2d(in_channels, widths[0], 3, padding=1)
        self.levels = nn.ModuleList()
        for level, width in enumerate(widths):
            layers: list[nn.Module] = [Downsample(widths[level - 1], width)] if level else []
            layers += [ResBlock(width) for _ in range(blocks_per_level)]
            self.levels.append(nn.Sequential(*layers))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.stem(x)  # (N, w0, H, W)
        features = []
        for level in self.levels:
            h = level(h)  # (N, w_l, H / 2**l, W / 2**l)
            features.append(h)
        return tuple(features)


class DateEncoder(nn.Module):
    """Run the shared PyramidEncoder over the T dates (one date at a time when checkpointing).

    forward(x (B, T, C, H, W), target_index (B,)) -> coarsest (B, T, C3, H/8, W/8) and the
    target date's levels 0..LEVELS-2, each (B, w_l, H / 2**l, W / 2**l).
    """

    def __init__(self, in_channels: int, widths: tuple[int, ...], *, blocks_per_level: int) -> None:
        super().__init__()
        self.pyramid = PyramidEncoder(in_channels, widths, blocks_per_level=blocks_per_level)

    def forward(
        self,
        x: torch.Tensor,
        target_index: torch.Tensor,
        *,
        checkpointing: bool = False,
        target_only: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        b, t = x.shape[:2]
        rows = torch.arange(b, device=x.device)
        if not (checkpointing and torch.is_grad_enabled()):
            # Every date's activations are kept for backward anyway (or none is), so one
            # batched call (fewer, larger kernels) stores the same; target_only is moot.
            levels = self.pyramid(rearrange(x, "b t c h w -> (b t) c h w"))
            levels = [rearrange(f, "(b t) c h w -> b t c h w", b=b) for f in levels]
            return levels[-1], [f[rows, target_index] for f in levels[:-1]]
        coarsest = []
        target: list[torch.Tensor] = []  # target_only: running selection of the target's levels
        pyramids = []  # otherwise: every date's whole pyramid
        for date in range(t):
            levels = maybe_checkpoint(self.pyramid, x[:, date], enabled=True)
            coarsest.append(levels[-1])  # (B, C3, h, w)
            if not target_only:
                pyramids.append(levels)
            elif not target:
                target = list(levels[:-1])
            else:
                is_target = (target_index == date).view(b, 1, 1, 1)
                target = [torch.where(is_target, f, kept) for f, kept in zip(levels[:-1], target)]
            del levels
        if not target_only:
            stacked = (torch.stack([p[level] for p in pyramids], dim=1) for level in range(LEVELS - 1))
            target = [levels[rows, target_index] for levels in stacked]  # (B, w_l, H_l, W_l)
        return torch.stack(coarsest, dim=1), target  # (B, T, C3, h, w), [(B, w_l, H_l, W_l)]


class ChangeGate(nn.Module):
    """Per-date reliability gate from all ordered date pairs (see the module docstring).

    forward(x (B, T, C, H, W), target_index (B,)) -> gate (B, T, 1, H, W) in (0, 1).

    No normalisation layers: GroupNorm would tie every pixel to whole-image statistics,
    which change with the resolution, and a gate computed at reduced resolution should
    approximate the full-resolution one where the inputs are smooth. Edges are padded by
    repetition like every convolution here (blocks.replicate_pad, which keeps nothing for
    backward: F.pad's replication_pad2d would keep its input, storing each pair twice).
    """

    def __init__(self, in_channels: int, *, width: int, layers: int = 2) -> None:
        super().__init__()
        assert layers >= 1, f"gate needs at least one hidden layer, got {layers}"
        self.embed = nn.Sequential(ReplicateConv2d(in_channels, width, 3, padding=1), nn.SiLU())
        cnn: list[nn.Module] = []
        for layer in range(layers):
            cnn += [ReplicateConv2d(2 * width if layer == 0 else width, width, 3, padding=1), nn.SiLU()]
        cnn.append(nn.Conv2d(width, 1, 1))
        self.pair_cnn = nn.Sequential(*cnn)

    def pair_halves(self, features: torch.Tensor) -> torch.Tensor:
        """The pair CNN's first convolution, split by date: (B*T, G, h, w) -> (B*T, 2W, h, w).

        That convolution is linear in its input, the pair [f_i, f_j] stacked on channels, so it
        is conv_first(f_i) + conv_second(f_j) with its weight split in two: each date's two
        halves are computed once, not once per pair (T-1 times). Channels 0..W-1 hold the
        first-of-pair half with the bias, W..2W-1 the second-of-pair half.
        """
        conv = self.pair_cnn[0]
        g = features.shape[1]
        weight = torch.cat([conv.weight[:, :g], conv.weight[:, g:]])  # (2W, G, k, k)
        bias = torch.cat([conv.bias, torch.zeros_like(conv.bias)])
        return F.conv2d(replicate_pad(features, conv.padding), weight, bias)  # padded as the conv pads

    def pair_scores(self, halves: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        # halves (B*T, 2W, h, w) from pair_halves; first, second (P,) rows -> (P, 1, h, w)
        w = halves.shape[1] // 2
        hidden = halves[:, :w].index_select(0, first) + halves[:, w:].index_select(0, second)
        return self.pair_cnn[1:](hidden)  # the first convolution's output is `hidden`

    def forward(
        self,
        x: torch.Tensor,
        target_index: torch.Tensor,
        *,
        resolution: int | None = None,
        chunk: int | None = None,
        checkpointing: bool = False,
        logits: bool = False,
    ) -> torch.Tensor:
        """The gate, or with `logits` its logits (the clear-sky composite adds them to its prior)."""
        b, t, _, height, width = x.shape
        if t == 1:
            ones = x.new_ones(b, 1, 1, height, width)
            return ones * GATE_LOGIT_ONE_DATE if logits else ones
        flat = rearrange(x, "b t c h w -> (b t) c h w")
        size = (height, width)
        if resolution is not None and (height > resolution or width > resolution):
            size = (min(height, resolution), min(width, resolution))
            flat = F.interpolate(flat, size=size, mode="bilinear", align_corners=False, antialias=True)
        features = maybe_checkpoint(self.embed, flat, enabled=checkpointing)  # (B*T, G, h, w)
        halves = self.pair_halves(features)  # (B*T, 2W, h, w)

        # Ordered pairs (i, j), i != j, row-major per sample: k -> i = k // (T-1), j skips i.
        k = torch.arange(t * (t - 1), device=x.device)
        i, r = k // (t - 1), k % (t - 1)
        j = r + (r >= i).long()
        base = (torch.arange(b, device=x.device) * t)[:, None]  # (B, 1)
        first, second = (base + i).flatten(), (base + j).flatten()  # (P,) with P = B*T*(T-1)
        step = chunk or first.numel()
        scores = torch.cat(
            [
                maybe_checkpoint(
                    self.pair_scores,
                    halves,
                    first[s : s + step],
                    second[s : s + step],
                    enabled=checkpointing,
                )
                for s in range(0, first.numel(), step)
            ]
        )  # (P, 1, h, w)

        # Dense (B, T, T) score maps with a zero diagonal: slot 0 of `padded` is the zero.
        scores = rearrange(scores, "(b p) 1 h w -> b p h w", b=b)  # (B, T*(T-1), h, w)
        padded = torch.cat([torch.zeros_like(scores[:, :1]), scores], dim=1)
        ii, jj = torch.meshgrid(torch.arange(t, device=x.device), torch.arange(t, device=x.device), indexing="ij")
        pair_slot = 1 + ii * (t - 1) + jj - (jj > ii).long()  # 1 + index of (i, j) in the pairs
        slot = torch.where(ii == jj, 0, pair_slot).flatten()  # (T*T,)
        dense = padded.index_select(1, slot).view(b, t, t, *size)  # (B, T_i, T_j, h, w)
        consensus = dense.mean(dim=1) * (t / (t - 1))  # (B, T, h, w) mean over i != j
        relative = dense[torch.arange(b, device=x.device), target_index]  # (B, T, h, w)
        score = consensus + relative  # (B, T, h, w) logits
        if size != (height, width):
            score = F.interpolate(score, size=(height, width), mode="bilinear", align_corners=False)
        return score[:, :, None] if logits else torch.sigmoid(score)[:, :, None]  # (B, T, 1, H, W)


class TransformerLayer(nn.Module):
    """Pre-norm self-attention + MLP over a short sequence: (N, T, C) -> (N, T, C)."""

    def __init__(self, dim: int, *, heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        assert dim % heads == 0, f"dim {dim} is not divisible by {heads} heads"
        self.heads = heads
        hidden = int(dim * mlp_ratio)
        self.norm1 = LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        q, k, v = rearrange(self.qkv(self.norm1(seq)), "n t (three h d) -> three n h t d", three=3, h=self.heads)
        attended = F.scaled_dot_product_attention(q, k, v)  # (N, heads, T, d)
        seq = seq + self.proj(rearrange(attended, "n h t d -> n t (h d)"))
        return seq + self.mlp(self.norm2(seq))


class TemporalTransformer(nn.Module):
    """TMT: attention across the T dates at every coarsest-level position.

    forward(tokens (B, T, C, h, w), gate (B, T, 1, H, W), days (B, T), target_index (B,))
    -> the target date's fused tokens (B, h*w, C).
    """

    def __init__(self, dim: int, *, layers: int, heads: int, day_embedding: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.day_embedding = day_embedding
        self.day_mlp = nn.Sequential(nn.Linear(day_embedding, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.layers = nn.ModuleList(TransformerLayer(dim, heads=heads, mlp_ratio=mlp_ratio) for _ in range(layers))
        self.norm = LayerNorm(dim)

    def forward(
        self,
        tokens: torch.Tensor,
        gate: torch.Tensor,
        days: torch.Tensor,
        target_index: torch.Tensor,
    ) -> torch.Tensor:
        b, t, _, h, w = tokens.shape
        gate = F.adaptive_avg_pool2d(gate.flatten(0, 1), (h, w)).view(b, t, 1, h, w)
        days = sinusoidal_embedding(days, self.day_embedding, max_period=1000.0)  # (B, T, E)
        emb = self.day_mlp(days).to(tokens.dtype)  # (B, T, C)
        gated = tokens * gate.to(tokens.dtype)  # (B, T, C, h, w)
        seq = rearrange(gated, "b t c h w -> b (h w) t c") + emb[:, None]  # (B, h*w, T, C)
        seq = rearrange(seq, "b n t c -> (b n) t c")  # (B*h*w, T, C)
        for layer in self.layers:
            seq = layer(seq)
        seq = rearrange(seq, "(b n) t c -> b n t c", b=b)
        return self.norm(seq[torch.arange(b, device=seq.device), :, target_index])  # (B, h*w, C)


class DraftDecoder(nn.Module):
    """Coarsest fused map up to full resolution, with the target date's gated skips.

    forward(fused (B, C3, h, w), skips [(B, w_l, H_l, W_l)] for l = 0..2, gate (B, 1, H, W))
    -> (B, out_channels, H, W).
    """

    def __init__(self, widths: tuple[int, ...], out_channels: int, *, blocks_per_level: int) -> None:
        super().__init__()
        self.bottom = nn.Sequential(*[ResBlock(widths[-1]) for _ in range(blocks_per_level)])
        self.ups = nn.ModuleList()
        self.fuse = nn.ModuleList()
        for level in reversed(range(len(widths) - 1)):
            width = widths[level]
            self.ups.append(Upsample(widths[level + 1], width))
            blocks = [ResBlock(2 * width, width)] + [ResBlock(width) for _ in range(blocks_per_level - 1)]
            self.fuse.append(nn.Sequential(*blocks))
        self.head = output_head(widths[0], out_channels)

    def forward(self, fused: torch.Tensor, skips: list[torch.Tensor], gate: torch.Tensor) -> torch.Tensor:
        h = self.bottom(fused)  # (B, C3, h, w)
        for up, fuse, skip in zip(self.ups, self.fuse, reversed(skips)):
            h = up(h)  # (B, w_l, H_l, W_l)
            g = F.adaptive_avg_pool2d(gate, skip.shape[-2:]).to(skip.dtype)  # (B, 1, H_l, W_l)
            h = fuse(torch.cat([h, skip * g], dim=1))
        return self.head(h)  # (B, out, H, W)


class CFDT(nn.Module):
    """forward(x (B, T, C, H, W), days (B, T), target_index (B,), sectors (B,) | None) -> draft.

    The draft is (B, out_channels = 13, H, W). `days` are float day offsets from the target
    date; `sectors` index the wind scan orders installed with `set_wind_orders` (-1 or None:
    no reordering; ignored without wind_scan). `optimisations` is read at every forward and
    may be replaced to switch optimisations on a built model.
    """

    def __init__(
        self, cfg: CFDTConfig, *, in_channels: int = SAMPLE_CHANNELS, out_channels: int = OUTPUT_CHANNELS
    ) -> None:
        super().__init__()
        widths = tuple(cfg.widths)
        assert len(widths) == LEVELS, f"CFDT needs {LEVELS} widths, got {widths}"
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.downsample = token_stride(widths)
        self.optimisations: Optimisations = cfg.optimisations
        self.gate = ChangeGate(in_channels, width=cfg.gate_width, layers=cfg.gate_layers)
        self.encoder = DateEncoder(in_channels, widths, blocks_per_level=cfg.blocks_per_level)
        self.tmt = TemporalTransformer(
            widths[-1],
            layers=cfg.tmt_layers,
            heads=cfg.tmt_heads,
            day_embedding=cfg.day_embedding,
            mlp_ratio=cfg.tmt_mlp_ratio,
        )
        self.wind = WindScanMixing(widths[-1]) if cfg.wind_scan else None
        self.prior = cfg.prior
        self.decoder = DraftDecoder(widths, out_channels, blocks_per_level=cfg.blocks_per_level)
        # The decoder predicts a correction of the clear-sky composite: start it small, so an
        # untrained draft is already the composite rather than noise.
        with torch.no_grad():
            self.decoder.head[-1].weight.mul_(0.1)
            self.decoder.head[-1].bias.zero_()

    @torch.no_grad()
    def start_from_composite(self) -> None:
        """Zero the change gate's and the decoder's last layers: the draft is then exactly
        clear_composite(x) (no learned date logits, no correction) until training moves them."""
        for layer in (self.gate.pair_cnn[-1], self.decoder.head[-1]):
            layer.weight.zero_()
            layer.bias.zero_()

    @torch.no_grad()
    def start_from_autoencoder(self, autoencoder: dict[str, torch.Tensor]) -> int:
        """Copy a stage-0 autoencoder's first level (its stem's weights, the S2 input channels of
        this stem, and its level-0 residual blocks) into the per-date encoder; the tensors copied.

        Both first levels must have the same width and block count (config ModelSetConfig checks
        it); the stem's S1 and cloud channels keep their initialisation."""
        pyramid = self.encoder.pyramid
        stem_w, stem_b = autoencoder["encoder.0.weight"], autoencoder["encoder.0.bias"]
        assert stem_w.shape[1] == len(range(*S2_CHANNELS.indices(self.in_channels))), (
            f"autoencoder stem takes {stem_w.shape[1]} channels, expected the S2 bands"
        )
        pyramid.stem.weight[:, S2_CHANNELS].copy_(stem_w)
        pyramid.stem.bias.copy_(stem_b)
        copied = 2
        for index, block in enumerate(pyramid.levels[0]):  # encoder.1 .. encoder.<blocks>
            prefix = f"encoder.{index + 1}."
            own = block.state_dict()
            for name in own:
                own[name].copy_(autoencoder[prefix + name])
                copied += 1
        return copied

    def set_wind_orders(
        self, orders: torch.Tensor, inverse: torch.Tensor, *, grid: tuple[int, int] | None = None
    ) -> None:
        """Install (S, (H/8)*(W/8)) scan orders of the coarsest token grid (from the wind cache);
        with its `grid` (H/8, W/8), crops scan in the orders restricted to their window."""
        assert self.wind is not None, "this CFDT was built with wind_scan: false"
        self.wind.set_orders(orders, inverse, grid=grid)

    def forward(
        self,
        x: torch.Tensor,
        days: torch.Tensor,
        target_index: torch.Tensor,
        sectors: torch.Tensor | None = None,
    ) -> torch.Tensor:
        assert x.ndim == 5 and x.shape[2] == self.in_channels, (
            f"expected x (B, T, {self.in_channels}, H, W), got {tuple(x.shape)}"
        )
        b, t, _, height, width = x.shape
        assert height % self.downsample == 0 and width % self.downsample == 0, (
            f"H and W must be multiples of {self.downsample}, got {height}x{width}"
        )
        assert days.shape == (b, t), f"days must be ({b}, {t}), got {tuple(days.shape)}"
        assert target_index.shape == (b,) and not target_index.is_floating_point(), (
            f"target_index must be ({b},) integer, got {tuple(target_index.shape)} {target_index.dtype}"
        )
        opt = self.optimisations
        gate_logits = self.gate(
            x,
            target_index,
            resolution=opt.gate_resolution,
            chunk=opt.gate_chunk,
            checkpointing=opt.grad_checkpoint,
            logits=True,
        )  # (B, T, 1, H, W)
        gate = torch.sigmoid(gate_logits)
        coarsest, skips = self.encoder(
            x, target_index, checkpointing=opt.grad_checkpoint, target_only=opt.target_only_pyramid
        )  # (B, T, C3, h, w), [(B, w_l, H_l, W_l)]
        fused = self.tmt(coarsest, gate, days, target_index)  # (B, h*w, C3)
        h, w = coarsest.shape[-2:]
        if self.wind is not None:
            fused = self.wind(fused, sectors, grid=(h, w)) if sectors is not None else self.wind.mixer(fused)
        fused = rearrange(fused, "b (h w) c -> b c h w", h=h, w=w)
        target_gate = gate[torch.arange(b, device=x.device), target_index]  # (B, 1, H, W)
        correction = self.decoder(fused, skips, target_gate)  # (B, 13, H, W)
        clear_only = target_index if self.prior == "clear" else None
        prior = clear_composite(
            x, out_channels=self.out_channels, date_logits=gate_logits[:, :, 0], clear_only=clear_only
        )
        return prior + correction


def date_cloudiness(prob: torch.Tensor) -> torch.Tensor:
    """(B, T, H, W) cloud probability -> (B, T): how cloudy each date is (its mean probability).

    One number per date: a cloud's shadow, which the detector does not flag, lies on the
    same date as the cloud, so a date-level weight distrusts the shadow with the cloud.
    """
    return prob.float().clamp(0, 1).mean(dim=(-2, -1))


def clear_composite(
    x: torch.Tensor,
    *,
    out_channels: int = OUTPUT_CHANNELS,
    date_logits: torch.Tensor | None = None,
    date_sharpness: float = PRIOR_DATE_SHARPNESS,
    pixel_sharpness: float = PRIOR_PIXEL_SHARPNESS,
    clear_only: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-pixel weighted mean of the dates' S2, weighting each date by how clear it is.

    w_t = softmax_t(a * log(1 - c_t) + b * log(1 - p_t) + g_t) per pixel, with c_t the date's
    cloudiness (its mean cloud probability; p_t, the last input channel, per pixel), a and b
    the date and pixel sharpness, and g_t (B, T, H, W) optional learned logits (the change
    gate's). The date term keeps a cloudy date's shadows (which the detector misses) out; no
    time decay: a clear date months away is a better guess than a cloudy one nearby, and the
    learned logits may still prefer near dates. The draft is this composite plus the decoder's
    learned correction: the model starts from a sensible temporal mosaic and learns what a
    mosaic cannot do (seasonal change, the target date's visible pixels, shadows).
    """
    prob = x[:, :, CLOUD_CHANNEL].float().clamp(0.0, 1.0 - PRIOR_FLOOR)  # (B, T, H, W)
    date = date_sharpness * torch.log1p(-date_cloudiness(prob))  # (B, T)
    logits = date[:, :, None, None] + pixel_sharpness * torch.log1p(-prob)  # (B, T, H, W)
    if date_logits is not None:
        logits = logits + date_logits.float()
    if clear_only is not None:  # (B,) target slots: the clear prior (CFDTConfig.prior "clear")
        clear = prob < CLEAR_BELOW  # (B, T, H, W)
        slots = torch.arange(prob.shape[1], device=prob.device)[None, :, None, None]
        is_target = slots == clear_only.to(prob.device)[:, None, None, None]  # (B, T, 1, 1)
        use = clear & ~is_target  # the other dates' clear values: the target is the decoder's to use
        nowhere = ~use.any(dim=1, keepdim=True)  # clear on no date: the soft weights of every date
        gate = date_logits.float() if date_logits is not None else torch.zeros_like(prob)
        logits = torch.where(nowhere, logits, gate.masked_fill(~use, float("-inf")))
    weights = torch.softmax(logits, dim=1)  # (B, T, H, W)
    composite = (weights[:, :, None] * x[:, :, :out_channels].float()).sum(dim=1)  # (B, 13, H, W)
    return composite.to(x.dtype)

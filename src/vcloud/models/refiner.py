"""Stage 2: conditional diffusion refiner in pixel space.

What diffuses is the normalised residual r = (clear target - stage-1 draft) / scale, per S2
band, with `scale` (a buffer saved with the weights) the residual's standard deviation measured
on training samples, so that r has unit variance like the noise it is mixed with. The refiner,
a small UNet behind a pixel-unshuffle (space-to-depth by `patch`, lossless and 4x cheaper per
level at patch 2), predicts the clean residual r0 from a noised r_t ("x0 prediction") given the
condition (`refiner_condition`): the draft, the observed (cloudy) target date, its S1, whether
the date has S1 (0: its S1 channels are zeros, not backscatter) and its cloud probability, all at
full resolution, plus the observed date unmixed from its cloud
(`unmix_cloud`) and the cloud opacity that unmixing implies.
Unmixing: a cloudy pixel is modelled as ground * (1 - a) + cloud * a (the atmospheric scattering
model of single-image dehazing, e.g. AOD-Net), with `cloud_spectrum` (a buffer saved with the
weights) the mean spectrum of the pixels s2cloudless is surest are cloud, measured on training
samples (the airlight of dehazing, estimated from the data the way He et al. take it from the
haziest pixels). With the draft standing for the ground, a (one number per pixel) is the
least-squares fit over the 13 bands, and the unmixed estimate is (observed - cloud * a) / (1 - a):
under thin cloud it recovers the date itself, which the draft (from the other dates) cannot.
Where the fit is wrong (shadows, surface change) the refiner learns not to trust it. Its output
is multiplied by the visibility 1 - a: where the date is not seen (opaque cloud) it corrects
nothing (measured: without it, the refiner lost 0.75 dB on opaque validation samples).
Why pixel space: decoding through the stage-0 autoencoder caps the result at the autoencoder's
quality (measured on the default run: see docs/training.md); a pixel residual has no such cap.
Why residual + x0: the output head starts at zero, so an untrained refiner returns the draft
unchanged ("no correction", what stage 2's best-checkpoint guard compares with), and training
only has to learn the correction. Sampling is deterministic DDIM (eta = 0): the only randomness
is the initial noise, drawn from the caller's generator, so one seed gives one sample and
different seeds give different samples (their spread is stage 3's confidence).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vcloud.config import RefinerConfig
from vcloud.constants import OUTPUT_CHANNELS, S1_BANDS
from vcloud.models.blocks import Downsample, ReplicateConv2d, ResBlock, Upsample, output_head, sinusoidal_embedding

S2_BANDS = OUTPUT_CHANNELS  # what diffuses: the S2 residual, (B, 13, H, W) with the 13 L1C bands


def condition_channels(bands: int) -> int:
    """Cc of the condition for `bands` S2 bands: draft, observed target date, its S1 VV/VH, its S1
    validity, cloud probability, the unmixed residual, the opacity."""
    return 3 * bands + len(S1_BANDS) + 3


CONDITION_CHANNELS = condition_channels(S2_BANDS)  # 44 with the 13 L1C bands
OPACITY_CHANNEL = -1  # the last: what gates the refiner's correction
MAX_OPACITY = 0.95  # beyond it 1 / (1 - a) amplifies noise more than it recovers ground


def unmix_cloud(
    observed: torch.Tensor, draft: torch.Tensor, spectrum: torch.Tensor, *, max_opacity: float = MAX_OPACITY
) -> tuple[torch.Tensor, torch.Tensor]:
    """Invert observed = ground * (1 - a) + spectrum * a with the draft as the ground's estimate.

    observed, draft (B, 13, H, W) in 0..1; spectrum (13,) -> (estimate (B, 13, H, W) in 0..1,
    opacity a (B, 1, H, W) in 0..max_opacity). a is the least-squares projection of
    observed - draft on spectrum - draft over the bands.
    """
    cloud = spectrum.to(draft.dtype).view(1, -1, 1, 1)
    towards = cloud - draft  # (B, 13, H, W)
    norm = (towards * towards).sum(1, keepdim=True).clamp(min=1e-4)
    opacity = ((observed - draft) * towards).sum(1, keepdim=True).div(norm).clamp(0.0, max_opacity)
    estimate = ((observed - cloud * opacity) / (1 - opacity)).clamp(0.0, 1.0)
    return estimate, opacity


def refiner_condition(
    draft: torch.Tensor,
    observed: torch.Tensor,
    s1: torch.Tensor,
    cloud_prob: torch.Tensor,
    *,
    s1_valid: torch.Tensor,
    spectrum: torch.Tensor,
    scale: torch.Tensor,
) -> torch.Tensor:
    """(B, 13, H, W) x2, (B, 2, H, W), (B, 1, H, W) or (B, H, W) -> cond (B, 44, H, W).

    s1_valid (B,) or (B, 1, H, W): where the target date has S1 (1) or none (0, its S1 is zeroed
    here whatever it holds). spectrum (13,): the cloud's spectrum (Refiner.cloud_spectrum); scale (13,): the residual's
    std (Refiner.residual_scale), which the unmixed estimate's residual is divided by, like the
    residual that diffuses.
    """
    if cloud_prob.ndim == 3:
        cloud_prob = cloud_prob[:, None]
    assert draft.shape == observed.shape and draft.shape[1] == len(spectrum), (
        f"draft and observed must both be (B, {len(spectrum)}, H, W), got {tuple(draft.shape)} and {tuple(observed.shape)}"
    )
    assert s1.shape == (draft.shape[0], len(S1_BANDS), *draft.shape[-2:]), (
        f"s1 must be (B, 2, H, W) like the draft {tuple(draft.shape)}, got {tuple(s1.shape)}"
    )
    assert cloud_prob.shape == (draft.shape[0], 1, *draft.shape[-2:]), (
        f"cloud_prob must be (B, 1, H, W) like the draft {tuple(draft.shape)}, got {tuple(cloud_prob.shape)}"
    )
    if s1_valid.ndim == 1:
        s1_valid = s1_valid.view(-1, 1, 1, 1)
    s1_valid = s1_valid.to(draft.dtype).expand(draft.shape[0], 1, *draft.shape[-2:])  # (B, 1, H, W)
    estimate, opacity = unmix_cloud(observed.to(draft.dtype), draft, spectrum)
    unmixed = (estimate - draft) / scale.to(draft.dtype).view(1, -1, 1, 1)
    parts = (draft, observed, s1.to(draft.dtype) * s1_valid, s1_valid, cloud_prob, unmixed, opacity)
    return torch.cat([p.to(draft.dtype) for p in parts], dim=1)  # (B, 44, H, W)


class Refiner(nn.Module):
    """Residual prediction UNet: forward(r_t (B, C, H, W), t (B,) long, cond (B, Cc, H, W)) -> r0.

    `residual_scale` (C,) is the per-band std of the residual it was trained on: the caller
    divides the residual by it before diffusion and multiplies the sample by it afterwards.
    `cloud_spectrum` (C,) is the cloud's spectrum the condition unmixes with. The prediction is
    multiplied by the visibility 1 - cond's opacity (the last condition channel).
    """

    def __init__(
        self, cfg: RefinerConfig, *, channels: int = S2_BANDS, cond_channels: int = CONDITION_CHANNELS
    ) -> None:
        super().__init__()
        widths = tuple(cfg.widths)
        self.channels = channels
        self.cond_channels = cond_channels
        self.patch = cfg.patch
        self.timesteps = cfg.timesteps
        self.schedule_kind = cfg.schedule  # "cosine" or "linear", for DiffusionSchedule
        self.sample_steps = cfg.sample_steps
        self.temperature = cfg.temperature
        self.train_levels = cfg.train_levels
        self.downsample = cfg.patch * 2 ** (len(widths) - 1)  # input sizes must be multiples
        self.time_dim = widths[0]
        self.register_buffer("residual_scale", torch.ones(channels))
        self.register_buffer("cloud_spectrum", torch.full((channels,), 0.5))  # fitted before training
        emb = 4 * widths[0]
        self.time_mlp = nn.Sequential(nn.Linear(widths[0], emb), nn.SiLU(), nn.Linear(emb, emb))
        self.stem = ReplicateConv2d((channels + cond_channels) * cfg.patch**2, widths[0], 3, padding=1)

        self.down = nn.ModuleList()
        self.downsamplers = nn.ModuleList()
        for level, width in enumerate(widths):  # the stem / downsampler already gives `width`
            self.down.append(nn.ModuleList(ResBlock(width, emb_dim=emb) for _ in range(cfg.blocks_per_level)))
            self.downsamplers.append(Downsample(width, widths[level + 1]) if level + 1 < len(widths) else nn.Identity())
        self.mid = nn.ModuleList(ResBlock(widths[-1], emb_dim=emb) for _ in range(2))
        self.up = nn.ModuleList()
        self.upsamplers = nn.ModuleList()
        for level in reversed(range(len(widths))):
            width = widths[level]
            self.up.append(
                nn.ModuleList(
                    ResBlock(2 * width if b == 0 else width, width, emb_dim=emb) for b in range(cfg.blocks_per_level)
                )
            )
            self.upsamplers.append(Upsample(width, widths[level - 1]) if level else nn.Identity())
        self.head = output_head(widths[0], channels * cfg.patch**2)
        nn.init.zeros_(self.head[-1].weight)  # start as "no correction": the draft passes through
        nn.init.zeros_(self.head[-1].bias)

    def predicts_zero(self) -> bool:
        """True while the output head is all zero (the untrained refiner, which the guard ships
        when no epoch beats the draft): then every x0 prediction is exactly 0."""
        last = self.head[-1]
        return not bool(last.weight.any()) and not bool(last.bias.any())

    def forward(self, r_t: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        assert r_t.ndim == 4 and r_t.shape[1] == self.channels, (
            f"r_t must be (B, {self.channels}, H, W), got {tuple(r_t.shape)}"
        )
        assert cond.shape == (r_t.shape[0], self.cond_channels, *r_t.shape[-2:]), (
            f"cond must be (B, {self.cond_channels}, H, W) like r_t, got {tuple(cond.shape)}"
        )
        assert t.shape == (r_t.shape[0],), f"t must be ({r_t.shape[0]},), got {tuple(t.shape)}"
        assert r_t.shape[-2] % self.downsample == 0 and r_t.shape[-1] % self.downsample == 0, (
            f"image size {tuple(r_t.shape[-2:])} must be a multiple of {self.downsample}"
        )
        emb = self.time_mlp(sinusoidal_embedding(t, self.time_dim))  # (B, E)
        x = torch.cat([r_t, cond.to(r_t.dtype)], dim=1)  # (B, C + Cc, H, W)
        h = self.stem(F.pixel_unshuffle(x, self.patch))  # (B, w0, H/p, W/p)
        skips = []
        for blocks, downsample in zip(self.down, self.downsamplers):
            for block in blocks:
                h = block(h, emb)
            skips.append(h)
            h = downsample(h)
        for block in self.mid:
            h = block(h, emb)
        for blocks, upsample in zip(self.up, self.upsamplers):
            h = torch.cat([h, skips.pop()], dim=1)
            for block in blocks:
                h = block(h, emb)
            h = upsample(h)
        visibility = 1 - cond[:, OPACITY_CHANNEL:].to(h.dtype)  # (B, 1, H, W)
        return F.pixel_shuffle(self.head(h), self.patch) * visibility  # (B, C, H, W)


class DiffusionSchedule:
    """Noise levels of the forward process: alphas_cumprod (timesteps,) in float64 on the CPU."""

    def __init__(self, timesteps: int, *, kind: str = "cosine") -> None:
        assert timesteps >= 1, f"timesteps must be >= 1, got {timesteps}"
        self.timesteps = timesteps
        if kind == "cosine":  # Nichol & Dhariwal 2021, s = 0.008, betas clipped at 0.999
            s = 0.008
            steps = torch.arange(timesteps + 1, dtype=torch.float64) / timesteps
            f = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
            betas = (1 - f[1:] / f[:-1]).clamp(max=0.999)
        elif kind == "linear":  # Ho et al. 2020, scaled to the number of steps
            scale = 1000 / timesteps
            betas = torch.linspace(scale * 1e-4, scale * 0.02, timesteps, dtype=torch.float64)
        else:
            raise ValueError(f"unknown noise schedule {kind!r} (cosine or linear)")
        self.kind = kind
        self.betas = betas  # (timesteps,)
        self.alphas_cumprod = torch.cumprod(1 - betas, dim=0)  # (timesteps,)

    def _abar(self, t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        abar = self.alphas_cumprod.to(t.device)[t.long()]  # (B,)
        return abar.to(torch.float32).view(-1, *([1] * (like.ndim - 1)))  # (B, 1, 1, 1)

    def q_sample(self, z0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """z_t = sqrt(abar_t) z0 + sqrt(1 - abar_t) noise, for t (B,) long."""
        assert t.shape == (z0.shape[0],), f"t must be ({z0.shape[0]},), got {tuple(t.shape)}"
        abar = self._abar(t, z0)
        return (abar.sqrt() * z0 + (1 - abar).sqrt() * noise).to(z0.dtype)

    def sampling_timesteps(self, steps: int) -> list[int]:
        """`steps` noise levels from timesteps - 1 down to 0, evenly spaced, distinct."""
        assert 1 <= steps <= self.timesteps, f"steps must lie in 1..{self.timesteps}, got {steps}"
        levels = torch.linspace(self.timesteps - 1, 0, steps).tolist()  # steps=1: the noisiest
        return sorted({round(v) for v in levels}, reverse=True)

    @torch.no_grad()
    def ddim_sample(self, model: nn.Module, cond: torch.Tensor, **kwargs) -> torch.Tensor:
        """`ddim` without gradients (evaluation, prediction, pseudo-labels)."""
        return self.ddim(model, cond, **kwargs)

    def ddim(
        self,
        model: nn.Module,
        cond: torch.Tensor,
        *,
        steps: int,
        generator: torch.Generator | None,
        shape: tuple[int, ...],
        clip: float | None = None,
        temperature: float = 1.0,
        noise: torch.Tensor | None = None,
        grad_steps: int | None = None,
    ) -> torch.Tensor:
        """Deterministic DDIM (eta = 0) from noise drawn with `generator` -> z0 of `shape`,
        differentiable (stage 3 trains its draft through the frozen refiner's sampler).

        `grad_steps`: only the last this many steps keep a graph (the earlier ones run without,
        their cond and z taken as constants: truncated backpropagation); None: every step.

        `noise` (of `shape`): the initial noise itself, drawn by the caller (then `generator` is
        not used); DDIM with eta = 0 draws nothing after it.

        The model predicts z0; the implied noise is (z_t - sqrt(abar) z0) / sqrt(1 - abar).
        `clip` bounds each step's z0 estimate to [-clip, clip]; None: no clipping.
        `temperature` scales the initial noise (1: the model's distribution; below 1: draws
        nearer its mode, the usual trade of diversity for fidelity; still one draw per seed).
        """
        assert shape[0] == cond.shape[0], f"shape {tuple(shape)} and cond {tuple(cond.shape)} differ in batch"
        assert temperature > 0, f"temperature must be > 0, got {temperature}"
        if noise is None:
            device = generator.device if generator is not None else cond.device
            noise = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        assert tuple(noise.shape) == tuple(shape), f"noise {tuple(noise.shape)} is not of shape {tuple(shape)}"
        z = noise.float().to(cond.device) * temperature
        levels = self.sampling_timesteps(steps)
        graph = torch.is_grad_enabled()
        for index, level in enumerate(levels):
            t = torch.full((shape[0],), level, device=cond.device, dtype=torch.long)
            abar = self._abar(t, z)
            with torch.set_grad_enabled(graph and (grad_steps is None or index >= len(levels) - grad_steps)):
                z0 = model(z, t, cond).float()
            if clip is not None:
                z0 = z0.clamp(-clip, clip)
            eps = (z - abar.sqrt() * z0) / (1 - abar).sqrt()
            if index + 1 == len(levels):
                return z0
            abar_prev = self._abar(torch.full_like(t, levels[index + 1]), z)
            z = abar_prev.sqrt() * z0 + (1 - abar_prev).sqrt() * eps
        raise AssertionError("unreachable: at least one sampling step")


def ddim_sample(
    model: nn.Module,
    cond: torch.Tensor,
    *,
    steps: int,
    generator: torch.Generator | None,
    shape: tuple[int, ...],
    schedule: DiffusionSchedule | None = None,
    clip: float | None = None,
    temperature: float | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """DDIM sampling with the model's schedule (Refiner.timesteps, .schedule_kind) and sampling
    temperature (Refiner.temperature) unless given."""
    if schedule is None:
        schedule = DiffusionSchedule(model.timesteps, kind=model.schedule_kind)
    if temperature is None:
        temperature = getattr(model, "temperature", 1.0)
    return schedule.ddim_sample(
        model, cond, steps=steps, generator=generator, shape=shape, clip=clip, temperature=temperature, noise=noise
    )

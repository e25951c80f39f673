"""What a stage predicts with: the stage models composed into predictors, beside the models.

The frozen stage-1 CFDT's draft (`cfdt_draft`, with its wind scan orders), and the refined
predictor of stages 2 and 3 (`RefinerPipeline`: the frozen draft around the pixel-space
refiner, built by `build_pipeline` from stage 1's best.pt). Training (train/stages.py),
evaluation, `vcloud predict` and the viewer import them from here; nothing here imports
training or evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from vcloud.config import ModelSetConfig
from vcloud.constants import CLOUD_CLASSES, S1_VALID_CHANNEL, S2_CHANNELS
from vcloud.models.build import build_cfdt, build_refiner
from vcloud.models.refiner import DiffusionSchedule, Refiner, ddim_sample, refiner_condition
from vcloud.weights import load_frozen, load_stage_weights
from vcloud.wind.scan_orders import WindCache, sector_from_wind

EVAL_KINDS = tuple(CLOUD_CLASSES[1:])  # thin, thick, opaque: the cloud kinds a stage is scored on
LOSS_FLOOR = 1e-2  # a sample's "no correction" error below this (in unit-std residual) counts as this


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def cfdt_draft(cfdt: nn.Module, batch: dict) -> torch.Tensor:
    sectors = None
    if getattr(unwrap(cfdt), "wind", None) is not None:
        sectors = wind_sectors(batch["wind"], unwrap(cfdt).wind_sectors)
    return cfdt(batch["x"], batch["days"], batch["target_index"], sectors)  # (B, 13, H, W)


def keep_seen(prediction: torch.Tensor, batch: dict, max_prob: float | None) -> torch.Tensor:
    """The prediction (B, 13, H, W) with the reconstructed date's seen pixels put back.

    A pixel of the target date whose cloud probability p (batch["target_prob"]) lies below
    `max_prob` is the observation with weight w = 1 - p / max_prob and the prediction with
    1 - w: a clear pixel comes back as observed, a pixel the detector is unsure of is mostly
    the model's. None: the prediction unchanged. Why (README, Evaluation): the models reproduce
    a clear date at 45-52 dB, the diffusion refiner at 41-45 dB; the observation is exact.
    """
    if max_prob is None:
        return prediction
    prob = batch["target_prob"].float()
    prob = prob[:, None] if prob.ndim == 3 else prob  # (B, 1, H, W)
    weight = (1 - prob / max_prob).clamp(0, 1).to(prediction.device)
    observed = observed_target(batch).to(prediction)
    return (weight * observed + (1 - weight) * prediction.float()).to(prediction.dtype)


def draft_prediction(cfdt: nn.Module, batch: dict, max_prob: float | None) -> torch.Tensor:
    """Stage 1's prediction: the CFDT's draft with the target date's seen pixels kept (keep_seen)."""
    return keep_seen(cfdt_draft(cfdt, batch), batch, max_prob)


def wind_sectors(wind: torch.Tensor, sectors: int) -> torch.Tensor:
    """(B, 2) wind u, v -> (B,) nearest scan sector, -1 (no reordering) where unknown."""
    u, v = wind.detach().float().cpu().numpy().T
    return torch.from_numpy(sector_from_wind(u, v, sectors)).to(wind.device)


def install_wind_orders(cfdt: nn.Module, cache: WindCache | None) -> nn.Module:
    """Give a wind-scanning CFDT its scan orders (read from the cache file on every rank)."""
    if cfdt.wind is not None:
        assert cache is not None, "a wind_scan model needs the wind cache"
        cfdt.set_wind_orders(torch.from_numpy(cache.orders), torch.from_numpy(cache.inverse), grid=cache.grid)
        cfdt.wind_sectors = cache.sectors
    return cfdt


def observed_target(batch: dict) -> torch.Tensor:
    """The target date's input S2 as the model sees it (clouded): (B, 13, H, W)."""
    rows = torch.arange(batch["x"].shape[0], device=batch["x"].device)
    return batch["x"][rows, batch["target_index"].to(rows.device), S2_CHANNELS]


def target_s1_valid(batch: dict) -> torch.Tensor:
    """Whether the target date has S1, as x says it (its S1 validity channel): (B, 1, H, W)."""
    rows = torch.arange(batch["x"].shape[0], device=batch["x"].device)
    return batch["x"][rows, batch["target_index"].to(rows.device), S1_VALID_CHANNEL][:, None]


class RefinerPipeline(nn.Module):
    """The frozen stage-1 CFDT around the trainable pixel-space refiner.

    Only the refiner has gradients, and only the refiner (with its residual scale) is in the
    state dict: stage 2's checkpoints do not repeat the stage-1 weights they were trained on.
    """

    def __init__(
        self,
        cfdt: nn.Module,
        refiner: Refiner,
        *,
        timesteps: int,
        schedule: str,
        ensemble: int = 1,
        keep_seen_max_prob: float | None = None,
    ):
        super().__init__()
        self.cfdt, self.refiner = cfdt, refiner
        self.schedule = DiffusionSchedule(timesteps, kind=schedule)
        self.ensemble = ensemble
        self.keep_seen_max_prob = keep_seen_max_prob  # sample/draws keep the date's seen pixels

    def state_dict(self, *args, **kwargs):
        return self.refiner.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.refiner.load_state_dict(state_dict, strict=strict, assign=assign)

    def train(self, mode: bool = True):
        super().train(mode)
        self.cfdt.eval()  # the frozen draft model stays in eval mode
        return self

    @torch.no_grad()
    def condition(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(the frozen CFDT's draft (B, 13, H, W) float32, refiner condition (B, 44, H, W))."""
        return self._condition(batch)

    def _condition(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """`condition`, with a graph where gradients are on (DraftUnderRefiner.refined)."""
        draft = cfdt_draft(self.cfdt, batch).float()
        cond = refiner_condition(
            draft,
            observed_target(batch),
            batch["target_s1"],
            batch["target_prob"],
            s1_valid=target_s1_valid(batch),
            spectrum=self.refiner.cloud_spectrum,
            scale=self.refiner.residual_scale,
        )
        return draft, cond

    def _scale(self) -> torch.Tensor:
        return self.refiner.residual_scale.view(1, -1, 1, 1)  # (1, 13, 1, 1)

    def training_levels(self, batch_size: int, device) -> torch.Tensor:
        """(B,) noise levels to train on: the sampler's levels, or any of the timesteps."""
        if self.refiner.train_levels == "sampler":
            levels = torch.tensor(self.schedule.sampling_timesteps(self.refiner.sample_steps), device=device)
            return levels[torch.randint(0, len(levels), (batch_size,), device=device)]
        return torch.randint(0, self.schedule.timesteps, (batch_size,), device=device)

    def forward(self, batch: dict) -> torch.Tensor:
        """x0-prediction loss on the normalised pixel residual between the target and the draft.

        Each sample's mean squared error is divided by its residual's mean square (the error of
        "no correction"): a sample the draft gets nearly right counts as much as one it gets
        badly wrong, as each counts alike in mean PSNR; a plain MSE is led by the few samples
        with the largest residuals (measured: it lost 0.2-1 dB of validation PSNR at 400 steps).
        """
        draft, cond = self.condition(batch)
        r0 = (batch["target"].float() - draft) / self._scale()  # (B, 13, H, W), unit std
        t = self.training_levels(r0.shape[0], r0.device)
        r_t = self.schedule.q_sample(r0, t, torch.randn_like(r0))
        error = (self.refiner(r_t, t, cond).float() - r0).pow(2).mean(dim=(1, 2, 3))  # (B,)
        baseline = r0.pow(2).mean(dim=(1, 2, 3)).clamp(min=LOSS_FLOOR)  # (B,)
        return (error / baseline).mean()

    @torch.no_grad()
    def _refine(
        self, draft: torch.Tensor, cond: torch.Tensor, *, steps: int, seeds: Sequence[int], draws: int
    ) -> torch.Tensor:
        """`draws` DDIM samples of the refined draft per seed, all in one batch: (S x draws, B, 13,
        H, W) in 0..1, seed-major. Each seed's noise comes from its own generator, drawn as if
        that seed ran alone (draw-major), so a seed's samples do not depend on the other seeds."""
        if self.refiner.predicts_zero():
            # x0 predictions of 0 make DDIM return a zero residual whatever the noise: the
            # draft itself, bit for bit, without 4 x `draws` passes of the refiner.
            return draft.clamp(0, 1).expand(len(seeds) * draws, *draft.shape).clone()
        one = (draws * draft.shape[0], *draft.shape[1:])
        noise = torch.cat(
            [
                torch.randn(one, generator=torch.Generator(device=cond.device).manual_seed(int(s)), device=cond.device)
                for s in seeds
            ]
        )
        cond = cond.repeat(len(seeds) * draws, 1, 1, 1)  # (S * draws * B, 44, H, W), like the noise
        residual = ddim_sample(
            self.refiner,
            cond,
            steps=steps,
            generator=None,
            shape=tuple(noise.shape),
            schedule=self.schedule,
            noise=noise,
        )
        residual = residual.float().view(len(seeds) * draws, *draft.shape)
        return (draft + residual * self._scale()).clamp(0, 1)

    @torch.no_grad()
    def samples(self, batch: dict, *, steps: int, seeds: Sequence[int], with_draft: bool = False):
        """One few-step DDIM sample per seed, single draws (no ensemble): (S, B, 13, H, W) in 0..1;
        with_draft: (that, the stage-1 draft (B, 13, H, W)).

        The draft is computed once and every seed runs in the same batch; each seed draws its own
        initial noise, so the samples differ where the refiner is unsure and agree where it is not
        (stage 3's confidence).
        """
        draft, cond = self.condition(batch)
        draws = self._refine(draft, cond, steps=steps, seeds=seeds, draws=1)
        return (draws, draft) if with_draft else draws

    @torch.no_grad()
    def sample(self, batch: dict, *, steps: int, seed: int, ensemble: int | None = None) -> torch.Tensor:
        """The refined S2 (B, 13, H, W): the mean of `ensemble` samples (the config's by default)
        around the frozen CFDT's draft."""
        return self.draws(batch, steps=steps, seed=seed, ensemble=ensemble).mean(0)

    @torch.no_grad()
    def draws(self, batch: dict, *, steps: int, seed: int, ensemble: int | None = None) -> torch.Tensor:
        """The `ensemble` samples whose mean `sample` returns, (ensemble, B, 13, H, W) in 0..1,
        each with the target date's seen pixels kept (keep_seen): their spread is the
        prediction's uncertainty (vcloud predict), nil where the date is seen."""
        draft, cond = self.condition(batch)
        draws = self.ensemble if ensemble is None else ensemble
        refined = self._refine(draft, cond, steps=steps, seeds=[seed], draws=draws)
        return torch.stack([keep_seen(r, batch, self.keep_seen_max_prob) for r in refined])


class DraftUnderRefiner(RefinerPipeline):
    """Stage 3: the CFDT draft model trainable, under the frozen stage-2 refiner.

    forward(batch) is the draft (B, 13, H, W) (the student's loss is on it, through DDP when
    distributed); `sample` and `draws` refine it with the frozen refiner, as the stage ships.
    Only the CFDT is in the state dict: stage 3's checkpoints hold its draft model. `loss_on`
    "refined": forward is what ships instead, the draft through the frozen refiner (`refined`),
    the gradient through the sampler's last `grad_steps` steps (None: every step).
    """

    def __init__(
        self, cfdt: nn.Module, refiner: Refiner, *, loss_on: str = "draft", grad_steps: int | None = None, **sampling
    ):
        super().__init__(cfdt, refiner, **sampling)
        self.loss_on, self.grad_steps = loss_on, grad_steps

    def state_dict(self, *args, **kwargs):
        return self.cfdt.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.cfdt.load_state_dict(state_dict, strict=strict, assign=assign)

    def train(self, mode: bool = True):
        nn.Module.train(self, mode)
        self.refiner.eval()  # the frozen refiner stays in eval mode
        return self

    def forward(self, batch: dict) -> torch.Tensor:
        if self.loss_on == "draft":
            return cfdt_draft(self.cfdt, batch)
        return self.refined(batch)

    def refined(self, batch: dict) -> torch.Tensor:
        """One DDIM draw of the refined draft with the date's seen pixels kept, as `sample` gives
        it, but differentiable in the draft model's weights (the refiner's are frozen): (B, 13,
        H, W). Each call draws fresh noise; the draft learns what the refiner makes of it."""
        draft, cond = self._condition(batch)
        residual = self.schedule.ddim(
            self.refiner,
            cond,
            steps=self.refiner.sample_steps,
            generator=None,
            shape=tuple(draft.shape),
            temperature=self.refiner.temperature,
            grad_steps=self.grad_steps,
        )
        return keep_seen((draft + residual.float() * self._scale()).clamp(0, 1), batch, self.keep_seen_max_prob)


def build_draft_under_refiner(
    cfg: ModelSetConfig, *, draft_ckpt: Path, draft_stage: int, stage2_ckpt: Path, wind: WindCache | None = None
) -> DraftUnderRefiner:
    """The CFDT of `draft_ckpt` (a stage-`draft_stage` checkpoint: stage 1's to start stage 3,
    stage 3's to predict with it), trainable, under stage 2's frozen refiner; it trains on what
    `stage3.self_training.loss_on` says."""
    cfdt = install_wind_orders(build_cfdt(cfg), wind)
    cfdt.load_state_dict(load_stage_weights(draft_ckpt, stage=draft_stage))
    st = cfg.stage3.self_training
    return DraftUnderRefiner(
        cfdt,
        load_frozen(build_refiner(cfg), stage2_ckpt, stage=2),
        loss_on=st.loss_on,
        grad_steps=st.grad_steps,
        **sampling_settings(cfg),
    )


def build_pipeline(cfg: ModelSetConfig, *, stage1_ckpt: Path, wind: WindCache | None = None) -> RefinerPipeline:
    """Stage 1 (frozen) + a fresh refiner (pixel space: stage 0 is not part of it)."""
    cfdt = install_wind_orders(load_frozen(build_cfdt(cfg), stage1_ckpt, stage=1), wind)
    return RefinerPipeline(cfdt, build_refiner(cfg), **sampling_settings(cfg))


def sampling_settings(cfg: ModelSetConfig) -> dict:
    """How a RefinerPipeline samples, from the config (stage2.model, data.keep_seen_max_prob)."""
    m = cfg.stage2.model
    return {
        "timesteps": m.timesteps,
        "schedule": m.schedule,
        "ensemble": m.ensemble,
        "keep_seen_max_prob": cfg.data.keep_seen_max_prob,
    }

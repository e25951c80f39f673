"""The four stages as StageTasks for the shared trainer.

- stage 0: autoencoder on clear S2 images, L1 reconstruction; val PSNR.
- stage 1: CFDT draft model; input T dates with a synthetic cloud (curriculum class) on the
  clear target date; L1 to the clear image; val on fixed seeded clouds of every class.
- stage 2: diffusion refiner in the stage-0 latent space, conditioned on the frozen stage-1
  draft and the target date's S1 + cloud probability; it diffuses the latent residual between
  the clear target and the draft (x0 prediction, MSE); val PSNR of the few-step DDIM sample.
- stage 3: self-training. The stage 1+2 teacher labels cloudy-only samples (locations with no
  clear date); a pseudo-label is kept when refiner samples from `sampler_seeds` seeds agree
  (mean |difference| <= max_seed_spread) and it matches the pixels the cloud mask calls clear
  (mean |error| <= max_visible_error). The student (stage-1 weights) is fine-tuned on the
  labelled samples plus the kept pseudo-labels.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from vcloud.config import ModelSetConfig
from vcloud.constants import CLOUD_CLASSES, S2_CHANNELS, S2CLOUDLESS_KWARGS
from vcloud.data.samples import ClearImages, CloudySamples, EpochConcat, UnlabelledSamples, crop_item, finish_batch
from vcloud.evaluation.metrics import compute_all
from vcloud.models.autoencoder import Autoencoder
from vcloud.models.cfdt import CFDT
from vcloud.models.refiner import (
    CONDITION_EXTRA_CHANNELS,
    DiffusionSchedule,
    Refiner,
    ddim_sample,
    refiner_condition,
)
from vcloud.train.checkpoint import load_checkpoint
from vcloud.train.trainer import StageTask
from vcloud.wind.scan_orders import WindCache, sector_from_wind

log = logging.getLogger(__name__)

SELF_TRAINING_RULE = (
    "keep when mean |seed_i - mean| <= stage3.self_training.max_seed_spread and mean |label - input| "
    f"over pixels with cloud probability < {S2CLOUDLESS_KWARGS['threshold']} "
    "<= stage3.self_training.max_visible_error"
)
VAL_SEED = 12345  # the validation clouds are the same every epoch and every run
EVAL_KINDS = tuple(CLOUD_CLASSES[1:])  # thin, thick, opaque


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def load_frozen(model: nn.Module, path: Path, *, stage: int) -> nn.Module:
    """Weights from a finished stage's best.pt, frozen and in eval mode."""
    state = load_checkpoint(path)
    if state.get("stage") != stage:
        from vcloud.errors import BadInputError

        raise BadInputError(f"{path}: checkpoint of stage {state.get('stage')}, expected stage {stage}")
    model.load_state_dict(state["model"])
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def detect_on(device: str, *, raw: bool = True) -> str:
    """Where CloudySamples runs s2cloudless: on a GPU the worker skips LightGBM (~1 s of a core per
    256x256 target) and finish_batch runs the same trees there; on the CPU the worker runs LightGBM,
    faster there than the torch traversal. Normalised (raw=False) samples detect in the worker."""
    return "device" if raw and torch.device(device).type == "cuda" else "worker"


def _cloudy(
    cfg: ModelSetConfig, store: Path, *, train: bool, stage_epochs: int, device: str = "cpu", raw: bool = True
) -> CloudySamples:
    d = cfg.data
    detect = detect_on(device, raw=raw)
    if train:
        cur = cfg.stage1.curriculum
        return CloudySamples(
            store, dates=d.input_dates, length=d.samples_per_epoch, seed=cfg.stage1.train.seed,
            crop=d.crop, clear_max_cover=d.clear_target_max_cover, epochs=stage_epochs,
            mixed_from=cur.mixed_from, all_from=cur.all_from, raw=raw, detect=detect,
        )  # fmt: skip
    return CloudySamples(
        store, dates=d.input_dates, length=d.val_samples, seed=VAL_SEED, crop=None,
        clear_max_cover=d.clear_target_max_cover, kinds=EVAL_KINDS, raw=raw, detect=detect,
    )  # fmt: skip


def _on_device(task: StageTask) -> StageTask:
    """The one place where training batches are normalised: on their device, before the stage.

    Loaders hand over images as stored (`raw=True` datasets, see samples.finish_batch); the
    stage's loss and validation always see the normalised layout. Already-normalised batches
    (stage 3's pseudo-labelled mix) pass through unchanged.
    """
    loss, validate = task.loss, task.validate
    task.loss = lambda m, batch: loss(m, finish_batch(batch))
    task.validate = lambda m, batch: validate(m, finish_batch(batch))
    return task


def cfdt_draft(cfdt: nn.Module, batch: dict) -> torch.Tensor:
    sectors = None
    if getattr(_unwrap(cfdt), "wind", None) is not None:
        sectors = wind_sectors(batch["wind"], _unwrap(cfdt).wind_sectors)
    return cfdt(batch["x"], batch["days"], batch["target_index"], sectors)  # (B, 13, H, W)


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


def stage0(cfg: ModelSetConfig, *, train: Path, val: Path) -> StageTask:
    d = cfg.data
    model = Autoencoder(cfg.stage0.model)

    def loss(m, batch):
        return F.l1_loss(m(batch["target"]), batch["target"])

    def validate(m, batch):
        return compute_all(m(batch["target"]).float().clamp(0, 1), batch["target"].float())

    return _on_device(StageTask(
        stage=0,
        model=model,
        train_set=ClearImages(train, length=d.samples_per_epoch, seed=cfg.stage0.train.seed, crop=d.crop,
                              clear_max_cover=d.clear_target_max_cover, raw=True),
        val_set=ClearImages(val, length=d.val_samples, seed=VAL_SEED, clear_max_cover=d.clear_target_max_cover, raw=True),
        loss=loss,
        validate=validate,
    ))  # fmt: skip


def stage1(
    cfg: ModelSetConfig, *, train: Path, val: Path, wind: WindCache | None = None, device: str = "cpu"
) -> StageTask:
    train_set = _cloudy(cfg, train, train=True, stage_epochs=cfg.stage1.train.epochs, device=device)
    model = install_wind_orders(CFDT(cfg.stage1.model), wind)

    def loss(m, batch):
        return F.l1_loss(cfdt_draft(m, batch), batch["target"])

    def validate(m, batch):
        return compute_all(cfdt_draft(m, batch).float().clamp(0, 1), batch["target"].float())

    def on_epoch_start(epoch):
        return {"curriculum": "+".join(train_set.kinds_at(epoch))}

    return _on_device(StageTask(
        stage=1, model=model, train_set=train_set,
        val_set=_cloudy(cfg, val, train=False, stage_epochs=1, device=device),
        loss=loss, validate=validate, on_epoch_start=on_epoch_start,
    ))  # fmt: skip


class RefinerPipeline(nn.Module):
    """Frozen stage 0 + stage 1 around the trainable refiner.

    Only the refiner has gradients, and only the refiner is in the state dict: stage 2's
    checkpoints do not repeat the stage 0 and stage 1 weights they were trained against.
    """

    def __init__(self, autoencoder: nn.Module, cfdt: nn.Module, refiner: nn.Module, *, timesteps: int,
                 schedule: str, latent_channels: int):  # fmt: skip
        super().__init__()
        self.autoencoder, self.cfdt, self.refiner = autoencoder, cfdt, refiner
        self.schedule = DiffusionSchedule(timesteps, kind=schedule)
        self.latent_channels = latent_channels

    def state_dict(self, *args, **kwargs):
        return self.refiner.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.refiner.load_state_dict(state_dict, strict=strict, assign=assign)

    def train(self, mode: bool = True):
        super().train(mode)
        self.autoencoder.eval()  # frozen parts stay in eval mode
        self.cfdt.eval()
        return self

    @torch.no_grad()
    def condition(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(draft, draft latent, refiner condition) for a batch."""
        draft = cfdt_draft(self.cfdt, batch)
        latent = self.autoencoder.encode(draft)
        return draft, latent, refiner_condition(latent, batch["target_s1"], batch["target_prob"])

    def forward(self, batch: dict) -> torch.Tensor:
        """x0-prediction loss on the latent residual between the clear target and the draft."""
        _, draft_latent, cond = self.condition(batch)
        with torch.no_grad():
            r0 = (self.autoencoder.encode(batch["target"]) - draft_latent).float()
        t = torch.randint(0, self.schedule.timesteps, (r0.shape[0],), device=r0.device)
        r_t = self.schedule.q_sample(r0, t, torch.randn_like(r0))
        return F.mse_loss(self.refiner(r_t, t, cond).float(), r0)

    @torch.no_grad()
    def sample(self, batch: dict, *, steps: int, seed: int) -> torch.Tensor:
        """Deterministic few-step refinement of the draft, S2 (B, 13, H, W).

        The latent correction is applied as a difference of decodings, draft + D(z + r) - D(z),
        so the autoencoder's own reconstruction error never replaces the draft's detail.
        """
        draft, draft_latent, cond = self.condition(batch)
        shape = tuple(draft_latent.shape)
        generator = torch.Generator(device=cond.device).manual_seed(seed)
        residual = ddim_sample(
            self.refiner, cond, steps=steps, generator=generator, shape=shape, schedule=self.schedule
        )
        correction = self.autoencoder.decode(draft_latent + residual.to(draft_latent.dtype))
        correction = correction - self.autoencoder.decode(draft_latent)
        return (draft.float() + correction.float()).clamp(0, 1)


def build_pipeline(
    cfg: ModelSetConfig, *, stage0_ckpt: Path, stage1_ckpt: Path, wind: WindCache | None = None
) -> RefinerPipeline:
    autoencoder = load_frozen(Autoencoder(cfg.stage0.model), stage0_ckpt, stage=0)
    cfdt = install_wind_orders(load_frozen(CFDT(cfg.stage1.model), stage1_ckpt, stage=1), wind)
    latent = cfg.stage0.model.latent_channels
    refiner = Refiner(cfg.stage2.model, latent_channels=latent, cond_channels=latent + CONDITION_EXTRA_CHANNELS)
    return RefinerPipeline(
        autoencoder, cfdt, refiner, timesteps=cfg.stage2.model.timesteps, schedule=cfg.stage2.model.schedule,
        latent_channels=latent,
    )  # fmt: skip


def stage2(
    cfg: ModelSetConfig, *, train: Path, val: Path, stage0_ckpt: Path, stage1_ckpt: Path,
    wind: WindCache | None = None, device: str = "cpu",
) -> StageTask:  # fmt: skip
    pipeline = build_pipeline(cfg, stage0_ckpt=stage0_ckpt, stage1_ckpt=stage1_ckpt, wind=wind)
    steps = cfg.stage2.model.sample_steps

    def loss(m, batch):
        return m(batch)

    def validate(m, batch):
        return compute_all(m.sample(batch, steps=steps, seed=VAL_SEED).float(), batch["target"].float())

    return _on_device(StageTask(
        stage=2, model=pipeline,
        train_set=_cloudy(cfg, train, train=True, stage_epochs=cfg.stage2.train.epochs, device=device),
        val_set=_cloudy(cfg, val, train=False, stage_epochs=1, device=device), loss=loss, validate=validate,
    ))  # fmt: skip


class PseudoLabelled(Dataset):
    """Unlabelled samples with the teacher's kept pseudo-label as target, cropped like training."""

    def __init__(self, base: UnlabelledSamples, kept: list[tuple[int, torch.Tensor]], *, crop, seed: int):
        self.base, self.kept, self.crop, self.seed = base, kept, crop, seed

    def __len__(self) -> int:
        return len(self.kept)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        epoch, i = divmod(int(index), len(self.kept))
        base_index, label = self.kept[i]
        item = self.base[base_index]
        keep = ("x", "days", "target_index", "target_s1", "target_prob", "wind", "location")
        item = {**{k: item[k] for k in keep}, "target": label, "cloud_class": torch.tensor(-1)}
        return crop_item(item, np.random.default_rng((self.seed, epoch, i, 1)), self.crop)


@torch.no_grad()
def pseudo_label(pipeline: RefinerPipeline, samples: UnlabelledSamples, cfg: ModelSetConfig, device: str):
    """Label cloudy-only samples with the teacher; keep the confident ones."""
    st = cfg.stage3.self_training
    steps = cfg.stage2.model.sample_steps
    pipeline.to(device).eval()
    kept, scored = [], []
    for index in range(len(samples)):
        item = samples[index]
        batch = {k: v[None].to(device) for k, v in item.items()}
        draws = torch.stack([pipeline.sample(batch, steps=steps, seed=s)[0] for s in range(st.sampler_seeds)])
        label = draws.mean(0)  # (13, H, W)
        spread = (draws - label).abs().mean().item()
        visible = batch["visible"][0]
        observed = batch["x"][0, item["target_index"], S2_CHANNELS]
        visible_error = (label - observed).abs().mean(0)[visible].mean().item() if visible.any() else float("inf")
        ok = spread <= st.max_seed_spread and visible_error <= st.max_visible_error
        scored.append({"index": index, "spread": spread, "visible_error": visible_error, "kept": ok})
        if ok:
            kept.append((index, label.cpu()))
    return kept, scored


def stage3(
    cfg: ModelSetConfig, *, train: Path, val: Path, stage0_ckpt: Path, stage1_ckpt: Path, stage2_ckpt: Path,
    device: str, wind: WindCache | None = None,
) -> StageTask:  # fmt: skip
    pipeline = build_pipeline(cfg, stage0_ckpt=stage0_ckpt, stage1_ckpt=stage1_ckpt, wind=wind)
    pipeline.load_state_dict(load_checkpoint(stage2_ckpt)["model"])
    unlabelled = UnlabelledSamples(
        train, dates=cfg.data.input_dates, seed=cfg.stage3.train.seed, clear_max_cover=cfg.data.clear_target_max_cover,
        limit=cfg.stage3.self_training.max_pseudo_labels,
    )  # fmt: skip
    kept, scored = pseudo_label(pipeline, unlabelled, cfg, device) if len(unlabelled) else ([], [])
    log.info("stage 3: kept %d of %d pseudo-labels", len(kept), len(scored))
    student = install_wind_orders(CFDT(cfg.stage1.model), wind)
    student.load_state_dict(load_checkpoint(stage1_ckpt)["model"])
    # Normalised on the CPU: its batches mix with the pseudo-labelled ones, which are.
    labelled = _cloudy(cfg, train, train=True, stage_epochs=cfg.stage3.train.epochs, device=device, raw=False)
    pseudo = PseudoLabelled(unlabelled, kept, crop=cfg.data.crop, seed=cfg.stage3.train.seed)
    train_set: Dataset = EpochConcat([labelled, pseudo]) if kept else labelled

    def loss(m, batch):
        return F.l1_loss(cfdt_draft(m, batch), batch["target"])

    def validate(m, batch):
        return compute_all(cfdt_draft(m, batch).float().clamp(0, 1), batch["target"].float())

    return _on_device(StageTask(
        stage=3, model=student, train_set=train_set,
        val_set=_cloudy(cfg, val, train=False, stage_epochs=1, device=device),
        loss=loss, validate=validate,
        summary={"pseudo_labels_scored": len(scored), "pseudo_labels_kept": len(kept)},
        artifacts={"pseudo_labels": {"kept": len(kept), "scored": scored, "rule": SELF_TRAINING_RULE}},
    ))  # fmt: skip

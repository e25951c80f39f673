"""The four stages as StageTasks for the shared trainer.

- stage 0: autoencoder on clear S2 images, L1 reconstruction; val PSNR.
- stage 1: CFDT draft model; input T dates with a synthetic cloud (curriculum class) on the
  clear target date; L1 to the clear image; val on fixed seeded clouds of every class.
- stage 2: diffusion refiner in pixel space, conditioned on the frozen stage-1 draft, the
  observed target date (also unmixed from its cloud), its S1 and cloud probability; it diffuses
  the residual between the clear target and the draft, divided by its per-band std (x0
  prediction, at the sampler's noise levels; each sample's MSE divided by its residual's mean
  square, so every sample counts alike, as in mean PSNR); val PSNR of the mean of `ensemble`
  few-step DDIM samples. Validated before training too (the untrained
  refiner is the draft), so stage 2 never ships worse than "no correction".
- stage 3: self-training of the draft model on natural clouds. The stage 1+2 teacher labels
  cloudy-only samples (locations with no clear date); a pseudo-label is kept when refiner
  samples from `sampler_seeds` seeds agree (mean |difference| <= max_seed_spread) and it matches
  the pixels the cloud mask calls clear (mean |error| <= max_visible_error). The student, the
  stage-1 CFDT under the frozen stage-2 refiner (pipeline.DraftUnderRefiner), is fine-tuned
  with stage 1's L1 on simulated clouds, the kept pseudo-labels and natural pairs of the train
  split (NaturalPairs: the reference protocol's construction, a clear date the truth, the
  nearest dates with their own clouds the input); it ships refined by the stage-2 refiner, and
  its L1 is on that refined output (self_training.loss_on: refined; the gradient through the
  sampler's last step) so that the draft learns what the refiner makes of it. The
  rule is also applied to validation samples (truth known): pseudo_labels.json reports the kept
  and rejected groups' PSNR. Validated before training too (the start is stage 2 exactly), so
  stage 3 never ships worse than stage 2. Measured (docs/training.md, stage 3): the refiner as
  the student, on pseudo-labels, natural pairs or natural clouds, never beat stage 2 on the
  natural-cloud protocols; the draft on natural pairs did, once its loss was on the refined
  output (with the loss on the bare draft it lost where the date is clear).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Subset

from vcloud.config import ModelSetConfig, SelfTraining
from vcloud.constants import S2_CHANNELS, S2CLOUDLESS_KWARGS
from vcloud.data.samples import (
    ClearImages,
    CloudySamples,
    EpochConcat,
    UnlabelledSamples,
    crop_item,
    finish_batch,
    stack_sample,
)
from vcloud.data.series import choose_context
from vcloud.data.shards import ShardReader as StoreReader
from vcloud.errors import BadInputError
from vcloud.evaluation.metrics import compute_all
from vcloud.evaluation.protocols import ReferenceSamples, reference_samples
from vcloud.evaluation.uncrtaints import UncrtaintsSamples
from vcloud.models.build import build_autoencoder, build_cfdt
from vcloud.pipeline import (  # noqa: F401 (re-exported: the builders' and their tests' names)
    EVAL_KINDS,
    LOSS_FLOOR,
    RefinerPipeline,
    build_draft_under_refiner,
    build_pipeline,
    cfdt_draft,
    draft_prediction,
    install_wind_orders,
    observed_target,
    unwrap,
    wind_sectors,
)
from vcloud.train.trainer import StageTask
from vcloud.weights import load_frozen, load_stage_weights  # noqa: F401
from vcloud.wind.scan_orders import WindCache

log = logging.getLogger(__name__)

SELF_TRAINING_RULE = (
    "keep when mean |seed_i - mean| <= stage3.self_training.max_seed_spread and mean |label - input| "
    f"over pixels with cloud probability < {S2CLOUDLESS_KWARGS['threshold']} "
    "<= stage3.self_training.max_visible_error"
)
VAL_SEED = 12345  # the validation clouds are the same every epoch and every run


def detect_on(device: str, *, raw: bool = True) -> str:
    """Where CloudySamples runs s2cloudless: on a GPU the worker skips LightGBM (~1 s of a core per
    256x256 target) and finish_batch runs the same trees there; on the CPU the worker runs LightGBM,
    faster there than the torch traversal. Normalised (raw=False) samples detect in the worker."""
    return "device" if raw and torch.device(device).type == "cuda" else "worker"


def _cloudy(
    cfg: ModelSetConfig,
    store: Path,
    *,
    train: bool,
    stage_epochs: int,
    device: str = "cpu",
    raw: bool = True,
    samples_per_epoch: int | None = None,
    clear_share: float = 0.0,
) -> CloudySamples:
    d = cfg.data
    detect = detect_on(device, raw=raw)
    if train:
        cur = cfg.stage1.curriculum
        return CloudySamples(
            store,
            dates=d.input_dates,
            length=samples_per_epoch or d.samples_per_epoch,
            seed=cfg.stage1.train.seed,
            crop=d.crop,
            clear_max_cover=d.clear_target_max_cover,
            epochs=stage_epochs,
            mixed_from=cur.mixed_from,
            all_from=cur.all_from,
            raw=raw,
            detect=detect,
            clear_share=clear_share,
            s1_dropout=d.s1_dropout,
            **d.context.sampler_kwargs(),
        )
    return CloudySamples(
        store,
        dates=d.input_dates,
        length=d.val_samples,
        seed=VAL_SEED,
        crop=None,
        clear_max_cover=d.clear_target_max_cover,
        kinds=EVAL_KINDS,
        raw=raw,
        detect=detect,
        **d.context.sampler_kwargs(),
    )


def natural_val(cfg: ModelSetConfig, store: Path) -> dict[str, Dataset]:
    """The natural-cloud protocols on the val split, beside the fixed one (StageTask.extra_val):
    reference (evaluation.reference_truths truths per location) and uncrtaints (T as
    evaluation.uncrtaints sets it, coverage computed from the store), what users report. A
    protocol the store has no sample of is left out with a warning; each holds at most
    data.val_samples samples (None: all), evenly spread over its own."""
    protocols: dict[str, Dataset] = {"reference": reference_samples(store, cfg)}
    u = cfg.evaluation.uncrtaints
    try:
        protocols["uncrtaints"] = UncrtaintsSamples(store, dates=u.dates, min_cov=u.min_cov, max_cov=u.max_cov)
    except BadInputError as err:
        log.warning("validation without protocol uncrtaints on %s: %s", store, err)
    cap = cfg.data.val_samples  # as many as the fixed protocol validates at most, evenly spread
    return {
        name: samples if cap is None or len(samples) <= cap else Subset(samples, spread(len(samples), cap))
        for name, samples in protocols.items()
        if len(samples)
    }


def spread(total: int, count: int) -> list[int]:
    """`count` indices of 0..total-1, evenly spaced (the first and the last included)."""
    return sorted({round(i * (total - 1) / max(count - 1, 1)) for i in range(count)})


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


def stage0(cfg: ModelSetConfig, *, train: Path, val: Path) -> StageTask:
    d = cfg.data
    model = build_autoencoder(cfg)

    def loss(m, batch):
        return F.l1_loss(m(batch["target"]), batch["target"])

    def validate(m, batch):
        return compute_all(m(batch["target"]).float().clamp(0, 1), batch["target"].float())

    return _on_device(
        StageTask(
            stage=0,
            model=model,
            train_set=ClearImages(
                train,
                length=cfg.stage0.train.samples_per_epoch or d.samples_per_epoch,
                seed=cfg.stage0.train.seed,
                crop=d.crop,
                clear_max_cover=d.clear_target_max_cover,
                raw=True,
            ),
            val_set=ClearImages(
                val, length=d.val_samples, seed=VAL_SEED, clear_max_cover=d.clear_target_max_cover, raw=True
            ),
            loss=loss,
            validate=validate,
        )
    )


def stage1(
    cfg: ModelSetConfig,
    *,
    train: Path,
    val: Path,
    wind: WindCache | None = None,
    device: str = "cpu",
    stage0_ckpt: Path | None = None,
) -> StageTask:
    """stage0_ckpt (given when stage1.init_from_stage0): the autoencoder whose first level starts
    the per-date encoder's."""
    t = cfg.stage1.train
    train_set = _cloudy(
        cfg, train, train=True, stage_epochs=t.epochs, device=device, samples_per_epoch=t.samples_per_epoch
    )
    model = install_wind_orders(build_cfdt(cfg), wind)
    if stage0_ckpt is not None:
        copied = model.start_from_autoencoder(load_stage_weights(stage0_ckpt, stage=0))
        log.info("stage 1 starts its encoder's first level from %s (%d tensors)", stage0_ckpt, copied)
    if cfg.stage1.start_from_composite:
        model.start_from_composite()
        log.info("stage 1 starts as the clear-sky composite of its inputs, validated as epoch -1")

    def loss(m, batch):
        return F.l1_loss(cfdt_draft(m, batch), batch["target"])

    def validate(m, batch):  # what stage 1 predicts: the draft with the date's seen pixels kept
        prediction = draft_prediction(m, batch, cfg.data.keep_seen_max_prob)
        return compute_all(prediction.float().clamp(0, 1), batch["target"].float())

    def on_epoch_start(epoch):
        return {"curriculum": "+".join(train_set.kinds_at(epoch))}

    return _on_device(
        StageTask(
            stage=1,
            model=model,
            train_set=train_set,
            val_set=_cloudy(cfg, val, train=False, stage_epochs=1, device=device),
            extra_val=natural_val(cfg, val),
            loss=loss,
            validate=validate,
            on_epoch_start=on_epoch_start,
            validate_initial=cfg.stage1.start_from_composite,
        )
    )


def refiner_objective(steps: int):
    """(loss, validate) of a RefinerPipeline task, stages 2 and 3: the refiner's own loss around
    the frozen stage-1 draft, and the metrics of one seeded `steps`-step DDIM prediction."""

    def loss(m, batch):
        return m(batch)

    def validate(m, batch):
        return compute_all(unwrap(m).sample(batch, steps=steps, seed=VAL_SEED).float(), batch["target"].float())

    return loss, validate


RESIDUAL_SCALE_SAMPLES = 16  # training samples (every cloud kind) the residual's std is measured on
RESIDUAL_SCALE_FLOOR = 1e-3  # a band the draft already gets right is not blown up to unit noise
CLOUD_MIN_PROB = 0.9  # pixels s2cloudless gives at least this probability: the cloud's spectrum


@torch.no_grad()
def fit_refiner_statistics(
    pipeline: RefinerPipeline, samples: Dataset, *, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the refiner's condition is scaled and unmixed with, from `samples`, stored in the
    refiner: (residual_scale (13,), the per-band std of target - draft; cloud_spectrum (13,), the
    mean S2 of every input pixel, any date, with cloud probability >= CLOUD_MIN_PROB).
    """
    pipeline.to(device).eval()
    bands = pipeline.refiner.channels
    total = torch.zeros(bands, dtype=torch.float64)
    squares = torch.zeros(bands, dtype=torch.float64)
    cloud_sum, cloud_count = torch.zeros(bands, dtype=torch.float64), 0
    count = 0
    for index in range(len(samples)):
        batch = finish_batch({k: v[None].to(device) for k, v in samples[index].items()})
        residual = (batch["target"].float() - cfdt_draft(pipeline.cfdt, batch).float()).double().cpu()
        total += residual.sum(dim=(0, 2, 3))
        squares += (residual**2).sum(dim=(0, 2, 3))
        count += residual[:, 0].numel()
        x = batch["x"].double().cpu()  # (1, T, 17, H, W): 13 S2, 2 S1, S1 validity, cloud probability (last)
        cloudy = x[:, :, -1] >= CLOUD_MIN_PROB  # (1, T, H, W)
        cloud_sum += x[:, :, S2_CHANNELS].permute(2, 0, 1, 3, 4)[:, cloudy].sum(dim=1)
        cloud_count += int(cloudy.sum())
    std = (squares / count - (total / count) ** 2).clamp(min=0).sqrt().clamp(min=RESIDUAL_SCALE_FLOOR)
    pipeline.refiner.residual_scale.copy_(std.to(pipeline.refiner.residual_scale))
    if cloud_count:  # else the neutral default (a flat, bright cloud) stays
        pipeline.refiner.cloud_spectrum.copy_((cloud_sum / cloud_count).to(pipeline.refiner.cloud_spectrum))
    return pipeline.refiner.residual_scale, pipeline.refiner.cloud_spectrum


def stage2(
    cfg: ModelSetConfig,
    *,
    train: Path,
    val: Path,
    stage1_ckpt: Path,
    wind: WindCache | None = None,
    device: str = "cpu",
) -> StageTask:
    pipeline = build_pipeline(cfg, stage1_ckpt=stage1_ckpt, wind=wind)
    d = cfg.data
    scale_samples = CloudySamples(
        train,
        dates=d.input_dates,
        length=RESIDUAL_SCALE_SAMPLES,
        seed=cfg.stage2.train.seed,
        crop=d.crop,
        clear_max_cover=d.clear_target_max_cover,
        kinds=EVAL_KINDS,
        raw=True,
        detect=detect_on(device),
        **d.context.sampler_kwargs(),
    )
    scale, spectrum = fit_refiner_statistics(pipeline, scale_samples, device=device)
    pipeline.to("cpu")  # the trainer moves it where it trains
    log.info(
        "stage 2: residual std per band %s; cloud spectrum %s",
        [round(float(v), 4) for v in scale],
        [round(float(v), 3) for v in spectrum],
    )
    loss, validate = refiner_objective(cfg.stage2.model.sample_steps)
    # The untrained refiner is exactly "no correction" (zero output head): validating it first
    # makes the draft the score to beat, and its weights the best.pt when no epoch beats it.
    assert not pipeline.refiner.head[-1].weight.any(), "the refiner must start as no correction"
    return _on_device(
        StageTask(
            stage=2,
            model=pipeline,
            train_set=_cloudy(
                cfg,
                train,
                train=True,
                stage_epochs=cfg.stage2.train.epochs,
                device=device,
                samples_per_epoch=cfg.stage2.train.samples_per_epoch,
                clear_share=cfg.stage2.clear_share,
            ),
            val_set=_cloudy(cfg, val, train=False, stage_epochs=1, device=device),
            loss=loss,
            validate=validate,
            extra_val=natural_val(cfg, val),
            validate_initial=True,
            summary={
                "residual_scale": [round(float(v), 5) for v in scale],
                "cloud_spectrum": [round(float(v), 4) for v in spectrum],
            },
        )
    )


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
        keep = (
            "x",
            "days",
            "target_index",
            "target_s1",
            "target_prob",
            "wind",
            "location",
            "s1_valid",
            "target_s1_valid",
        )
        item = {**{k: item[k] for k in keep if k in item}, "target": label, "cloud_class": torch.tensor(-1)}
        return crop_item(item, np.random.default_rng((self.seed, epoch, i, 1)), self.crop)


class NaturalClouds(Dataset):
    """Clear targets under the clouds of the data itself, cropped like training.

    Sample i: a clear date t of a location (a training target) and one of that location's cloudy
    dates c (cloud cover >= NATURAL_CLOUD_MIN_COVER); the target slot shows p_c x S2_c + (1 - p_c)
    x S2_t per pixel, with p_c date c's cloud probability (also the slot's probability channel),
    and the truth is S2_t. The cloud's look, spectrum and texture are the data's, not the
    simulator's, and the truth is exact (no other date stands in for it).
    """

    def __init__(self, store: Path, cfg: ModelSetConfig, *, length: int, seed: int):
        self.reader = StoreReader(store)
        usable = self.reader.valid_s2.copy()
        cover = np.nan_to_num(self.reader.cloud_cover, nan=1.0)
        self.cloudy = usable & (cover >= NATURAL_CLOUD_MIN_COVER)
        clear = usable & (cover < cfg.data.clear_target_max_cover) & self.cloudy.any(axis=1, keepdims=True)
        self.targets = np.argwhere(clear)
        self.usable, self.dates, self.crop = usable, cfg.data.input_dates, cfg.data.crop
        self.context = cfg.data.context.sampler_kwargs()
        self.length, self.seed = (length if len(self.targets) else 0), seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        epoch, i = divmod(int(index), self.length)
        rng = np.random.default_rng((self.seed, epoch, i, 3))
        location, target_t = (int(v) for v in self.targets[int(rng.integers(len(self.targets)))])
        cloud_t = int(rng.choice(np.flatnonzero(self.cloudy[location])))
        days = self.reader.date_s2[location].astype("datetime64[D]").astype(np.int64)
        cover = self.reader.cloud_cover[location]
        chosen = choose_context(days, cover, self.usable[location], target_t, self.dates, rng=rng, **self.context)
        dates, slot = list(chosen.dates), chosen.slot
        sample = self.reader.read(location, [*dates, cloud_t])
        prob = np.nan_to_num(sample.cloud_prob, nan=1.0)
        s2, truth = sample.s2[:-1].copy(), sample.s2[slot].copy()
        veil = prob[-1][None]  # (1, H, W)
        s2[slot] = veil * sample.s2[-1] + (1 - veil) * truth
        prob = prob[:-1].copy()
        prob[slot] = veil[0]
        item = stack_sample(
            s2, sample.s1[:-1], prob, self.reader.date_s2[location, dates], slot, s1_valid=sample.valid_s1[:-1]
        )
        item["target"] = torch.from_numpy(np.ascontiguousarray(truth))
        item["wind"] = torch.from_numpy(self.reader.wind[location, target_t])
        item["cloud_class"] = torch.tensor(-1)
        item["location"] = torch.tensor(location)
        return crop_item(item, rng, self.crop)


class NaturalPairs(Dataset):
    """Natural-cloud training pairs: the reference protocol's construction on the train split,
    cropped like training.

    Every clear date of a location (cloud cover <= data.clear_target_max_cover) is a truth, the
    T usable dates nearest to it (the truth left out) with their own clouds are the input, and
    the slot is the input date nearest the truth: what the natural-cloud protocols score, with
    their kind of truth (another date than the one reconstructed). `length` pairs per epoch,
    drawn with the epoch in the seed; None: each pair once per epoch.
    """

    def __init__(self, store: Path, cfg: ModelSetConfig, *, length: int | None, seed: int):
        self.pairs = ReferenceSamples(
            store,
            dates=cfg.data.input_dates,
            truths=None,  # every clear date
            clear_max_cover=cfg.data.clear_target_max_cover,
            **cfg.data.context.sampler_kwargs(),
        )
        self.length = len(self.pairs) if length is None else (length if len(self.pairs) else 0)
        self.crop, self.seed = cfg.data.crop, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        epoch, i = divmod(int(index), self.length)
        rng = np.random.default_rng((self.seed, epoch, i, 4))
        pick = i if self.length == len(self.pairs) else int(rng.integers(len(self.pairs)))
        item = crop_item(self.pairs[pick], rng, self.crop)
        # The loss counts where the reconstructed date is cloudy only: where it is seen, its own
        # observation is its truth, not the other date's (stage 3 keeps a seen date as it is).
        item["pixel_weight"] = (item["target_prob"] >= S2CLOUDLESS_KWARGS["threshold"]).float()
        return item


class PixelWeighted(Dataset):
    """`base`'s items with `pixel_weight` (H, W) ones: every pixel counts in stage 3's loss (the
    samples whose truth is the reconstructed date itself: simulated clouds, pseudo-labels)."""

    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = dict(self.base[index])
        item["pixel_weight"] = torch.ones(item["target"].shape[-2:], dtype=torch.float32)
        return item


NATURAL_CLOUD_MIN_COVER = 0.3  # a date whose cloud NaturalClouds lays on a clear target


def confidence(draws: torch.Tensor, observed: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """A teacher's seeds for one sample -> (label, seed spread, visible error).

    draws (S, 13, H, W): refiner samples of S seeds; observed (13, H, W): the target date's input;
    visible (H, W) bool: pixels the cloud mask calls clear. label = the seeds' mean; spread = mean
    |seed - label| (0 when the seeds agree); visible error = mean |label - observed| over visible
    pixels (inf when none is visible: nothing to check the label against).
    """
    label = draws.mean(0)  # (13, H, W)
    spread = (draws - label).abs().mean().item()
    visible_error = (label - observed).abs().mean(0)[visible].mean().item() if visible.any() else math.inf
    return label, spread, visible_error


def accepted(spread: float, visible_error: float, rule: SelfTraining) -> bool:
    """The self-training acceptance rule (SELF_TRAINING_RULE) with `stage3.self_training` thresholds."""
    return spread <= rule.max_seed_spread and visible_error <= rule.max_visible_error


def _teacher_batches(samples: Dataset, cfg: ModelSetConfig, device: str):
    """The samples in batches of stage 3's batch size, on `device`: the teacher runs every seed of
    a batch in one refiner pass (batch x seeds images), not one image at a time."""
    for batch in DataLoader(samples, batch_size=cfg.stage3.train.batch_size):
        yield {k: v.to(device) for k, v in batch.items()}


@torch.no_grad()
def pseudo_label(pipeline: RefinerPipeline, samples: UnlabelledSamples, cfg: ModelSetConfig, device: str):
    """Label cloudy-only samples with the teacher; keep the confident ones."""
    st = cfg.stage3.self_training
    steps, seeds = cfg.stage2.model.sample_steps, list(range(st.sampler_seeds))
    pipeline.to(device).eval()
    kept, scored = [], []
    for batch in _teacher_batches(samples, cfg, device):
        draws = pipeline.samples(batch, steps=steps, seeds=seeds)  # (S, B, 13, H, W)
        observed = observed_target(batch)
        for b in range(draws.shape[1]):
            index = len(scored)
            label, spread, visible_error = confidence(draws[:, b], observed[b], batch["visible"][b])
            ok = accepted(spread, visible_error, st)
            scored.append(
                {"index": index, "spread": round(spread, 6), "visible_error": round(visible_error, 6), "kept": ok}
            )
            if ok:
                kept.append((index, label.cpu()))
    return kept, scored


@torch.no_grad()
def check_on_labelled(pipeline: RefinerPipeline, samples: Dataset, cfg: ModelSetConfig, device: str) -> dict:
    """The acceptance rule on samples whose truth is known: does it keep the better labels?

    Each sample is labelled and accepted exactly as a cloudy-only one (visible = cloud
    probability below the s2cloudless threshold); reported per group (kept / rejected): count,
    mean PSNR of the label and of the stage-1 draft against the truth, and the gain between them.
    """
    st = cfg.stage3.self_training
    steps, seeds = cfg.stage2.model.sample_steps, list(range(st.sampler_seeds))
    pipeline.to(device).eval()
    groups: dict[str, dict[str, list[float]]] = {g: {"label": [], "draft": []} for g in ("kept", "rejected")}
    for batch in _teacher_batches(samples, cfg, device):
        batch = finish_batch(batch)
        draws, draft = pipeline.samples(batch, steps=steps, seeds=seeds, with_draft=True)
        visible = batch["target_prob"] < S2CLOUDLESS_KWARGS["threshold"]  # (B, H, W)
        observed, truth = observed_target(batch), batch["target"].float()
        draft_psnr = compute_all(draft.clamp(0, 1), truth)["psnr"]  # (B,)
        for b in range(draws.shape[1]):
            label, spread, visible_error = confidence(draws[:, b], observed[b], visible[b])
            group = groups["kept" if accepted(spread, visible_error, st) else "rejected"]
            group["label"].append(float(compute_all(label[None], truth[b : b + 1])["psnr"][0]))
            group["draft"].append(float(draft_psnr[b]))
    report = {}
    for name, values in groups.items():
        n = len(values["label"])
        label_psnr = float(np.mean(values["label"])) if n else None
        draft_psnr = float(np.mean(values["draft"])) if n else None
        report[name] = {
            "samples": n,
            "label_psnr": label_psnr,
            "draft_psnr": draft_psnr,
            "gain_db": label_psnr - draft_psnr if n else None,
        }
    return report


def stage3(
    cfg: ModelSetConfig,
    *,
    train: Path,
    val: Path,
    stage1_ckpt: Path,
    stage2_ckpt: Path,
    device: str,
    wind: WindCache | None = None,
) -> StageTask:
    teacher = build_pipeline(cfg, stage1_ckpt=stage1_ckpt, wind=wind)
    teacher.load_state_dict(load_stage_weights(stage2_ckpt, stage=2))
    st = cfg.stage3.self_training
    unlabelled = UnlabelledSamples(
        train,
        dates=cfg.data.input_dates,
        seed=cfg.stage3.train.seed,
        clear_max_cover=cfg.data.clear_target_max_cover,
        limit=st.max_pseudo_labels,
        **cfg.data.context.sampler_kwargs(),
    )
    # The teacher (stage 1 + the stage-2 refiner) labels before the student takes a step.
    kept, scored = pseudo_label(teacher, unlabelled, cfg, device) if len(unlabelled) else ([], [])
    # The same rule on validation samples, whose truth is known: what the kept labels are worth.
    check = check_on_labelled(teacher, _cloudy(cfg, val, train=False, stage_epochs=1, device=device), cfg, device)
    log.info(
        "stage 3: kept %d of %d pseudo-labels (rejected %d); on validation samples the rule gives %s",
        len(kept),
        len(scored),
        len(scored) - len(kept),
        check,
    )
    del teacher
    # The student: the stage-1 draft model, trainable, under the frozen stage-2 refiner (what
    # ships: its draft refined by stage 2). Its loss is stage 1's L1, on the refined output
    # (loss_on: refined) or the bare draft; it is validated, selected and guarded as the
    # refined output.
    student = build_draft_under_refiner(cfg, draft_ckpt=stage1_ckpt, draft_stage=1, stage2_ckpt=stage2_ckpt, wind=wind)
    # Normalised on the CPU: its batches mix with the pseudo-labelled and natural ones, which are.
    t = cfg.stage3.train
    # with stage 2's share of clear targets: the student keeps a date that is seen as it is
    labelled = _cloudy(
        cfg,
        train,
        train=True,
        stage_epochs=t.epochs,
        device=device,
        raw=False,
        samples_per_epoch=t.samples_per_epoch,
        clear_share=cfg.stage2.clear_share,
    )
    pseudo = PseudoLabelled(unlabelled, kept, crop=cfg.data.crop, seed=cfg.stage3.train.seed)
    natural = (
        NaturalClouds(train, cfg, length=st.natural_clouds, seed=cfg.stage3.train.seed) if st.natural_clouds else None
    )
    pairs = (
        NaturalPairs(train, cfg, length=st.natural_pairs, seed=cfg.stage3.train.seed) if st.natural_pairs != 0 else None
    )
    parts = [labelled, *([pseudo] if kept else []), *([natural] if natural is not None and len(natural) else [])]
    parts = [PixelWeighted(part) for part in parts] + ([pairs] if pairs is not None and len(pairs) else [])
    train_set: Dataset = EpochConcat(parts) if len(parts) > 1 else parts[0]

    def loss(m, batch):  # stage 1's L1 of what m gives (loss_on), over the pixels each truth holds for
        error = (m(batch).float() - batch["target"].float()).abs().mean(dim=1)  # (B, H, W)
        weight = batch["pixel_weight"].to(error.dtype)
        return (error * weight).sum() / weight.sum().clamp_min(1.0)

    _, validate = refiner_objective(cfg.stage2.model.sample_steps)  # the refined output, as stage 2's
    return _on_device(
        StageTask(
            stage=3,
            model=student,
            train_set=train_set,
            val_set=_cloudy(cfg, val, train=False, stage_epochs=1, device=device),
            extra_val=natural_val(cfg, val),
            loss=loss,
            validate=validate,
            validate_initial=True,  # the start (stage 1's draft under the refiner) is stage 2: never ships worse
            summary={
                "natural_pairs": len(pairs) if pairs is not None else 0,
                "natural_clouds": len(natural) if natural is not None else 0,
                "pseudo_labels_scored": len(scored),
                "pseudo_labels_kept": len(kept),
                "pseudo_labels_rejected": len(scored) - len(kept),
                "pseudo_label_check": check,
            },
            artifacts={
                "pseudo_labels": {
                    "scored": len(scored),
                    "kept": len(kept),
                    "rejected": len(scored) - len(kept),
                    "rule": SELF_TRAINING_RULE,
                    "thresholds": {
                        "sampler_seeds": st.sampler_seeds,
                        "max_seed_spread": st.max_seed_spread,
                        "max_visible_error": st.max_visible_error,
                    },
                    "validation_check": check,
                    "samples": scored,
                }
            },
        )
    )

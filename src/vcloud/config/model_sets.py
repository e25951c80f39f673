"""Model and training configuration (config/models/*.yaml): one frozen dataclass per section.

One YAML file per model size. Each section maps onto a frozen dataclass; an unknown key, a
missing required key or a wrong type raises ConfigError naming the file and the key path
(the checks are in config/coerce.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vcloud.config.coerce import from_dict
from vcloud.config.workflow import read_yaml
from vcloud.constants import CLEAR_MAX_COVER
from vcloud.errors import ConfigError


@dataclass(frozen=True)
class ContextConfig:
    """Which other dates a sample takes (data/series.py): one policy for training, our protocols
    and `vcloud predict` (the published protocols keep their own)."""

    # nearest: the dates nearest in days; clearest: the least cloudy within +-window_days, nearer
    # first among equals (the nearest beyond the window fill what it lacks); random: drawn from the
    # whole series (training only; how models were trained before this setting existed).
    policy: Literal["nearest", "clearest", "random"] = "clearest"
    window_days: int = 30  # clearest: the window around the target date, in days (>= 1)

    def sampler_kwargs(self) -> dict:
        """The samplers' keywords (data/samples.py, evaluation/protocols.py, apply/plan.py)."""
        return {"policy": self.policy, "window_days": self.window_days}

    def __post_init__(self) -> None:
        if self.window_days < 1:
            raise ValueError(
                f"window_days: {self.window_days} must be at least 1 (a window of zero days holds no date)"
            )


@dataclass(frozen=True)
class DataConfig:
    """How training samples are drawn from a prepared store."""

    input_dates: int  # T: dates fed to the model per sample; the target date is one of them
    crop: int | None = None  # random square crop in pixels for training; None = whole patch
    num_workers: int = 0  # DataLoader workers; multiprocessing options apply only when > 0
    prefetch_factor: int = 2
    persistent_workers: bool = False
    clear_target_max_cover: float = CLEAR_MAX_COVER  # a date may be a target (ground truth) below this cover
    samples_per_epoch: int | None = None  # random samples per epoch; None = one per location
    val_samples: int | None = None  # fixed validation samples; None = one per location
    # What every stage's output keeps of the date it reconstructs: a pixel whose cloud probability
    # p lies below this is taken from the observation with weight 1 - p / keep_seen_max_prob, the
    # rest from the model (pipeline.keep_seen); None: the model's output everywhere. Off by
    # default: measured on the default data it costs 1-3 dB where the date is not the truth's
    # (fixed protocol's undetected thin cloud, reference protocol's other date; docs/training.md).
    keep_seen_max_prob: float | None = None
    # Training (stages 1-3): the probability that a date's S1 is removed from a sample, each date on
    # its own, marked missing as a date without S1 is (data/samples.py), so that the models know
    # imagery without S1. 0: never (the samples drawn before this key existed).
    s1_dropout: float = 0.0
    # The S2 bands the models take and predict, in order: a preset of vcloud.bands (l1c: the 13
    # Level-1C bands of SEN12MS-CR-TS; l2a: 12, no B10; 10m_20m: 10) or a list of band names. A
    # store of other bands is refused (prepare it with `vcloud prepare --bands`).
    bands: str | tuple[str, ...] = "l1c"
    # The other dates of every sample (ContextConfig): the same in training, evaluation and predict.
    context: ContextConfig = ContextConfig()

    def __post_init__(self) -> None:
        from vcloud.bands import resolve_bands

        resolve_bands(self.bands)  # BandSetError (a ValueError): "bands: ..." names the key
        _check_positive(self, ("input_dates", "prefetch_factor"))
        if not 0.0 <= self.s1_dropout <= 1.0:
            raise ValueError(f"s1_dropout: {self.s1_dropout} is outside [0, 1]")
        if self.keep_seen_max_prob is not None and not 0.0 < self.keep_seen_max_prob <= 1.0:
            raise ValueError(f"keep_seen_max_prob: {self.keep_seen_max_prob} is outside (0, 1]")
        _check_positive(self, ("crop", "samples_per_epoch", "val_samples"), optional=True)
        if self.num_workers < 0:
            raise ValueError(f"num_workers: {self.num_workers} is negative")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation of one stage."""

    epochs: int
    batch_size: int
    lr: float
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0
    bf16: bool = False  # bf16 autocast (device "cuda"; on CPU only where requested explicitly)
    seed: int = 0
    # This stage's random training samples per epoch; None = data.samples_per_epoch. Stage 2 of
    # the small config needs many more optimizer steps than the others, not more validations.
    samples_per_epoch: int | None = None
    # TensorBoard event files in results/stage<n>/tensorboard/ (rank 0). Not part of the stage
    # hash: switching it never restarts a stage.
    tensorboard: bool = True

    def __post_init__(self) -> None:
        _check_positive(self, ("epochs", "batch_size"))
        _check_positive(self, ("samples_per_epoch",), optional=True)
        if not self.lr > 0:
            raise ValueError(f"lr: {self.lr} must be > 0")


@dataclass(frozen=True)
class AutoencoderConfig:
    """Stage 0: convolutional autoencoder on the 13 S2 bands."""

    widths: tuple[int, ...] = (32, 64, 128)  # channels per level; len - 1 downsamplings by 2
    latent_channels: int = 8
    blocks_per_level: int = 1  # residual blocks per level, in the encoder and in the decoder
    mid_blocks: int = 0  # extra residual blocks at the bottom of the encoder and of the decoder

    def __post_init__(self) -> None:
        _check_widths(self)
        _check_positive(self, ("latent_channels", "blocks_per_level"))
        if self.mid_blocks < 0:
            raise ValueError(f"mid_blocks: {self.mid_blocks} is negative")


@dataclass(frozen=True)
class Optimisations:
    """The memory optimisations of the LUMI field report (bf16 lives in TrainConfig)."""

    grad_checkpoint: bool = False  # checkpoint the per-date encoder and the change gate
    gate_resolution: int | None = None  # change gate at this resolution (64), bilinear back up
    target_only_pyramid: bool = False  # full pyramid only for the target date
    gate_chunk: int | None = None  # date pairs per change-gate chunk (64)

    def __post_init__(self) -> None:  # runs at import (CFDTConfig's default): no module helpers
        for name in ("gate_resolution", "gate_chunk"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name}: {value} must be > 0")


@dataclass(frozen=True)
class CFDTConfig:
    """Stage 1: cloud-free draft transformer over T dates."""

    widths: tuple[int, int, int, int] = (32, 64, 128, 256)  # 4-level pyramid
    blocks_per_level: int = 1  # residual blocks per level, in the encoder and in the decoder
    tmt_layers: int = 2  # temporal attention layers at the coarsest level
    tmt_heads: int = 4
    tmt_mlp_ratio: float = 4.0  # hidden width of the TMT MLPs, as a multiple of widths[3]
    gate_width: int = 32  # channels of the change-gate CNN
    gate_layers: int = 2  # 3x3 conv layers of the change-gate CNN on each date pair
    day_embedding: int = 32  # channels of the day-offset embedding
    wind_scan: bool = False  # wind-ordered token mixing in the TMT (needs the wind cache)
    wind_sectors: int = 16  # wind sectors of the scan orders (sector i: angle 2*pi*i/S from east)
    wind_allow_recompute: bool = False  # one process only: compute missing orders in memory, with a warning
    optimisations: Optimisations = Optimisations()
    # The clear-sky prior the decoder corrects (models/cfdt.py): soft, every date weighted by its
    # clarity (cloudy pixels too, less); clear, per pixel the mean of the other dates' clear values
    # (cloud probability below the threshold), weighted by the gate: the composite a user makes by
    # hand (the soft weights where no other date is clear); what the target shows is the decoder's.
    prior: Literal["soft", "clear"] = "soft"

    def __post_init__(self) -> None:
        _check_widths(self)
        _check_positive(
            self, ("blocks_per_level", "tmt_layers", "tmt_heads", "gate_width", "gate_layers", "wind_sectors")
        )
        if self.widths[-1] % self.tmt_heads:
            raise ValueError(f"tmt_heads: {self.tmt_heads} does not divide widths[3] = {self.widths[-1]}")
        if self.day_embedding <= 0 or self.day_embedding % 2:
            raise ValueError(f"day_embedding: {self.day_embedding} must be a positive even number")
        if not self.tmt_mlp_ratio > 0:
            raise ValueError(f"tmt_mlp_ratio: {self.tmt_mlp_ratio} must be > 0")


@dataclass(frozen=True)
class RefinerConfig:
    """Stage 2: conditional diffusion of the stage-1 draft's pixel residual."""

    widths: tuple[int, ...] = (64, 128)  # UNet channels per level; len - 1 downsamplings by 2
    blocks_per_level: int = 1
    patch: int = 2  # pixel-unshuffle factor in front of the UNet (space-to-depth, lossless)
    timesteps: int = 1000  # training noise levels
    sample_steps: int = 4  # deterministic (DDIM) steps at evaluation
    # Diffusion samples averaged into one prediction (each from its own noise, all from the
    # call's seed): their mean estimates the posterior mean, which PSNR rewards; 1 = one sample.
    ensemble: int = 1
    schedule: Literal["cosine", "linear"] = "cosine"  # noise schedule (betas)
    # Initial noise of each draw times this (1: the model's distribution; below 1: nearer its mode).
    temperature: float = 1.0
    # Noise levels trained on: "sampler" = only the sample_steps levels DDIM visits (a few-step
    # model trains exactly what it samples with); "all" = every one of the timesteps.
    train_levels: Literal["sampler", "all"] = "sampler"

    def __post_init__(self) -> None:
        _check_widths(self)
        _check_positive(self, ("blocks_per_level", "patch", "timesteps", "sample_steps", "ensemble"))
        if not self.temperature > 0:
            raise ValueError(f"temperature: {self.temperature} must be > 0")
        if self.sample_steps > self.timesteps:
            raise ValueError(f"sample_steps: {self.sample_steps} exceeds timesteps ({self.timesteps})")


@dataclass(frozen=True)
class Curriculum:
    """Stage 1 curriculum by epoch fraction: thin_only < mixed_from <= mixed < all_from <= all."""

    mixed_from: float = 0.3
    all_from: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 <= self.mixed_from <= self.all_from <= 1.0:
            raise ValueError(f": need 0 <= mixed_from ({self.mixed_from}) <= all_from ({self.all_from}) <= 1")


@dataclass(frozen=True)
class SelfTraining:
    """Stage 3: which teacher pseudo-labels are kept."""

    sampler_seeds: int = 3  # refiner samples per pseudo-label; their spread measures confidence
    max_seed_spread: float = 0.02  # mean |difference| between seeds (S2 0..1 scale)
    max_visible_error: float = 0.05  # mean |error| on pixels the cloud mask calls clear
    max_pseudo_labels: int | None = None  # cap on unlabelled samples scored
    # Clear training targets under the clouds of the data's own cloudy dates, this many per epoch
    # in the student's mix (train/stages.py NaturalClouds); 0: none. Measured on the default data
    # (48, 2026-11-25): +0.18 dB on fixed validation, -0.04 reference, -0.14 uncrtaints: off.
    natural_clouds: int = 0
    # Natural pairs per epoch in the student's mix (train/stages.py NaturalPairs): the reference
    # protocol's construction on the train split (a clear date the truth, the T usable dates
    # nearest to it with their own clouds the input); None: every pair of the split once per epoch;
    # 0: none. What makes stage 3 gain on natural clouds (docs/training.md, stage 3).
    natural_pairs: int | None = 0
    # What the student's L1 is on: "draft", its draft; "refined", one draw of the draft refined
    # by the frozen stage-2 refiner with the seen pixels kept (what stage 3 ships), the gradient
    # through the refiner's sampler (docs/training.md, stage 3).
    loss_on: Literal["draft", "refined"] = "refined"
    # "refined": the sampler's last steps the gradient goes through (the earlier ones run without
    # a graph); null: every step. Measured on the default data (2026-11-25, 2 steps): the last
    # step alone gains as much as both (docs/training.md, stage 3) at a fraction of the cost at
    # full scale (8 steps: 7 refiner passes without a graph, 1 with).
    grad_steps: int | None = 1

    def __post_init__(self) -> None:
        if self.natural_pairs is not None and self.natural_pairs < 0:
            raise ValueError(f"natural_pairs: {self.natural_pairs} must be >= 0 or null")
        if self.grad_steps is not None and self.grad_steps < 1:
            raise ValueError(f"grad_steps: {self.grad_steps} must be >= 1 or null")


# The reference's region subsets (data.layout.REGIONS, plus all; a test checks they agree).
UncrtaintsRegion = Literal["all", "africa", "america", "asiaEast", "asiaWest", "europa"]


@dataclass(frozen=True)
class UncrtaintsProtocol:
    """Protocol `uncrtaints` of `vcloud evaluate`: the reference loader's fixed sampler."""

    dates: int = 3  # T input dates (the reference's n_input_samples)
    region: UncrtaintsRegion = "all"
    min_cov: float = 0.0  # inputs: the first T dates whose cloud coverage lies in [min_cov, max_cov]
    max_cov: float = 1.0
    pairs: str | None = None  # the released pairing file (.npy) or its JSON conversion; None = computed

    def __post_init__(self) -> None:  # runs at import (EvaluationConfig's default): no module helpers
        if self.dates < 1:
            raise ValueError(f"dates: {self.dates} must be >= 1")
        if not 0.0 <= self.min_cov <= self.max_cov <= 1.0:
            raise ValueError(f": need 0 <= min_cov ({self.min_cov}) <= max_cov ({self.max_cov}) <= 1")


@dataclass(frozen=True)
class EvaluationConfig:
    """`vcloud evaluate`: settings of the protocols. The stages that validate on the natural-cloud
    protocols (stage_hash.NATURAL_VALIDATION_KEYS) depend on `uncrtaints` and `reference_truths`."""

    uncrtaints: UncrtaintsProtocol = UncrtaintsProtocol()
    # Protocol reference: ground truths per location, evenly spaced among its clear dates (1: the
    # least-cloudy date only, as the reference loader; the small config takes 6: 57 test and 19
    # validation samples of natural clouds from its 12 + 4 locations).
    # all: every clear date (a store of your own imagery always takes every clear date).
    reference_truths: int | Literal["all"] = 1
    nearest_clear_max_cover: float = 0.05  # nearest-clear-date baseline: a date is clear at most this cover
    # The series baselines of our protocols (evaluation/series_baselines.py): the clear-pixel median
    # and the least cloudy date within +-this many days of the reconstructed date. 30: the best window
    # of the clear-pixel median on the shared real series (../shared/GAPFILL.md: +-15/30/60/120 days
    # 27.41/28.49/27.36/25.65 dB).
    series_window_days: int = 30

    def __post_init__(self) -> None:
        if self.reference_truths != "all" and self.reference_truths < 1:
            raise ValueError(f"reference_truths: {self.reference_truths} must be >= 1")
        if self.series_window_days < 1:
            raise ValueError(f"series_window_days: {self.series_window_days} must be at least 1")
        if not 0.0 <= self.nearest_clear_max_cover <= 1.0:
            raise ValueError(f"nearest_clear_max_cover: {self.nearest_clear_max_cover} is outside 0..1")


@dataclass(frozen=True)
class Stage0Config:
    model: AutoencoderConfig
    train: TrainConfig


@dataclass(frozen=True)
class Stage1Config:
    model: CFDTConfig
    train: TrainConfig
    curriculum: Curriculum = Curriculum()
    # Start the per-date encoder's first level (stem S2 weights and level-0 blocks) from stage 0's
    # autoencoder (registry: stage 1 then builds on stage 0). Measured in docs/training.md.
    init_from_stage0: bool = False
    # The untrained draft is exactly the clear-sky composite of its inputs (the change gate's and the
    # decoder's last layers start at zero: every date weighted by its clarity alone, no correction),
    # and that start is validated as epoch -1: best.pt is the composite until an epoch beats it on
    # val, so stage 1 never ships what validates worse than the simple answer of its own inputs.
    start_from_composite: bool = False


@dataclass(frozen=True)
class Stage2Config:
    model: RefinerConfig
    train: TrainConfig
    # Share of the refiner's training samples (stages 2 and 3) whose target date gets no synthetic
    # cloud: with none, it never sees a clear date and "corrects" one it is given (README, Quality).
    clear_share: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.clear_share < 1.0:
            raise ValueError(f"clear_share: {self.clear_share} is outside [0, 1)")


@dataclass(frozen=True)
class Stage3Config:
    train: TrainConfig
    self_training: SelfTraining = SelfTraining()


@dataclass(frozen=True)
class ModelSetConfig:
    """A whole config/models/*.yaml file."""

    name: str
    data: DataConfig
    stage0: Stage0Config
    stage1: Stage1Config
    stage2: Stage2Config
    stage3: Stage3Config
    evaluation: EvaluationConfig = EvaluationConfig()

    def __post_init__(self) -> None:
        if self.stage1.init_from_stage0:
            ae, cfdt = self.stage0.model, self.stage1.model
            if (ae.widths[0], ae.blocks_per_level) != (cfdt.widths[0], cfdt.blocks_per_level):
                raise ValueError(
                    f"stage1.init_from_stage0: stage0.model's first level (width {ae.widths[0]}, "
                    f"{ae.blocks_per_level} blocks) must equal stage1.model's (width {cfdt.widths[0]}, "
                    f"{cfdt.blocks_per_level} blocks)"
                )


def load_model_config(path: Path) -> ModelSetConfig:
    """Read and check a config/models/*.yaml file; errors name the file and the key."""
    path = Path(path)
    data = model_config_data(path)
    try:
        return from_dict(ModelSetConfig, data, "")
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def model_config_data(path: Path, *, seen: tuple = ()) -> dict:
    """The mapping of a model config file. A derived config names its base (`based_on:` a file
    beside it) and holds only what it changes: the base's keys, changed key by key through the
    one override mechanism (vcloud.config.overlay), where a key the base lacks is refused."""
    from vcloud.config.overlay import overlay

    path = Path(path)
    data = read_yaml(path, missing="model configuration file not found")
    if not isinstance(data, dict) or "based_on" not in data:
        return data
    base_path = path.parent / str(data.pop("based_on"))
    if base_path.resolve() in seen or base_path.resolve() == path.resolve():
        raise ConfigError(f"{path}: based_on: {base_path.name} derives from itself")
    base = model_config_data(base_path, seen=(*seen, path.resolve()))
    try:
        return overlay(base, data, strict=True)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err} (in {base_path.name}, which it is based on)") from None


def config_to_dict(config) -> dict:
    """Plain, JSON-able dict of a config dataclass or mapping (stored in checkpoints)."""
    import dataclasses

    data = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config
    return json.loads(json.dumps(data))


def _check_widths(obj) -> None:
    if not obj.widths or any(w <= 0 for w in obj.widths):
        raise ValueError(f"widths: {list(obj.widths)} must be a non-empty list of positive integers")


def _check_positive(obj, names, *, optional: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        if optional and value is None:
            continue
        if not value > 0:
            raise ValueError(f"{name}: {value} must be > 0")

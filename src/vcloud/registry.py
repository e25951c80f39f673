"""The stage registry: one declaration per training stage.

Every place that needs to know what a stage is reads it from here: the workflow's input
functions (which checkpoints a rule takes), the stage hash (whose model settings a stage
depends on), `vcloud train` (which `--stage<n>` checkpoints it needs and which builder makes
the task), `vcloud evaluate` and the viewer (which checkpoints a predictor needs and which
function builds it) and bench/bench_stages.py.

Adding a stage: declare it in STAGES, write its model and its config section (a `stage<n>`
field of config.ModelSetConfig), its builder in train/stages.py and its predictor in
evaluation/predict.py. Nothing else names stage numbers.

This module imports nothing heavy (snakemake reads it while parsing the workflow): builders
and predictors are named as "module:function" and imported when used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from vcloud.errors import ConfigError


@dataclass(frozen=True)
class Stage:
    number: int
    upstream: tuple[int, ...]  # best.pt of these stages are inputs of its training
    predictor_needs: tuple[int, ...]  # best.pt of these stages make its predictions
    reads_wind: bool  # takes the wind cache when stage1.model.wind_scan is on
    builder: str  # "module:function" (cfg, *, train, val, ...) -> trainer.StageTask
    predictor: str  # "module:function" (cfg, checkpoints, wind) -> (batch -> (B, 13, H, W))
    # The builder takes the training device: it runs models itself (stage 3's teacher) or picks
    # where s2cloudless runs on the clouded targets (stages 1-3, train/stages.py detect_on).
    needs_device: bool = False
    viewer_label: str | None = None  # a layer and method of the viewer under this label; None: not shown
    # The config section whose `model` this stage trains (its weights and Adam state are what its
    # checkpoints hold); None: its own. Stage 3 fine-tunes the stage-2 refiner.
    trains: str | None = None
    # Its best checkpoint is chosen (and guarded) on the natural-cloud protocols of the val split
    # too (train/stages.py natural_val): its hash then holds the evaluation keys they read.
    validates_natural: bool = False
    # A stage whose weights start this one's when the config's `<name>.init_from_stage<k>` is on:
    # then its best.pt is an input of this stage's training and its identity is in this hash.
    init_from: int | None = None

    @property
    def model_section(self) -> str:
        """`<section>.model` of the model config: the model this stage trains."""
        return self.trains or self.name

    @property
    def name(self) -> str:
        """The config key, the folder results/<name>/, the suffix of its rules."""
        return f"stage{self.number}"

    @property
    def train_rule(self) -> str:
        return f"train_{self.name}"

    @property
    def evaluate_rule(self) -> str:
        return f"evaluate_{self.name}"

    def builds_on(self, cfg) -> tuple[int, ...]:
        """The stages whose best.pt its training reads under `cfg`: `upstream`, and `init_from`
        when the config turns that on."""
        if self.init_from is not None and getattr(getattr(cfg, self.name), f"init_from_stage{self.init_from}"):
            return (*self.upstream, self.init_from)
        return self.upstream

    def build(self, cfg, *, train, val, checkpoints: dict, wind=None, device=None):
        """The stage's training task; `checkpoints` maps the stages it builds on to best.pt."""
        kwargs = {"train": train, "val": val}
        kwargs.update({f"stage{n}_ckpt": checkpoints[n] for n in self.builds_on(cfg)})
        if self.reads_wind:
            kwargs["wind"] = wind
        if self.needs_device:
            kwargs["device"] = device
        return resolve(self.builder)(cfg, **kwargs)

    def make_predictor(self, cfg, checkpoints: dict, wind=None):
        """batch -> (B, 13, H, W) prediction; `checkpoints` maps stage numbers to best.pt."""
        return resolve(self.predictor)(cfg, {n: checkpoints[n] for n in self.predictor_needs}, wind)

    def upstream_checkpoints(self, checkpoints: dict, cfg) -> dict:
        """{n: best.pt} of the stages its training builds on; ConfigError naming a missing one."""
        return require_checkpoints(self.builds_on(cfg), checkpoints, command=f"vcloud train --stage {self.number}")


_BUILDERS = "vcloud.train.stages"
_PREDICTORS = "vcloud.evaluation.predict"

# Rules: train_stage0 train_stage1 train_stage2 train_stage3 (workflow/rules/train.smk) and
# evaluate_stage0 evaluate_stage1 evaluate_stage2 evaluate_stage3 (workflow/rules/export.smk).
STAGES: tuple[Stage, ...] = (
    # stage 0: autoencoder of clear S2 images; scored on reconstructing the ground truth
    Stage(0, upstream=(), predictor_needs=(0,), reads_wind=False,
          builder=f"{_BUILDERS}:stage0", predictor=f"{_PREDICTORS}:autoencoder"),
    # stage 1: CFDT draft over T dates; its per-date encoder's first level starts from stage 0's
    # autoencoder when stage1.init_from_stage0 (both shipped configs)
    Stage(1, upstream=(), predictor_needs=(1,), reads_wind=True,
          builder=f"{_BUILDERS}:stage1", predictor=f"{_PREDICTORS}:draft", needs_device=True,
          viewer_label="stage 1 draft", validates_natural=True, init_from=0),
    # stage 2: pixel-space diffusion refiner of the frozen stage-1 draft (stage 0 not used)
    Stage(2, upstream=(1,), predictor_needs=(1, 2), reads_wind=True,
          builder=f"{_BUILDERS}:stage2", predictor=f"{_PREDICTORS}:refined", needs_device=True,
          viewer_label="stage 2 refined", validates_natural=True),
    # stage 3: self-training (teacher: stages 1-2); the student is the stage-2 refiner, fine-tuned
    # on labelled + pseudo-labelled samples; predicts as the stage-1 draft refined by it
    Stage(3, upstream=(1, 2), predictor_needs=(1, 3), reads_wind=True,
          builder=f"{_BUILDERS}:stage3", predictor=f"{_PREDICTORS}:refined", needs_device=True,
          viewer_label="stage 3 output", trains="stage2", validates_natural=True),
)  # fmt: skip

STAGE_NUMBERS: tuple[int, ...] = tuple(stage.number for stage in STAGES)
VIEWER_STAGES: tuple[int, ...] = tuple(stage.number for stage in STAGES if stage.viewer_label)


def get_stage(number: int) -> Stage:
    """The declaration of stage `number`; ConfigError naming the known stages otherwise."""
    for stage in STAGES:
        if stage.number == number:
            return stage
    raise ConfigError(f"no stage {number} (stages: {', '.join(map(str, STAGE_NUMBERS))})")


def resolve(target: str) -> Callable:
    """The function named "module:function"."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def require_checkpoints(needed, checkpoints: dict, *, command: str) -> dict:
    """{n: path} of the `needed` stages; ConfigError naming the missing --stage<n> flags."""
    missing = [f"--stage{n}" for n in needed if checkpoints.get(n) is None]
    if missing:
        raise ConfigError(f"{command} needs {' and '.join(missing)} CHECKPOINT")
    return {n: checkpoints[n] for n in needed}

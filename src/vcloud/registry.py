"""The stage registry: one declaration per training stage, the whole stage.

Every place that needs to know what a stage is reads it from here: the workflow's rules and
their paths (results/<folder>/), input functions (which checkpoints a rule takes) and default
resources, the config schema (rule entries by pattern), the stage hash (what a stage depends
on), `vcloud train` (which `--stage<n>` checkpoints it needs and which builder makes the task),
`vcloud evaluate` and the viewer (which checkpoints a predictor needs, which function builds it,
its layer), the bill and the doctor (the model a stage trains, its folder), the report (its
label, the stage of a rule) and bench/.

Adding a stage: declare it in STAGES, give it its config section (a `stage<n>` field of
config.ModelSetConfig and a block in config/models/*.yaml) and its builder in train/stages.py
(docs/ARCHITECTURE.md counts the files). Nothing else names stage numbers.

This module imports nothing heavy (snakemake reads it while parsing the workflow): builders
and predictors are named as "module:function" and imported when used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

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
    # checkpoints hold); None: its own. Stage 3 fine-tunes the stage-1 draft model (CFDT).
    trains: str | None = None
    # Its best checkpoint is chosen (and guarded) on the natural-cloud protocols of the val split
    # too (train/stages.py natural_val): its hash then holds the evaluation keys they read.
    validates_natural: bool = False
    # A stage whose weights start this one's when the config's `<name>.init_from_stage<k>` is on:
    # then its best.pt is an input of this stage's training and its identity is in this hash.
    init_from: int | None = None
    # Results folder under paths.results (best.pt, latest.pt, metrics.jsonl); "": its name. Every
    # path of it is made here (Stage.folder): runs.smk, the doctor, bench/ and the report follow.
    folder: str = ""
    # What the stage makes, in words: the report's curves, bench/bench_stages.py's method names.
    label: str = ""
    # Changes to DEFAULT_RESOURCES of its rules: {"train" | "evaluate": {"local" | "cluster": {...}}};
    # a config's resources.<rule> entry overrides both, key by key.
    resources: Mapping = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.folder:
            object.__setattr__(self, "folder", self.name)

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

    @property
    def rules(self) -> dict[str, str]:
        """{"train": train_stage<n>, "evaluate": evaluate_stage<n>}: the rules made for it."""
        return {"train": self.train_rule, "evaluate": self.evaluate_rule}

    def rule_resources(self, kind: str, *, cluster: bool) -> dict:
        """The default resources entry of its `kind` ("train", "evaluate") rule, on a cluster
        (config with a cluster section: LUMI's GPU partition) or locally. The cluster's lie over
        the local ones, as config/lumi.yaml over config/config.yaml (mem_mb then serves a CPU run
        of the rule, gpus: 0)."""
        own = self.resources.get(kind, {})
        entry = {**DEFAULT_RESOURCES[kind]["local"], **own.get("local", {})}
        if cluster:
            entry.update({**DEFAULT_RESOURCES[kind]["cluster"], **own.get("cluster", {})})
        return entry

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


# Resources of a stage's rules unless its entry or the config says otherwise: "local" (a laptop,
# config/config.yaml) and "cluster" (config/lumi.yaml: one LUMI GCD on small-g; runtime in
# minutes; epoch_minutes, the configured estimate of an epoch, sets the training retries).
DEFAULT_RESOURCES = {
    "train": {
        "local": {"runtime": 60, "mem_mb": 4000, "threads": 2},
        "cluster": {"runtime": 4320, "mem_mb_per_gpu": 60000, "threads": 7, "partition": "small-g", "gpus": 1},
    },
    "evaluate": {
        "local": {"runtime": 60, "mem_mb": 4000, "threads": 1},
        "cluster": {"runtime": 240, "mem_mb_per_gpu": 60000, "threads": 7, "partition": "small-g", "gpus": 1},
    },
}


def _on_lumi(**train) -> dict:
    """A stage's own training resources on the cluster."""
    return {"train": {"cluster": train}}


_BUILDERS = "vcloud.train.stages"
_PREDICTORS = "vcloud.evaluation.predict"

# Rules: train_stage0 train_stage1 train_stage2 train_stage3 (workflow/rules/train.smk) and
# evaluate_stage0 evaluate_stage1 evaluate_stage2 evaluate_stage3 (workflow/rules/evaluate.smk).
STAGES: tuple[Stage, ...] = (
    # stage 0: autoencoder of clear S2 images; scored on reconstructing the ground truth
    Stage(
        0,
        upstream=(),
        predictor_needs=(0,),
        reads_wind=False,
        builder=f"{_BUILDERS}:stage0",
        predictor=f"{_PREDICTORS}:autoencoder",
        label="reconstruction of clear target",
    ),
    # stage 1: CFDT draft over T dates; its per-date encoder's first level starts from stage 0's
    # autoencoder when stage1.init_from_stage0 (both shipped configs)
    Stage(
        1,
        upstream=(),
        predictor_needs=(1,),
        reads_wind=True,
        builder=f"{_BUILDERS}:stage1",
        predictor=f"{_PREDICTORS}:draft",
        needs_device=True,
        viewer_label="stage 1 draft",
        validates_natural=True,
        init_from=0,
        label="draft",
    ),
    # stage 2: pixel-space diffusion refiner of the frozen stage-1 draft (stage 0 not used)
    Stage(
        2,
        upstream=(1,),
        predictor_needs=(1, 2),
        reads_wind=True,
        builder=f"{_BUILDERS}:stage2",
        predictor=f"{_PREDICTORS}:refined",
        needs_device=True,
        viewer_label="stage 2 refined",
        validates_natural=True,
        label="refined",
    ),
    # stage 3: self-training on natural clouds (teacher: stages 1-2); the student is the stage-1
    # CFDT draft model, fine-tuned on simulated clouds, kept pseudo-labels and natural pairs under
    # the frozen stage-2 refiner; predicts as its own draft refined by stage 2
    Stage(
        3,
        upstream=(1, 2),
        predictor_needs=(2, 3),
        reads_wind=True,
        builder=f"{_BUILDERS}:stage3",
        predictor=f"{_PREDICTORS}:redrafted",
        needs_device=True,
        viewer_label="stage 3 output",
        trains="stage1",
        validates_natural=True,
        label="self-trained",
        resources=_on_lumi(runtime=2880),
    ),
)

STAGE_NUMBERS: tuple[int, ...] = tuple(stage.number for stage in STAGES)
VIEWER_STAGES: tuple[int, ...] = tuple(stage.number for stage in STAGES if stage.viewer_label)


def get_stage(number: int) -> Stage:
    """The declaration of stage `number`; ConfigError naming the known stages otherwise."""
    for stage in STAGES:
        if stage.number == number:
            return stage
    raise ConfigError(f"no stage {number} (stages: {', '.join(map(str, STAGE_NUMBERS))})")


def stage_of_rule(rule: str) -> Stage | None:
    """The stage whose train or evaluate rule `rule` is, else None."""
    for stage in STAGES:
        if rule in stage.rules.values():
            return stage
    return None


def stage_resources(config: dict) -> dict[str, dict]:
    """Every stage rule's resources entry under the workflow `config`: the registry's default
    (cluster or local, by the config's cluster section) updated by the config's own entry."""
    section = config.get("cluster") or {}
    given = config.get("resources") or {}
    site = site_gpu_defaults(section)
    rehearsal = config.get("rehearsal") or {}
    out = {}
    for stage in STAGES:
        for kind, rule in stage.rules.items():
            entry = {**stage.rule_resources(kind, cluster=bool(section)), **(site if section else {})}
            rehearsing = section and rehearsal.get("enabled")
            if rehearsing:
                entry.update(rehearsal_defaults(section, rehearsal, kind, stage.number))
            entry.update(given.get(rule) or {})
            if rehearsing and kind == "train":  # the run file's estimate is the full run's epoch
                entry["epoch_minutes"] = rehearsal.get("epoch_minutes", 4)
            out[rule] = entry
    return out


def rehearsal_defaults(section: dict, rehearsal: dict, kind: str, number: int) -> dict:
    """A stage rule's request in the site's rehearsal (config/rehearsal.yaml): one GPU of the
    site's rehearsal partition and QOS (cluster.placement), short wall times, one short epoch,
    and the forced wall-time warning on one stage's training. A config's own entry changes them
    key by key, except the epoch estimate: the run file's is the full run's, so the rehearsal
    section's `epoch_minutes` holds in a rehearsal."""
    placement = section.get("placement") or {}
    found = {"partition": placement.get("rehearsal") or placement.get("gpu") or "dev-g", "gpus": 1}
    if placement.get("rehearsal_qos"):
        found["qos"] = placement["rehearsal_qos"]
    if kind == "train":
        found["runtime"] = rehearsal.get("train_minutes", 12)
        if rehearsal.get("warn_stage", 1) == number:
            found["rehearse_warning"] = rehearsal.get("warn_after", 150)
    else:
        found["runtime"] = rehearsal.get("evaluate_minutes", 6)
    return found


def site_gpu_defaults(section: dict) -> dict:
    """A stage rule's request on the cluster's site (its GPU placement and per-GPU memory and
    cores, config/sites/<site>.yaml) where the site file says; {} keeps DEFAULT_RESOURCES."""
    placement, rules = section.get("placement") or {}, section.get("gpu_rules") or {}
    found = {key: rules[key] for key in ("mem_mb_per_gpu", "threads") if key in rules}
    if "threads" in rules:
        found["cpus_per_gpu"] = rules["threads"]  # the cores each GPU gets on SLURM
    if placement.get("gpu"):
        found["partition"] = placement["gpu"]
    return found


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

"""Research runs: the workflow config's `experiments:` and `seeds:` as runs, one per pair.

An experiment is a name and changes of model-config keys (config/models/*.yaml), applied by the
one override mechanism (vcloud.config.overlay, strict: a key the model config lacks is refused).
A seed sets every stage's `train.seed` (what each stage draws its training samples, clouds and
initial weights from), nothing else: the splits, the fixed protocol's samples, the viewer's
choice and the synthetic data have seeds of their own in the workflow config.

Without either key (the default) there is one run whose files lie where a single run's always
have (`results/stage<n>/...`); with either, each run's files lie under
`results/<experiment>/seed<k>/` (`results/<experiment>/` with experiments but no seeds), and a run's stage, evaluation, fixed protocol or wind cache whose
identity an earlier run (table order: experiments, then seeds) already has is read from that
run's folder instead of being made again (vcloud.config.identities.run_paths; docs/workflow.md,
"Experiments and seeds").
A rehearsal (`rehearsal.enabled`) of such a config tries one run of it, not the grid: the
experiment `rehearsal.experiment` names (else compare's baseline) under the first seed, with the
rehearsal's epochs and samples, its files where a single run's lie (rehearsed_run).
Every problem is one ConfigError naming the key, raised while the workflow is parsed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from vcloud.config.coerce import from_dict
from vcloud.config.model_sets import ModelSetConfig, model_config_data
from vcloud.config.overlay import overlay
from vcloud.errors import ConfigError
from vcloud.registry import STAGES

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# Folders a run's results folder holds beside the experiments' (results/<name>/...).
RESERVED_NAMES = frozenset(
    {"prepared", "eval", "wind", "viewer", "report", "bundle", "predict", "rehearsal", "compare"}
    | {stage.folder for stage in STAGES}
)
# Model-config keys no experiment may change: the model set's name (the bundle's file name) and
# the evaluation section, which fixes the protocols' samples that every run is scored on.
SHARED_MODEL_KEYS = ("name", "evaluation")
# What a single run does and a grid of runs does not: (config section, why), refused together.
SINGLE_RUN_KEYS = (("predict", "predictions apply one run's model, not a grid's"),)
# What the rehearsal's model config (config/models/rehearsal.yaml) sets for a short run, and an
# experiment's changes of which a rehearsal leaves out: it tries the experiment's settings for one
# short epoch per stage, not its schedule (an experiment's 200 epochs would not fit dev-g's 3 h).
REHEARSAL_SIZES = ("data.samples_per_epoch", "data.val_samples") + tuple(
    f"{stage.name}.train.{key}" for stage in STAGES for key in ("epochs", "samples_per_epoch")
)
# The experiment a run without an `experiments:` table belongs to (several seeds of one config).
DEFAULT_EXPERIMENT = "base"


@dataclass(frozen=True)
class Run:
    """One experiment under one seed."""

    experiment: str
    seed: int | None  # None: the model config's own training seeds (no `seeds:` list)
    prefix: str  # "" (a single run), "/<experiment>/seed<k>", or "/<experiment>" without seeds
    changes: dict = field(compare=False)  # model-config changes: the experiment's, then the seed's
    model_set: ModelSetConfig = field(compare=False)


def is_research(config: dict) -> bool:
    """Experiments or seeds given: each run under results/<experiment>/seed<k>/."""
    return bool(config.get("experiments")) or config.get("seeds") is not None


def plan_runs(config: dict, model_config: Path) -> list[Run]:
    """The runs of a (validated) workflow config over the model config `model_config`; a
    rehearsal's (rehearsal.enabled) the one run of the grid it tries."""
    base = model_config_data(Path(model_config))
    experiments = _experiments(config, base)
    seeds = _seeds(config)
    if not is_research(config):
        single = Run(DEFAULT_EXPERIMENT, None, "", {}, _model_set(base, {}, "model_config"))
        rehearsed_run(config, [single])  # a rehearsal.experiment other than the one run's is refused
        return [single]
    for key, what in SINGLE_RUN_KEYS:
        if (config.get(key) or {}).get("enabled"):
            raise ConfigError(f"{key}.enabled: {what}; leave experiments and seeds out of its config")
    runs = []
    for where, name, changes in experiments:
        for seed in seeds:
            combined = overlay(changes, _seed_changes(seed)) if seed is not None else changes
            model_set = _model_set(base, combined, where)
            runs.append(Run(name, seed, f"/{name}/seed{seed}" if seed is not None else f"/{name}", combined, model_set))
    baseline(config, runs)  # refused here, with the rest, when it names no experiment
    if runs[0].model_set.evaluation.uncrtaints.pairs is not None:  # evaluation: the same in every run
        raise ConfigError(
            f"{model_config}: evaluation.uncrtaints.pairs: research runs score the val split too, and a "
            "pairing file is one split's; leave it null (the pairs computed from each store)"
        )
    chosen = rehearsed_run(config, runs)
    if (config.get("rehearsal") or {}).get("enabled"):
        changes, _ = _without_sizes(chosen.changes)
        return [replace(chosen, prefix="", changes=changes, model_set=_model_set(base, changes, "rehearsal"))]
    return runs


def rehearsed_run(config: dict, runs: list[Run]) -> Run:
    """The run of the grid `runs` a rehearsal tries: the first seed of `rehearsal.experiment`,
    else of compare's baseline (the experiment the others are judged against)."""
    names = list(dict.fromkeys(run.experiment for run in runs))
    chosen = (config.get("rehearsal") or {}).get("experiment")
    if chosen is None:
        return baseline_run(config, runs)
    if chosen not in names:
        raise ConfigError(f"rehearsal.experiment: {chosen!r} is not an experiment ({', '.join(names)})")
    return next(run for run in runs if run.experiment == chosen)


def rehearsal_note(config: dict, model_config: Path) -> str | None:
    """What a rehearsal of a research config tries, for its bill and summary; None otherwise."""
    if not ((config.get("rehearsal") or {}).get("enabled") and is_research(config)):
        return None
    grid = plan_runs({**config, "rehearsal": {**config["rehearsal"], "enabled": False}}, model_config)
    run = rehearsed_run(config, grid)
    experiments = len({r.experiment for r in grid})
    seed = "the model config's seeds" if run.seed is None else f"seed {run.seed}"
    how = "rehearsal.experiment" if (config.get("rehearsal") or {}).get("experiment") else "compare's baseline"
    _, left_out = _without_sizes(run.changes)
    sizes = f"; its {', '.join(left_out)} left to the rehearsal's" if left_out else ""
    return (
        f"one run of the grid: experiment {run.experiment} ({how}), {seed}, of {experiments} "
        f"experiments x {len(grid) // experiments} seeds{sizes}"
    )


def _without_sizes(changes: dict) -> tuple[dict, list[str]]:
    """(changes without the rehearsal's sizes REHEARSAL_SIZES, the dotted keys left out)."""
    left_out = []

    def strip(node: dict, where: str) -> dict:
        out = {}
        for key, value in node.items():
            dotted = f"{where}.{key}" if where else key
            if dotted in REHEARSAL_SIZES:
                left_out.append(dotted)
            elif isinstance(value, dict):
                out[key] = strip(value, dotted)
            else:
                out[key] = value
        return out

    return strip(changes, ""), sorted(left_out)


def baseline(config: dict, runs: list[Run]) -> str:
    """The experiment `vcloud compare` pairs the others with: compare.baseline, else the first."""
    names = list(dict.fromkeys(run.experiment for run in runs))
    chosen = (config.get("compare") or {}).get("baseline")
    if chosen is None:
        return names[0]
    if chosen not in names:
        if (config.get("rehearsal") or {}).get("enabled") and len(names) == 1:
            return names[0]  # a grid's rehearsal tries one run (rehearsal.experiment): its own baseline
        raise ConfigError(f"compare.baseline: {chosen!r} is not an experiment ({', '.join(names)})")
    return chosen


def baseline_run(config: dict, runs: list[Run]) -> Run:
    """Compare's baseline experiment under its first seed (`seeds:` order): the run a research
    run's viewer shows beside the comparison, and the one a rehearsal tries by default."""
    chosen = baseline(config, runs)
    return next(run for run in runs if run.experiment == chosen)


def _experiments(config: dict, base: dict) -> list[tuple[str, str, dict]]:
    table = config.get("experiments") or []
    if not table:
        return [("model_config", DEFAULT_EXPERIMENT, {})]
    seen: dict[str, str] = {}
    out = []
    for index, entry in enumerate(table):
        where = f"experiments[{index}]"
        name = str(entry.get("name", ""))
        if not SAFE_NAME.fullmatch(name):
            raise ConfigError(
                f"{where}.name: {name!r} is not a safe folder name (1-64 letters, digits, '_' or '-', "
                "the first a letter or digit)"
            )
        if name in RESERVED_NAMES:
            raise ConfigError(
                f"{where}.name: {name!r} is a folder of the results already ({', '.join(sorted(RESERVED_NAMES))})"
            )
        if name in seen:
            raise ConfigError(f"{where}.name: {name!r} is the name of {seen[name]} too")
        seen[name] = where
        changes = entry.get("overrides") or {}
        _check_changes(changes, base, config, f"{where}.overrides")
        out.append((where, name, changes))
    return out


def _check_changes(changes: dict, base: dict, config: dict, where: str) -> None:
    for key in SHARED_MODEL_KEYS:
        if key in changes:
            raise ConfigError(
                f"{where}.{key}: may not differ between experiments (every run is scored on the same "
                "protocols and bundled under the model set's name)"
            )
    workflow_data = set(config.get("data") or {})
    for key in changes.get("data") or {}:
        if key in workflow_data and key not in (base.get("data") or {}):
            raise ConfigError(
                f"{where}.data.{key}: a workflow setting (config data.{key}: the ROIs, splits and "
                "prepared data every experiment shares), not a model-config key an experiment may change"
            )
    for stage in STAGES:
        if "seed" in ((changes.get(stage.name) or {}).get("train") or {}):
            raise ConfigError(f"{where}.{stage.name}.train.seed: the training seeds come from `seeds:`")
    overlay(base, changes, where=where, strict=True)


def _seeds(config: dict) -> list[int | None]:
    seeds = config.get("seeds")
    if seeds is None:
        return [None]
    if not seeds:
        raise ConfigError("seeds: empty list (give one seed or more, or leave the key out for the model config's own)")
    for index, seed in enumerate(seeds):
        if seeds.index(seed) != index:
            raise ConfigError(f"seeds[{index}]: {seed} is listed twice")
    return list(seeds)


def _seed_changes(seed: int) -> dict:
    """A seed's changes: every stage's training seed (never a data, split or protocol seed)."""
    return {stage.name: {"train": {"seed": seed}} for stage in STAGES}


def _model_set(base: dict, changes: dict, where: str) -> ModelSetConfig:
    data = overlay(base, changes, where=where, strict=True)
    try:
        return from_dict(ModelSetConfig, data, "")
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def write_run_config(base: Path, changes: dict, out: Path) -> ModelSetConfig:
    """`vcloud run-config`: the model config `base` with a run's changes applied (strict), checked
    and written whole (every key resolved, no `based_on:`) to `out`, atomically: what the run's
    stages train and are scored with, and what their checkpoints record."""
    import json

    import yaml

    from vcloud.config.model_sets import config_to_dict
    from vcloud.io import atomic_write_text

    if not isinstance(changes, dict):
        raise ConfigError(f"--changes: expected a JSON mapping of model-config keys, got {type(changes).__name__}")
    model_set = _model_set(model_config_data(Path(base)), changes, "--changes")
    header = f"# {base} with {json.dumps(changes)} (written by vcloud run-config for a research run)\n"
    atomic_write_text(Path(out), header + yaml.safe_dump(config_to_dict(model_set), sort_keys=False))
    return model_set


def model_config_path(config: dict) -> Path:
    """config.model_config, relative to the working directory, else to this repository (as the
    workflow's get_model_config)."""
    path = Path(config["model_config"])
    if not path.is_absolute() and not path.exists():
        path = Path(__file__).resolve().parents[3] / path
    return path


def research_plan(config: dict) -> tuple[list[Run], list] | None:
    """(runs, their RunPaths) of a research config as the workflow plans them, for the bill and
    the data budget (a rehearsal's: its one run); None for a single run."""
    from vcloud.config.identities import run_paths

    if not is_research(config):
        return None
    runs = plan_runs(config, model_config_path(config))
    paths = config["paths"]
    return runs, run_paths(
        runs, prepared=paths["prepared"], results=paths["results"], patch_size=config["data"]["patch_size"]
    )

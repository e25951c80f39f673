"""What the workflow's rules files compute, as plain functions (the .smk files only wire).

Paths and input functions live in workflow/rules/runs.smk and outputs.smk (predict_inputs.smk
and rehearsal_inputs.smk: those of predict, bundle and the rehearsal) and call these with the
paths of each run; the cluster wiring (workflow/rules/cluster.smk) calls the resource and
pre-flight helpers. Nothing here reads snakemake objects: every argument is a plain value, so
each function is tested in tests/unit/test_workflow_logic.py without a workflow.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

from vcloud.config.identities import (  # noqa: F401 (re-exported: the rules files call them through this module)
    fixed_protocol_settings,
    identities,
    makers,
    research_jobs,
    run_paths,
    wind_grid,
)
from vcloud.registry import STAGES, get_stage

# --- stage inputs (the registry says which checkpoints) --------------------------------------


def train_inputs(
    stage: int, model_set, *, train: str, val: str, checkpoint_path: Callable[[int], str], wind_cache: str | None
) -> dict[str, str]:
    """train_stage<n>'s inputs: split stores, the best.pt of the stages it builds on under
    `model_set` (registry Stage.builds_on), and the wind cache when the stage reads it and
    `wind_cache` is given (stage1.model.wind_scan on)."""
    spec = get_stage(stage)
    inputs = {"train": train, "val": val}
    inputs.update({f"stage{n}": checkpoint_path(n) for n in spec.builds_on(model_set)})
    if spec.reads_wind and wind_cache:
        inputs["wind_cache"] = wind_cache
    return inputs


def train_priority(stage: int) -> int:
    """Snakemake priority of train_stage<n>: 1 for a stage that builds on no other (stage 0), else
    0. Where stage 1 starts from it (stage1.init_from_stage0) it heads the chain, so it starts
    first; where no stage reads it, it is a side branch, and started first its evaluation is ready
    with the others and fills a core beside them instead of running alone after the main chain
    (measured on 2 cores: train_stage0 then evaluate_stage0 ran last, the evaluation on one core)."""
    spec = get_stage(stage)
    return int(not spec.upstream and spec.init_from is None)


def evaluate_inputs(
    stage: int, *, store: str, checkpoint_path: Callable[[int], str], wind_cache: str | None
) -> dict[str, str]:
    """evaluate_stage<n>'s inputs: the store and the best.pt its predictor reads."""
    spec = get_stage(stage)
    inputs = {"store": store}
    inputs.update({f"stage{n}": checkpoint_path(n) for n in spec.predictor_needs})
    if spec.reads_wind and wind_cache:
        inputs["wind_cache"] = wind_cache
    return inputs


def viewer_inputs(
    stages, *, store: str, checkpoint_path: Callable[[int], str], wind_cache: str | None
) -> dict[str, str]:
    """export_viewer's inputs: the best.pt every shown stage's predictor reads."""
    needed = sorted({n for stage in stages for n in get_stage(stage).predictor_needs})
    inputs = {"store": store}
    inputs.update({f"stage{n}": checkpoint_path(n) for n in needed})
    if wind_cache and any(get_stage(stage).reads_wind for stage in stages):
        inputs["wind_cache"] = wind_cache
    return inputs


def viewer_comparison_flags(comparison: str | None, *, experiment: str, seed: int | None) -> str:
    """export_viewer's ` --comparison PATH --run EXPERIMENT SEED` in a research run (the comparison
    of the runs, and the run whose samples the page shows), with its leading space; "" without a
    comparison, so that a single run's command line is what it was."""
    if comparison is None:
        return ""
    run = f"{shlex.quote(experiment)} {'-' if seed is None else seed}"
    return f" --comparison {shlex.quote(str(comparison))} --run {run}"


def prefix_pattern(prefixes) -> str:
    """The wildcard constraint of `{run}` that matches exactly these run prefixes ("" included)."""
    prefixes = list(prefixes)
    # Grouped: snakemake takes an empty constraint ("", the single run's) for none at all.
    return "(?:" + "|".join(re.escape(prefix) for prefix in prefixes) + ")" if prefixes else "(?!)"


def checkpoint_flags(inputs: dict[str, str]) -> str:
    """`--stage<n> PATH` per checkpoint input and `--wind-cache PATH`, in input order."""
    names = [n for n in inputs if re.fullmatch(r"stage\d+", n) or n == "wind_cache"]
    return " ".join(f"--{n.replace('_', '-')} {shlex.quote(str(inputs[n]))}" for n in names)


def train_rules() -> list[str]:
    return [stage.train_rule for stage in STAGES]


def evaluate_rules() -> list[str]:
    return [stage.evaluate_rule for stage in STAGES]


def stage_of_rule(rule: str):
    """The registry entry of a train_stage<n> rule, else None."""
    for stage in STAGES:
        if rule == stage.train_rule:
            return stage
    return None


# --- resources and pre-flight --------------------------------------------------------------


def resources_json(rules, rule_resources: Callable, cluster) -> str:
    """Each rule's resources as its jobs get them and what the cluster bills for them per hour,
    as one JSON string for `vcloud accounting --resources`."""
    from vcloud.runtime.billing import billing

    out = {}
    for rule in rules:
        res = rule_resources(rule)
        entry = {
            "threads": res.threads,
            "gpus": res.gpus,
            "nodes": res.nodes,
            "mem_mb": res.mem_mb,
            "partition": res.partition,
        }
        part = cluster.partitions.get(res.partition) if cluster else None
        if part is not None:
            bill = billing(res, part, cluster)
            entry["billing"] = {"unit": bill.unit, "per_hour": bill.per_hour}
        out[rule] = entry
    return json.dumps(out, sort_keys=True)


def deployment_problems(methods, cluster=None, *, in_image: bool | None = None) -> list[str]:
    """Pre-flight of the software deployment: on a cluster every rule runs inside the image.
    Where the site has no host installs (runtime/image_run.py), snakemake itself runs in the
    image (`in_image`: /.singularity.d, made by apptainer in every container) and starts no
    container per rule."""
    apptainer = any("apptainer" in str(m).lower() for m in methods)
    if cluster is not None and not cluster.host_installs:
        if in_image is None:
            in_image = Path("/.singularity.d").is_dir()
        if not in_image:
            return [
                f"snakemake runs on the host, but {cluster.title} has no host installs: start the run with "
                f"profiles/{cluster.name}/bin/vcloud submit (`vcloud profile --site {cluster.name}` writes it)"
            ]
        if apptainer:
            return ["software-deployment-method: apptainer is on inside the image (a container in a container)"]
        return []
    if not apptainer:
        return [
            "software-deployment-method: apptainer is not on, so rules would run outside "
            "the image (use the lumi profile)"
        ]
    return []

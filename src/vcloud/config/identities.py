"""Research runs: what each shared file of a run depends on (its identity) and which run makes
it, so that runs of the same identity read it from that run's folder (RunPaths.homes; the
workflow config's `experiments:` x `seeds:`, vcloud.config.experiments; docs/workflow.md,
"Experiments and seeds"). Read by the workflow's rules (through vcloud.workflow), the bill,
the data budget and the tracking export.

Nothing heavy is imported (snakemake reads it while parsing).
"""

from __future__ import annotations

from vcloud.config.stage_hash import config_hash, stage_hash
from vcloud.errors import ConfigError
from vcloud.paths import RunPaths
from vcloud.registry import STAGES


def wind_grid(patch_size: int, widths) -> tuple[int, int]:
    """The CFDT's coarsest token grid for whole patches (patch_size / 2**(levels-1) a side)."""
    scale = 2 ** (len(widths) - 1)
    if patch_size % scale:
        raise ConfigError(f"data.patch_size: {patch_size} is not a multiple of {scale} (the CFDT's downsampling)")
    return patch_size // scale, patch_size // scale


def fixed_protocol_settings(model_set) -> dict:
    """The model settings the fixed protocol's samples (and so fixed_protocol's file) depend on."""
    return {
        "input_dates": model_set.data.input_dates,
        "clear_target_max_cover": model_set.data.clear_target_max_cover,
    }


def identities(model_set, *, patch_size: int) -> dict[str, str]:
    """What each shared file of a run depends on, by the key RunPaths.homes names it with: a
    stage's training (its stage hash: data, its section with its seed, the identities of the
    stages it builds on), a stage's evaluation (the identities of the stages its predictor reads
    and the evaluation section), the fixed protocol's detection and the wind cache (their settings)."""
    found = {f"stage{stage.number}": stage_hash(model_set, stage.number) for stage in STAGES}
    evaluation = config_hash(model_set.evaluation)
    for stage in STAGES:
        needs = [found[f"stage{n}"] for n in stage.predictor_needs]
        found[f"eval{stage.number}"] = config_hash({"stages": needs, "evaluation": evaluation})
    found["fixed_protocol"] = config_hash(fixed_protocol_settings(model_set))
    cfdt = model_set.stage1.model
    grid = wind_grid(patch_size, cfdt.widths)
    found["wind"] = config_hash({"grid": list(grid), "sectors": cfdt.wind_sectors})
    return found


def run_paths(runs, *, prepared: str, results: str, patch_size: int) -> list:
    """Each run's RunPaths: its own folder (results + run.prefix), and for every shared file an
    earlier run (table order) already makes with the same identity, that run's folder (homes)."""
    first: dict[tuple[str, str], str] = {}
    out = []
    for run in runs:
        own = f"{results}{run.prefix}"
        homes = []
        for key, identity in identities(run.model_set, patch_size=patch_size).items():
            home = first.setdefault((key, identity), own)
            if home != own:
                homes.append((key, home))
        out.append(RunPaths(prepared=prepared, results=own, homes=tuple(homes)))
    return out


def makers(runs, paths, key: str) -> list[str]:
    """The prefixes of the runs that make the shared file `key` (read from no other run)."""
    return [run.prefix for run, p in zip(runs, paths, strict=True) if key not in dict(p.homes)]


def research_jobs(runs, paths) -> dict[str, tuple[int, str]]:
    """rule -> (jobs, why) of the rules each research run has: a stage's training and evaluation
    once per identity (the runs that make them), the fixed protocol and the wind cache once per
    setting, the stage tables once per run. Read by the bill and the data budget."""
    experiments = len({run.experiment for run in runs})
    grid = f"{experiments} experiments x {len(runs) // max(experiments, 1)} seeds"
    jobs = {}
    # Evaluations and the fixed protocol's detection: on test and on val (where designs are chosen).
    splits = {"train": 1, "evaluate": 2, "fixed_protocol": 2, "wind_cache": 1}
    for stage in STAGES:
        for rule, key in ((stage.train_rule, f"stage{stage.number}"), (stage.evaluate_rule, f"eval{stage.number}")):
            count = len(makers(runs, paths, key))
            shared = f", {len(runs) - count} read from a run of the same identity" if count < len(runs) else ""
            on = ", on test and val" if rule == stage.evaluate_rule else ""
            jobs[rule] = (count * splits[rule.split("_")[0]], f"{grid}{shared}{on}")
    for rule, key in (("fixed_protocol", "fixed_protocol"), ("wind_cache", "wind")):
        count = len(makers(runs, paths, key))
        on = ", on test and val" if rule == "fixed_protocol" else ""
        jobs[rule] = (count * splits[rule], f"one per setting among {grid}{on}")
    if not any(run.model_set.stage1.model.wind_scan for run in runs):
        jobs["wind_cache"] = (0, "stage1.model.wind_scan is off")
    jobs["report_tables"] = (len(runs), grid)
    return jobs

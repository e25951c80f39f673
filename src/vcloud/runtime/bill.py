"""The bill of a run: every rule times its jobs, by the site's formula (vcloud.runtime.billing),
expected and worst case.

Jobs per rule follow the workflow's own fan-out (workflow/rules/*.smk): one `index_archive` per
archive that holds a ROI to prepare (s1 and s2 of its region's train or `_test` archive), one
`prepare_roi` per ROI (an array job on LUMI: each task is billed as one job), one
`assemble_split` per split, one job each for the others, and the opt-in `predict` once per ROI
of `predict.split` when `predict.enabled`. Local rules run where snakemake runs and cost nothing.

Expected hours of a job: a training rule needs its epochs at the measured (else configured)
minutes per epoch plus one start-up (cluster.restart_minutes) per job it takes, capped by the
wall times of those jobs; any other rule its wall time, since nothing estimates it better yet.
Worst case: every attempt the workflow allows (retries + 1, with the retries `get_retries` of
workflow/rules/cluster.smk gives the rule: `rule_retries` below) runs to its full wall time.

Research runs (experiments x seeds): a stage's training is billed once per identity (the runs that
train it; the others read its best.pt), each at its own run's epochs and samples per epoch: an
experiment that changes `stage<n>.train.epochs` or the stage's samples per epoch is billed on a
line of its own (`training_groups`). A rule's retries are one number for all its jobs (a
`retries:` directive), enough for the run with the longest training.

Samples per epoch: an epoch time belongs to the samples per epoch it was taken at (`EpochBasis`):
`resources.<rule>.epoch_minutes` and a time the run's own metrics measured to the base model
config's (config.model_config, before any experiment's changes), a rehearsal's measured one to
the full run's samples the rehearsal scaled it to. A run of other samples per epoch (an experiment
that changes `stage<n>.train.samples_per_epoch` or `data.samples_per_epoch`) takes that time per
sample (`run_epoch_minutes`, by the rehearsal's own rehearsal.minutes_of_epoch); its retries too.

Host-side only (a LUMI login node): no torch, no numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vcloud.constants import SPLITS
from vcloud.errors import ConfigError
from vcloud.registry import STAGES
from vcloud.runtime.billing import billing
from vcloud.runtime.cluster import Cluster, RuleResources, retries_needed

# Rules run by snakemake itself on the login node (`localrules:` of workflow/rules/report.smk and
# predict.smk, `localrule: True` in rehearsal.smk; era5_wind has no resources entry): not billed.
LOCAL_RULES = ("report_curves", "report_tables", "accounting", "rehearsal_summary", "bundle")
# Rules with a `retries:` directive (train.smk, evaluate.smk, predict.smk); the others have none
# and the lumi profile sets no global --retries, so they run once.
RETRIED_RULES = (
    *(stage.train_rule for stage in STAGES),
    *(stage.evaluate_rule for stage in STAGES),
    "predict",
)


@dataclass(frozen=True)
class RuleBill:
    rule: str
    jobs: int
    why: str  # where the job count comes from, when it is not one job
    unit: str = "core-h"  # "GPU-h" or "core-h"
    per_hour: float = 0.0  # billed units per wall hour of one job
    formula: str = ""
    expected_hours: float = 0.0  # wall hours of one job, expected
    basis: str = ""  # how expected_hours was found
    attempts: int = 1  # retries + 1
    runtime_hours: float = 0.0  # requested wall time of one attempt
    starts: int = 1  # submissions one job needs, expected (a training's: enough for its epochs)
    partition: str = ""  # where its jobs queue

    @property
    def expected(self) -> float:
        return self.jobs * self.per_hour * self.expected_hours

    @property
    def worst(self) -> float:
        return self.jobs * self.per_hour * self.attempts * self.runtime_hours


# --- jobs per rule ---------------------------------------------------------------------------


def rois_to_prepare(config: dict) -> tuple[list, str]:
    """(ROIs, where they come from), as the workflow's get_rois: the synthetic list, the
    configured list, or for `all` the ROIs the raw data hold (the dataset's 53 while the raw
    paths are not there to look at)."""
    from vcloud.data.layout import dataset_rois, parse_roi

    if config["synthetic"]["enabled"]:
        return [parse_roi(text) for text in config["synthetic"]["rois"]], "of synthetic.rois"
    from vcloud.data.locations import folder_source

    if (folder := folder_source(config)) is not None:  # your own locations: one prepare job each
        return [location.roi for location in folder.locations], "of data.locations (data.source: folder)"
    rois = config["data"]["rois"]
    if rois != "all":
        return [parse_roi(text) for text in rois], "of data.rois"
    from pathlib import Path

    from vcloud.data.archive import discover_raw_rois

    raws = [Path(p) for p in _raw_paths(config)]
    if raws and all(p.exists() for p in raws):
        try:
            return discover_raw_rois(raws), "under data.raw"
        except Exception as err:  # named by the workflow and `vcloud prepare` too; here, in the bill
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            return dataset_rois(), f"of the dataset: data.raw could not be read ({first}), so not counted there"
    return dataset_rois(), "of the dataset (data.rois: all; data.raw not there yet)"


def _raw_paths(config: dict) -> list[str]:
    raw = config["data"]["raw"]
    return [raw] if isinstance(raw, str) else list(raw)


def _archive_input(config: dict) -> bool:
    """As the workflow's is_archive_input; raw paths not there yet count as the archives as
    downloaded (config/lumi.yaml's case before the download)."""
    if config["synthetic"]["enabled"]:
        return bool(config["synthetic"]["archives"])
    from pathlib import Path

    from vcloud.data.archive import classify

    kinds = []
    for raw in _raw_paths(config):
        try:
            kinds.append(classify(Path(raw)))
        except Exception:  # missing: the download is still to come
            kinds.append("archives")
    return any(kind != "tree" for kind in kinds)


def rule_jobs(config: dict, model_set=None) -> dict[str, tuple[int, str]]:
    """rule -> (jobs, why) for every rule the run may submit (rules of unknown fan-out: one)."""
    from vcloud.config.experiments import research_plan
    from vcloud.config.identities import research_jobs
    from vcloud.data.archive import archive_for
    from vcloud.data.layout import KINDS, dataset_region
    from vcloud.data.splits import assign_splits

    rois, source = rois_to_prepare(config)
    jobs: dict[str, tuple[int, str]] = {}
    synthetic = bool(config["synthetic"]["enabled"])
    jobs["synth_raw"] = (1, "") if synthetic else (0, "synthetic.enabled is false")
    if _archive_input(config):
        archives = {archive_for(roi, kind) for roi in rois if dataset_region(roi) for kind in KINDS}
        jobs["index_archive"] = (len(archives), f"the s1 and s2 archives of the {len(rois)} ROIs")
    else:
        jobs["index_archive"] = (0, "data.raw is an extracted tree")
    jobs["prepare_roi"] = (len(rois), f"ROIs {source}")
    jobs["assemble_split"] = (len(SPLITS), "train, val, test")
    wind = model_set is None or model_set.stage1.model.wind_scan
    jobs["wind_cache"] = (1, "") if wind else (0, "stage1.model.wind_scan is off")
    predict = config.get("predict") or {}
    if predict.get("enabled"):
        splits = assign_splits(rois, test=config["data"]["splits"]["test"], val=config["data"]["splits"]["val"])
        jobs["predict"] = (len(splits[predict["split"]]), f"ROIs of the {predict['split']} split")
    else:
        jobs["predict"] = (0, "predict.enabled is false")
    plan = research_plan(config)
    if plan is not None:  # experiments x seeds: every run's stages, those of one identity once
        jobs.update(research_jobs(*plan))
    return jobs


# --- what an epoch time belongs to ------------------------------------------------------------


@dataclass(frozen=True)
class EpochBasis:
    """The samples per epoch one training rule's epoch time was taken at."""

    samples: int | None  # None: one per training location, and those not counted
    of: str  # whose samples they are, as the bill names them ("config/models/full.yaml's")
    locations: int | None = None  # training locations "one per location" counts as, where known


class EpochMinutes(dict):
    """train rule -> measured minutes per epoch (doctor.measured_epoch_minutes), carrying the
    basis of every training rule's epoch time, measured or configured (`basis`: train rule ->
    EpochBasis): the workflow's retries (get_retries -> rule_retries) and the bill scale each run
    from it. A plain dict of minutes has none: the bill then takes the base model config's."""

    def __init__(self, minutes: dict, *, basis: dict[str, EpochBasis] | None) -> None:
        super().__init__(minutes)
        self.basis = basis


def epoch_basis(config: dict, *, base=None, rehearsed: tuple[str, ...] = ()) -> dict[str, EpochBasis] | None:
    """train rule -> the basis of its epoch time: the rules `rehearsed` (their minutes a passing
    rehearsal's) the samples the rehearsal scaled its time per sample to; the others the base
    model config's (`base`, else config.model_config loaded). None without a model config."""
    from vcloud.runtime.rehearsal import rehearsed_epoch_samples, stage_samples

    where = config.get("model_config")
    if base is None:
        if not where:
            return None
        from vcloud.config import load_model_config
        from vcloud.config.experiments import model_config_path

        base = load_model_config(model_config_path(config))
    of = f"{where or base.name}'s"
    samples, locations = rehearsed_epoch_samples(config) if rehearsed else ({}, None)
    found = {}
    for stage in STAGES:
        rule = stage.train_rule
        if rule in rehearsed and rule in samples:
            found[rule] = EpochBasis(samples[rule], "the rehearsal's", locations)
        else:  # "one per location" of the real run: not counted before its train store exists
            found[rule] = EpochBasis(stage_samples(base, stage.name, None), of)
    return found


def basis_of(config: dict, model_set, epoch_minutes: dict | None) -> dict[str, EpochBasis] | None:
    """The basis the bill scales from: measured_epoch_minutes's, else the base model config's (a
    single run's own model set; a grid's config.model_config)."""
    from vcloud.config.experiments import is_research

    found = getattr(epoch_minutes, "basis", None)
    if found is not None:
        return found
    if not is_research(config) and model_set is not None:
        return epoch_basis(config, base=model_set)
    return epoch_basis(config)


def run_epoch_minutes(rule: str, minutes: float, model_set, basis: dict | None) -> tuple[float, str]:
    """(minutes of one epoch of the rule's training in `model_set`, what the bill adds after the
    epoch time: "" where the run's samples per epoch are the basis's). A run of other samples per
    epoch takes the basis's time per sample, as the rehearsal turns its time into the full run's."""
    from vcloud.runtime.rehearsal import minutes_of_epoch, stage_samples

    stage = next((s for s in STAGES if s.train_rule == rule), None)
    found = (basis or {}).get(rule)
    if stage is None or found is None or model_set is None:
        return minutes, ""
    samples = stage_samples(model_set, stage.name, found.locations)
    if samples == found.samples:
        return minutes, ""
    if samples is None or found.samples is None:
        own = "one per training location" if samples is None else f"{samples}"
        theirs = "one per training location" if found.samples is None else f"{found.samples}"
        return minutes, (
            f"(not scaled to this run's {own} samples per epoch from {found.of} {theirs}: "
            "the training locations are not counted before a rehearsal)"
        )
    scaled = minutes_of_epoch(samples, minutes * 60 / found.samples)
    return scaled, f"x {samples}/{found.samples} samples per epoch (this run's / {found.of})"


# --- retries and expected time ---------------------------------------------------------------


def rule_retries(
    rule: str,
    res: RuleResources,
    cluster: Cluster,
    model_set,
    epoch_minutes: dict | None = None,
    *,
    basis: dict | None = None,
) -> int:
    """The retries the workflow gives the rule on a cluster (get_retries in cluster.smk): a
    training rule enough resubmissions for its epochs plus cluster.spare_retries; the other
    rules with a `retries:` directive spare_retries; the rest none. `model_set` may be a list
    (every research run's): the retries of the one with the longest training, each run's epoch
    time scaled to its samples per epoch from `basis` (else epoch_minutes's: EpochMinutes).
    ConfigError from a wall time that leaves no training time."""
    if rule not in RETRIED_RULES:
        return 0
    stage = next((s for s in STAGES if s.train_rule == rule), None)
    minutes = (epoch_minutes or {}).get(rule) or res.epoch_minutes
    if stage is None or minutes is None or model_set is None:
        return cluster.spare_retries
    if basis is None:
        basis = getattr(epoch_minutes, "basis", None)
    model_sets = model_set if isinstance(model_set, (list, tuple)) else [model_set]
    return max(
        retries_needed(
            epochs=getattr(one, stage.name).train.epochs,
            epoch_minutes=run_epoch_minutes(rule, minutes, one, basis)[0],
            runtime=res.runtime,
            signal_seconds=cluster.signal_seconds,
            restart_minutes=cluster.restart_minutes,
            spare=cluster.spare_retries,
        )
        for one in model_sets
    )


def training_groups(config: dict) -> dict[str, list[tuple[int, object, str]]]:
    """train rule -> [(jobs, model set, which runs)] of a research config: the runs that train the
    stage (one per identity: vcloud.config.identities.makers), grouped by that stage's epochs and
    samples per epoch in each run's model set, in table order; {} for a single run (the model set given
    to the bill)."""
    from vcloud.config.experiments import research_plan
    from vcloud.config.identities import makers

    plan = research_plan(config)
    if plan is None:
        return {}
    runs, paths = plan
    out = {}
    for stage in STAGES:
        trained = set(makers(runs, paths, f"stage{stage.number}"))
        groups: dict[tuple, list] = {}
        for run in runs:
            if run.prefix in trained:
                train = getattr(run.model_set, stage.name).train
                samples = getattr(train, "samples_per_epoch", None) or run.model_set.data.samples_per_epoch
                groups.setdefault((train.epochs, samples), []).append(run)
        out[stage.train_rule] = [
            (len(group), group[0].model_set, ", ".join(dict.fromkeys(run.experiment for run in group)))
            for group in groups.values()
        ]
    return out


def _expected(rule, res, cluster, model_set, epoch_minutes, retries, basis=None) -> tuple[float, str]:
    """(expected wall hours of one job, how they were found)."""
    wall = res.runtime / 60
    stage = next((s for s in STAGES if s.train_rule == rule), None)
    if stage is None:
        return wall, "wall time, no estimate"
    measured = (epoch_minutes or {}).get(rule)
    minutes = measured or res.epoch_minutes
    if minutes is None or model_set is None:
        return wall, "wall time, no epoch time"
    epochs = getattr(model_set, stage.name).train.epochs
    own, scaling = run_epoch_minutes(rule, minutes, model_set, basis)
    starts = retries - cluster.spare_retries + 1  # the jobs the epochs need
    run = epochs * own + starts * cluster.restart_minutes
    capped = " (capped by the wall times)" if run > starts * res.runtime else ""
    source = "measured" if measured else "estimated"
    scaling = f" {scaling}" if scaling else ""
    how = f"{epochs} epochs x {minutes:.1f} min {source}{scaling} + {starts} x {cluster.restart_minutes:g} min start{capped}"
    return min(run, starts * res.runtime) / 60, how


# --- the bill ----------------------------------------------------------------------------------


def rule_bills(
    config: dict,
    cluster: Cluster,
    resources_of: Callable[[str], RuleResources],
    *,
    model_set=None,
    epoch_minutes: dict | None = None,
) -> tuple[list[RuleBill], list[str]]:
    """(one bill per resources key, problems: one line each) for the config's rules."""
    fan_out = rule_jobs(config, model_set)
    groups = training_groups(config)
    basis = basis_of(config, model_set, epoch_minutes)
    bills, problems = [], []
    for rule in config["resources"]:
        jobs, why = fan_out.get(rule, (1, ""))
        if rule in LOCAL_RULES:
            bills.append(RuleBill(rule, 0, "a local rule: runs where snakemake runs, not billed"))
            continue
        if not jobs:
            bills.append(RuleBill(rule, 0, why))
            continue
        res = resources_of(rule)
        part = cluster.partitions.get(res.partition)
        if part is None:
            continue  # named by the doctor's check_resources
        # A single run's trainings at the model set's epochs; a grid's at each training run's own.
        parts = groups.get(rule) or [(jobs, model_set, "")]
        try:
            run_sets = [m for _, m, _ in parts if m is not None] or None
            retries = rule_retries(rule, res, cluster, run_sets, epoch_minutes, basis=basis)
        except ConfigError as err:
            problems.append(f"resources.{rule}.runtime: {err}")
            retries = cluster.spare_retries
        bill = billing(res, part, cluster)
        for count, run_model_set, experiments in parts:
            own = retries  # the expected jobs: what this group's epochs need
            if len(parts) > 1:
                try:
                    own = rule_retries(rule, res, cluster, run_model_set, epoch_minutes, basis=basis)
                except ConfigError:
                    pass  # named above
            hours, how = _expected(rule, res, cluster, run_model_set, epoch_minutes, own, basis)
            needs_epochs = not how.startswith("wall time")  # a training whose epochs set its jobs
            bills.append(
                RuleBill(
                    rule,
                    count,
                    f"{why}; trained by {experiments}" if len(parts) > 1 else why,
                    unit=bill.unit,
                    per_hour=bill.per_hour,
                    formula=bill.formula,
                    expected_hours=hours,
                    basis=how,
                    attempts=retries + 1,
                    runtime_hours=res.runtime / 60,
                    starts=own - cluster.spare_retries + 1 if needs_epochs else 1,
                    partition=res.partition,
                )
            )
    return bills, problems


def totals(bills: list[RuleBill]) -> dict[str, dict[str, float]]:
    """{"expected"|"worst": {unit: total}}, GPU-h and core-h always there (0 when unused)."""
    out = {"expected": {"GPU-h": 0.0, "core-h": 0.0}, "worst": {"GPU-h": 0.0, "core-h": 0.0}}
    for bill in bills:
        if bill.jobs:
            out["expected"][bill.unit] = out["expected"].get(bill.unit, 0.0) + bill.expected
            out["worst"][bill.unit] = out["worst"].get(bill.unit, 0.0) + bill.worst
    return out


def line(bill: RuleBill) -> str:
    """One printed line of a rule's bill."""
    if not bill.jobs:
        return f"  {bill.rule:<16} 0 jobs ({bill.why})"
    jobs = f"{bill.jobs} {'job' if bill.jobs == 1 else 'jobs'}"
    why = f" ({bill.why})" if bill.why else ""
    return (
        f"  {bill.rule:<16} {jobs}{why} x {bill.per_hour:g} {bill.unit}/h [{bill.formula}] x "
        f"{bill.expected_hours:.1f} h ({bill.basis}) = {bill.expected:.1f} {bill.unit} expected; "
        f"worst {bill.jobs} x {bill.per_hour:g} {bill.unit}/h x {bill.attempts} x {bill.runtime_hours:.1f} h = "
        f"{bill.worst:.1f} {bill.unit}"
    )

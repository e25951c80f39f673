"""`vcloud doctor`: pre-flight checks of a cluster run, each failure one line.

Every failure the LUMI field reports describe that can be seen before a job starts is
checked here: `--rocm` in the container arguments, a missing bind or containlib, the
placeholder account, a runtime or GPU request the partition refuses (or bills for nothing),
a stage whose training memory estimate exceeds the GPU it runs on, a distributed stage that
would compute the wind scan orders itself. The same checks run at workflow start on the lumi profile (the Snakefile's
`onstart`), so a bad setting stops `snakemake --profile lumi` before anything is submitted;
a dry run prints them as warnings.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from vcloud.config.workflow import parse_yaml
from vcloud.constants import MEMORY_MARGIN
from vcloud.errors import ConfigError
from vcloud.registry import STAGES
from vcloud.runtime.billing import billing, formula_text
from vcloud.runtime.cluster import Cluster, RuleResources, retries_needed
from vcloud.runtime.profile import profile_command

TRAIN_RULES = tuple(stage.train_rule for stage in STAGES)


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # the GPU-hour table and other facts

    def text(self) -> str:
        out = list(self.lines)
        out += [f"warning: {w}" for w in self.warnings]
        out += [f"error: {e}" for e in self.errors]
        return "\n".join(out)


# --- container arguments ------------------------------------------------------------------


def bound_paths(apptainer_args: str) -> set[str]:
    """Host paths of every -B/--bind in apptainer arguments ("src[:dst[:opts]]", comma lists)."""
    words = shlex.split(apptainer_args or "")
    paths: set[str] = set()
    for i, word in enumerate(words):
        value = None
        if word in ("-B", "--bind") and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith("--bind="):
            value = word.split("=", 1)[1]
        if value:
            paths.update(spec.split(":", 1)[0].rstrip("/") for spec in value.split(",") if spec)
    return paths


def check_container(cluster: Cluster, apptainer_args: str | None, precommand: str | None, report: Report) -> None:
    if not cluster.host_installs:  # the binds are in profiles/<site>/bin (runtime/image_run.py), not the profile's
        from vcloud.runtime.image_run import check as check_image_run

        try:
            check_image_run(cluster)
        except ConfigError as err:
            report.errors.append(str(err))
        return
    args = apptainer_args or ""
    if "--rocm" in shlex.split(args):
        report.errors.append(
            "apptainer-args: --rocm injects the host libdrm (GLIBC 2.33) into the "
            "GLIBC 2.31 image and crashes it; bind paths explicitly instead"
        )
    bound = bound_paths(args)
    for path in cluster.binds:
        if path.rstrip("/") not in bound:
            report.errors.append(
                f"apptainer-args: bind {path} missing (cluster.binds; "
                f"regenerate the profile with `{profile_command(cluster.name)}`)"
            )
    if precommand is None:  # not known yet (the Snakefile at parse time)
        return
    libs = _containlibs(precommand)
    for lib in cluster.containlibs:
        if lib not in libs:
            report.errors.append(
                f"precommand: {lib} not in SINGULARITY_CONTAINLIBS (without it: "
                "'No HIP GPUs available'); regenerate the profile"
            )


def _containlibs(precommand: str) -> set[str]:
    libs: set[str] = set()
    for word in shlex.split(precommand.replace(";", " ; ")):
        for name in ("SINGULARITY_CONTAINLIBS=", "APPTAINER_CONTAINLIBS="):
            if word.startswith(name):
                libs.update(word[len(name) :].split(","))
    return libs


# --- paths as the container sees them --------------------------------------------------------


def bind_destinations(cluster: Cluster) -> list[str]:
    """Where each bind appears inside the container ("src[:dst[:opts]]": dst, else src)."""
    out = []
    for spec in cluster.binds:
        parts = spec.split(":")
        out.append((parts[1] if len(parts) > 1 and parts[1] else parts[0]).rstrip("/") or "/")
    return out


def _under(path: str, folder: str) -> bool:
    return folder == "/" or path == folder or path.startswith(folder + "/")


def run_paths(config: dict, cluster: Cluster) -> dict[str, str]:
    """The paths every job reads or writes, by config key, as the config gives them."""
    paths = {"working directory": "."}
    if config["data"].get("source") == "folder":  # your own locations (docs/data.md)
        paths["data.folder"] = str(config["data"]["folder"])
    elif not config["synthetic"]["enabled"]:
        raw = config["data"]["raw"]
        for i, path in enumerate([raw] if isinstance(raw, str) else raw):
            paths["data.raw" if isinstance(raw, str) else f"data.raw[{i}]"] = str(path)
    if not config["synthetic"]["enabled"] and config["data"].get("wind_table"):
        paths["data.wind_table"] = str(config["data"]["wind_table"])
    paths["paths.prepared"] = str(config["paths"]["prepared"])
    paths["paths.results"] = str(config["paths"]["results"])
    if cluster.env_image:
        paths["cluster.env_image"] = cluster.env_image
    return paths


def check_paths(config: dict, cluster: Cluster, report: Report, workdir: Path) -> None:
    """Every bind source exists on this node (apptainer refuses a missing one), and every path
    a job uses lies, after resolving symlinks, under a bind: jobs start in the *physical*
    working directory (snakemake's sbatch -D; on LUMI /scratch/<project> is a symlink into
    /pfs/lustrepN), so `../data` from there is a /pfs path the container sees only if bound."""
    import os

    for spec in cluster.binds:
        source = spec.split(":")[0]
        if not Path(source).exists():
            report.errors.append(
                f"cluster.binds: {source} does not exist on this node; apptainer refuses a missing bind source"
            )
    for lib in cluster.containlibs:
        if not Path(lib).exists():
            report.warnings.append(f"cluster.containlibs: {lib} is not on this node (the local rules run here)")
    dests = bind_destinations(cluster)
    physical = os.path.realpath(workdir)
    for key, given in run_paths(config, cluster).items():
        real = os.path.realpath(os.path.join(physical, given))
        if any(_under(real, dest) for dest in dests):
            continue
        shown = given if given == real else f"{given} (really {real})"
        top = "/" + real.strip("/").split("/")[0] if real != "/" else "/"
        report.errors.append(
            f"{key}: {shown} is outside every bind of cluster.binds, so no container sees it; "
            f"add {top} (or that folder) to cluster.binds and run `{profile_command(cluster.name)}`"
        )


# --- resources ----------------------------------------------------------------------------


def rule_resources(config: dict, key: str, overrides: dict | None = None) -> RuleResources:
    """A rule's resources entry (config key = rule name) after `--set-resources` of the rule."""
    rule_overrides = (overrides or {}).get(key)
    res = RuleResources.from_config(config, key).with_overrides(rule_overrides)
    cluster = Cluster.from_config(config)
    return res if cluster is None else cluster.place(res, rule_overrides)


def check_resources(config: dict, cluster: Cluster, report: Report, overrides: dict | None = None) -> None:
    gcd = _gpu_word(cluster)
    cpu_part = cluster.placement.get("cpu", "small")
    gpu_part = cluster.placement.get("gpu", "small-g")
    whole = [p.name for p in cluster.partitions.values() if p.full_nodes and p.gpus_per_node]
    for key in config["resources"]:
        res = rule_resources(config, key, overrides)
        where = f"resources.{key}"
        part = cluster.partitions.get(res.partition)
        if part is None:
            report.errors.append(f"{where}.partition: {res.partition!r} is not one of {', '.join(cluster.partitions)}")
            continue
        if res.runtime > part.max_runtime:
            report.errors.append(
                f"{where}.runtime: {_hours(res.runtime)} is above the {part.name} limit of {_hours(part.max_runtime)}"
            )
        if res.nodes > part.max_nodes:
            report.errors.append(
                f"{where}.nodes: {res.nodes} nodes do not fit {part.name} "
                f"(at most {part.max_nodes}{'; several nodes: ' + ', '.join(whole) if whole else ''})"
            )
        if part.gpus_per_node == 0 and res.gpus:
            report.errors.append(f"{where}.gpus: {part.name} has no GPUs; use a GPU partition ({gpu_part})")
        elif part.gpus_per_node and not res.gpus:
            report.errors.append(
                f"{where}.gpus: 0 on the GPU partition {part.name} (billed in GPU hours); use {cpu_part} for CPU rules"
            )
        elif res.gpus > part.gpus_per_node:
            report.errors.append(
                f"{where}.gpus: {res.gpus} per node, but a {part.name} node has {part.gpus_per_node} {gcd}s"
            )
        elif part.full_nodes and res.gpus != part.gpus_per_node:
            report.errors.append(
                f"{where}.gpus: {part.name} allocates and bills whole nodes; ask "
                f"for all {part.gpus_per_node} {gcd}s or use {gpu_part}"
            )
        if res.gpus and res.gpus * res.cpus_per_gpu < 2:
            report.errors.append(
                f"{where}.cpus_per_gpu: {res.gpus} x {res.cpus_per_gpu} = 1 core; a GPU "
                "rule needs 2 (it runs its own job step, and the SLURM plugin "
                "asks for 2 tasks per node: SLURM refuses more tasks than cores)"
            )
        if part.whole_nodes_on and not part.full_nodes and res.gpus == part.gpus_per_node:
            bill = billing(res, part, cluster)
            whole = part.whole_nodes_on
            report.warnings.append(
                f"{where}: all {res.gpus} GCDs of a node on {part.name} cost {bill.per_hour:g} {bill.unit}/h, the "
                f"price of {whole}, without its CPU binding and with a longer wait for an empty node; use partition "
                f"{whole} (one task per GCD, GCD-affine CPU masks)"
            )
        if res.rehearse_warning and res.world_size > 1:
            report.errors.append(
                f"{where}.rehearse_warning: the forced warning runs on one GCD only, not {res.world_size} ranks"
            )
        if res.gpus and part.cpus_per_node and res.gpus * res.cpus_per_gpu > part.cpus_per_node:
            report.errors.append(
                f"{where}.cpus_per_gpu: {res.cpus_per_gpu} x {res.gpus} {_gpu_word(cluster)}s is more than the "
                f"{part.cpus_per_node} cores a {part.name} node gives "
                f"({part.cpus_per_node // part.gpus_per_node} per {_gpu_word(cluster)})"
            )


def _gpu_word(cluster: Cluster) -> str:
    """What the site's users call one GPU: a GCD on LUMI's MI250X."""
    return "GCD" if cluster.vendor == "amd" else "GPU"


def _hours(minutes: int) -> str:
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def billed_hours(
    config: dict,
    cluster: Cluster,
    report: Report,
    overrides: dict | None = None,
    *,
    model_set=None,
    epoch_minutes: dict | None = None,
) -> list:
    """What the site bills for the run, rule by rule (vcloud.runtime.bill): each rule's jobs x its
    price per hour x the hours of one job, expected (epoch times, else the wall time) and in
    the worst case (every attempt the workflow allows at its full wall time). Over the budget
    in the worst case is a warning; expected over it, an error."""
    from vcloud.config.experiments import model_config_path, rehearsal_note
    from vcloud.runtime.bill import line, rule_bills, totals

    bills, problems = rule_bills(
        config,
        cluster,
        lambda rule: rule_resources(config, rule, overrides),
        model_set=model_set,
        epoch_minutes=epoch_minutes,
    )
    report.errors += [p for p in problems if p not in report.errors]  # check_resubmission may name it
    report.lines.append(
        f"Bill per rule ({formula_text(cluster)}): jobs x price x hours, expected "
        "and worst case (retries + 1 attempts at the full wall time):"
    )
    if note := rehearsal_note(config, model_config_path(config)):  # a grid's rehearsal: its one run
        report.lines.append(f"  the rehearsal: {note}")
    report.lines += [line(bill) for bill in bills]
    sums = totals(bills)
    unit = cluster.billing_unit
    expected, worst = sums["expected"].get(unit, 0.0), sums["worst"].get(unit, 0.0)
    budget = cluster.gpu_hour_budget
    share = 100 * worst / budget if budget else float("inf")
    if unit == "GPU-h":
        report.lines.append(
            f"  total {expected:.1f} GPU-h expected, {worst:.1f} GPU-h worst case ({share:.1f} % of the "
            f"{budget:.0f} GPU-h budget); {sums['expected']['core-h']:.1f} CPU core-h expected, "
            f"{sums['worst']['core-h']:.1f} worst case"
        )
    else:
        others = "; ".join(
            f"{sums['expected'][u]:.1f} {u} expected, {sums['worst'][u]:.1f} worst case"
            for u in sums["expected"]
            if u != unit and sums["worst"][u]
        )
        report.lines.append(
            f"  total {expected:.1f} {unit} expected, {worst:.1f} {unit} worst case ({share:.1f} % of the "
            f"{budget:.0f} {unit} budget){'; ' + others if others else ''}"
        )
    if expected > budget:
        report.errors.append(
            f"cluster.gpu_hour_budget: the run is expected to need {expected:.0f} {unit}, more than the budget of {budget:.0f}"
        )
    elif worst > budget:
        report.warnings.append(
            f"cluster.gpu_hour_budget: the worst case (every retry at its full wall time) needs {worst:.0f} {unit}, "
            f"more than the budget of {budget:.0f}"
        )
    return bills


# Under `vcloud submit` the controller is a job of the same user on the CPU partition, and at its
# wall-time warning it submits the next controller before it stops its jobs
# (runtime/controller.py, Controller.stop): two controllers beside the run's jobs for a while.
CONTROLLER_JOBS = 2


def check_job_count(cluster: Cluster, report: Report, bills=()) -> None:
    """The jobs the run submits in all (the bill's jobs, each training as often as its epochs
    need) and the most queued at once: `cluster.jobs` (the profile's `jobs`), fewer on a
    partition where the run has fewer or a `max_running` resource caps them, plus the
    controllers on the CPU partition. Over a partition's `max_submit` or the site's
    `cluster.max_submit` (jobs of one user queued or running at once) is an error: SLURM refuses
    the submissions beyond it, and every refusal uses up one of the rule's attempts."""
    billed = [b for b in bills if b.jobs]
    if not billed:
        return
    first = sum(b.jobs for b in billed)
    expected = sum(b.jobs * b.starts for b in billed)
    worst = sum(b.jobs * b.attempts for b in billed)
    controller = cluster.placement.get("cpu") or "small"
    limit = cluster.jobs
    resubmitted = f" ({first:,} rule jobs, trainings resubmitted for their epochs)" if expected != first else ""
    report.lines.append(
        f"Jobs: {expected:,} submitted over the run{resubmitted}, {worst:,} if every retry is used; at most "
        f"{limit} queued at once (cluster.jobs) + {CONTROLLER_JOBS} controllers under `vcloud submit` ({controller})"
    )
    on: dict[str, int] = {}
    for bill in billed:
        on[bill.partition] = on.get(bill.partition, 0) + bill.jobs
    on.setdefault(controller, 0)
    fix = "lower cluster.jobs (the site file's `jobs:`) and run `vcloud profile`"
    for name, jobs in on.items():
        part = cluster.partitions.get(name)
        if part is None or part.max_submit is None:
            continue
        at_once = min(limit, jobs, part.max_running or jobs)
        extra = CONTROLLER_JOBS if name == controller else 0
        if at_once + extra > part.max_submit:
            plus = f" + {extra} controllers" if extra else ""
            report.errors.append(
                f"cluster.jobs: {at_once} jobs{plus} queued at once on {name}, more than {cluster.title}'s "
                f"{part.max_submit} jobs of a user there (partitions.{name}.max_submit); {fix}"
            )
    if cluster.max_submit is not None and min(limit, first) + CONTROLLER_JOBS > cluster.max_submit:
        report.errors.append(
            f"cluster.jobs: {min(limit, first)} jobs + {CONTROLLER_JOBS} controllers queued at once, more than "
            f"{cluster.title}'s {cluster.max_submit} jobs of a user (cluster.max_submit); {fix}"
        )


def check_resubmission(
    config: dict,
    model_set,
    cluster: Cluster,
    report: Report,
    overrides: dict | None = None,
    epoch_minutes: dict | None = None,
) -> None:
    """How snakemake carries each training stage past its wall time, and the warning."""
    report.lines.append(
        f"Wall time: SIGUSR1 {cluster.signal_seconds} s before each GPU job's limit; the trainer "
        "writes latest.pt and exits 3. SLURM requeues only on node failure or preemption; a "
        "timeout or exit 3 is resubmitted by snakemake, up to each rule's retries:"
    )
    from vcloud.runtime.bill import basis_of, run_epoch_minutes, training_groups

    run_model_sets = {rule: [m for _, m, _ in groups] for rule, groups in training_groups(config).items()}
    basis = basis_of(config, model_set, epoch_minutes)
    for stage in STAGES:
        rule = stage.train_rule
        if rule not in config["resources"]:
            continue
        res = rule_resources(config, rule, overrides)
        if cluster.signal_seconds * 2 > res.runtime * 60:
            report.errors.append(
                f"cluster.signal_seconds: {cluster.signal_seconds} s is more than "
                f"half of {rule}'s {res.runtime} min wall time"
            )
            continue
        measured = (epoch_minutes or {}).get(rule)
        minutes = measured or res.epoch_minutes
        if minutes is None:
            report.warnings.append(
                f"resources.{rule}.epoch_minutes: not set and not measured yet; {cluster.spare_retries} retries only"
            )
            continue
        # A grid's trainings of the stage: the retries of the longest (the rule's), each run's
        # epochs at its epoch time (scaled to its samples per epoch: vcloud.runtime.bill).
        longest = None
        for one in run_model_sets.get(rule, [model_set]):
            own, scaling = run_epoch_minutes(rule, minutes, one, basis)
            epochs = getattr(one, stage.name).train.epochs
            try:
                retries = retries_needed(
                    epochs=epochs,
                    epoch_minutes=own,
                    runtime=res.runtime,
                    signal_seconds=cluster.signal_seconds,
                    restart_minutes=cluster.restart_minutes,
                    spare=cluster.spare_retries,
                )
            except ConfigError as err:
                report.errors.append(f"resources.{rule}.runtime: {err}")
                break
            if longest is None or (epochs * own, retries) > longest[:2]:
                longest = (epochs * own, retries, epochs, scaling)
        if longest is None:
            continue
        _, retries, epochs, scaling = longest
        source = "measured" if measured else "estimated"
        scaling = f" {scaling}" if scaling else ""
        report.lines.append(
            f"  {rule:<16} {epochs} epochs x {minutes:.1f} min ({source}){scaling} in {res.runtime} min jobs: "
            f"{retries} retries"
        )


# --- training -----------------------------------------------------------------------------


def check_wind(
    config: dict, model_set, train_inputs: dict[str, set[str]], report: Report, overrides: dict | None = None
) -> None:
    """A distributed stage that scans by wind must read the cache file: computing the orders
    in the first forward pass deadlocked DDP from 16 to 400 GPUs on LUMI."""
    model = model_set.stage1.model
    if not model.wind_scan:
        return
    if not config["synthetic"]["enabled"] and not config["data"].get("wind_table"):
        report.warnings.append(
            "data.wind_table: null but stage1.model.wind_scan is on, so no sample "
            "has wind and nothing is scanned by it; set data.wind_table (rule "
            "era5_wind) or stage1.model.wind_scan: false"
        )
    for rule in (stage.train_rule for stage in STAGES if stage.reads_wind):
        res = rule_resources(config, rule, overrides)
        if res.world_size <= 1:
            continue
        if "wind_cache" not in train_inputs.get(rule, set()):
            report.errors.append(
                f"{rule}: {res.world_size} ranks scan by wind but the rule does "
                "not take the wind cache (results/wind/scan_orders.npz) as input"
            )
        if model.wind_allow_recompute:
            report.errors.append(
                f"{rule}: wind_allow_recompute is set but the stage runs on "
                f"{res.world_size} ranks; recomputing is for one process only"
            )


def check_site(
    config: dict, cluster: Cluster, report: Report, overrides: dict | None = None, *, bills=(), cwd: Path | None = None
) -> None:
    """The run against the site's facts: QOS and partition minimums, image architectures,
    storage the site purges, caches under a small $HOME, and what the site file only guesses."""
    from vcloud.runtime import site_checks

    used = set()
    for key in config["resources"]:
        res = rule_resources(config, key, overrides)
        used.add(res.partition)
        report.errors += site_checks.check_qos(res, cluster, f"resources.{key}")
    errors, warnings = site_checks.check_images(cluster, sorted(p for p in used if p in cluster.partitions))
    report.errors += errors
    report.warnings += [w for w in warnings if "cannot be read here" not in w]  # the login node may lack it
    longest: dict[str, float] = {}  # a stage's trainings of a grid run side by side: its longest
    for b in bills:
        if b.rule in TRAIN_RULES and b.jobs:
            longest[b.rule] = max(longest.get(b.rule, 0.0), b.expected_hours)
    run_hours = sum(longest.values())
    errors, warnings = site_checks.check_purge(config, cluster, Path(cwd or "."), run_hours)
    report.errors += errors
    report.warnings += warnings
    report.errors += site_checks.check_home_caches(cluster, config.get("runtime_env") or {})
    report.warnings += site_checks.unverified_lines(cluster)


def stage_gpus(config: dict, cluster: Cluster, overrides: dict | None = None) -> dict[str, list[str]]:
    """{partition: [stage rules]} of the stage rules that run on a GPU partition of the site."""
    found: dict[str, list[str]] = {}
    for stage in STAGES:
        for rule in stage.rules.values():
            res = rule_resources(config, rule, overrides)
            if res.gpus and cluster.gpu_of(res.partition) is not None:
                found.setdefault(res.partition, []).append(rule)
    return found


PHASE_WORDS = {"step": "step", "validate": "validation", "teacher": "teacher's pseudo-labelling"}


def check_memory(
    model_set,
    cluster: Cluster,
    report: Report,
    *,
    estimate=None,
    estimates: dict | None = None,
    partitions: dict[str, str] | list[str] | None = None,
) -> None:
    """Each stage's training estimate (runtime.stage_memory: fake tensors, seconds a stage)
    against one GPU of the partition its training runs on; one error line per stage that
    does not fit, naming the estimate, the GPU and the fix.

    partitions: {stage name: partition} (preflight: where each train_stage<n> runs on a GPU),
    or partitions every stage is checked against (default: the site's GPU placement).
    estimates: {stage name: estimate_stage's result, or GB} instead of estimating; estimate:
    stage 1's alone (models.memory.estimate's result), and only stage 1 is checked."""
    try:
        from vcloud.runtime.stage_memory import estimate_stage
    except ImportError:  # torch is not on a LUMI login node
        report.warnings.append(
            "memory: not estimated (torch is not importable here); run "
            "`singularity exec <image> vcloud doctor` to check it"
        )
        return
    if estimate is not None:
        estimates = {"stage1": estimate["cfdt_gb_configured"]}
    if not isinstance(partitions, dict):
        every = partitions or [cluster.placement.get("gpu", "small-g")]
        names = estimates or [stage.name for stage in STAGES]
        placement = [(name, partition) for name in names for partition in every]
    else:
        placement = sorted(partitions.items())
    done: dict[str, dict] = {}
    for name, partition in placement:
        gpu = cluster.gpu_of(partition)
        if gpu is None:
            continue
        if name not in done:
            found = (estimates or {}).get(name)
            if found is None and estimates is None:
                found = estimate_stage(model_set, int(name.removeprefix("stage")), every=False)
            if found is None:
                continue
            done[name] = found if isinstance(found, dict) else {"gb_configured": found, "largest_phase": "step"}
        gb, phase = done[name]["gb_configured"], done[name]["largest_phase"]
        what = "" if phase == "step" else f", its {PHASE_WORDS[phase]}"
        report.lines.append(
            f"{name.replace('stage', 'stage-')} memory estimate: {gb:.1f} GB per GPU{what} "
            f"(limit {gpu.memory_gb:g} GB: {partition}'s {gpu.model})"
        )
        if gb * MEMORY_MARGIN > gpu.memory_gb:
            report.errors.append(
                f"memory: the {name.replace('stage', 'stage-')} {PHASE_WORDS[phase]} needs about {gb:.1f} GB "
                f"({gb * MEMORY_MARGIN:.1f} GB with the {MEMORY_MARGIN - 1:.0%} margin), more than the "
                f"{gpu.memory_gb:g} GB of one {gpu.model} on {partition}; {memory_fix(model_set, name, phase)}"
            )


def memory_fix(model_set, name: str, phase: str) -> str:
    """What lowers a stage's memory: the optimisations of its phase that are off, a smaller batch."""
    from vcloud.runtime.stage_memory import STAGE_OPTIMISATIONS

    number = int(name.removeprefix("stage"))
    section = getattr(model_set, name)
    batch = f"{name}.train.batch_size (now {section.train.batch_size})"
    if phase == "teacher":
        seeds = section.self_training.sampler_seeds
        return f"lower {batch} or {name}.self_training.sampler_seeds (now {seeds}) in the model config"
    on = {k: v not in (False, None) for k, v in vars(model_set.stage1.model.optimisations).items()}
    on["bf16"] = section.train.bf16
    keys = {k: f"stage1.model.optimisations.{k}" for k in on} | {"bf16": f"{name}.train.bf16"}
    off = [keys[k] for k in STAGE_OPTIMISATIONS[number] if not on[k]]
    also = f" or stage2.model.ensemble (now {model_set.stage2.model.ensemble})" if phase == "validate" else ""
    turn_on = f"turn on {', '.join(off)} or " if off else ""
    return f"{turn_on}lower {batch}{also} in the model config (`vcloud memory --stage {number}`)"


def check_precision(model_set, cluster: Cluster, partitions: dict[str, list[str]], report: Report) -> None:
    """bf16 on a GPU without it (compute capability < 8.0: P100, V100) is refused before
    submission; torch.cuda.is_bf16_supported() would say yes there, through emulation."""
    bf16 = [stage.name for stage in STAGES if getattr(model_set, stage.name).train.bf16]
    for name, rules in partitions.items():
        gpu = cluster.gpu_of(name)
        if gpu is None or gpu.has_bf16 or not bf16:
            continue
        report.errors.append(
            f"{model_set.name}: {', '.join(s + '.train.bf16' for s in bf16)} is on, but {', '.join(rules)} run on "
            f"{name}, whose {gpu.model} (compute capability {gpu.compute_capability:g}) has no bf16; set "
            "train.bf16: false for them in the model config, or run on a partition with compute capability >= 8.0"
        )


def measured_epoch_minutes(config: dict) -> dict[str, float]:
    """Minutes per epoch of each training stage that has logged epochs (metrics.jsonl under
    paths.results, relative to the working directory), else as a passing rehearsal measured them:
    an EpochMinutes, with the samples per epoch each training rule's epoch time belongs to."""
    from vcloud.runtime.bill import EpochMinutes, epoch_basis
    from vcloud.runtime.cluster import measured_epoch_minutes as from_lines

    found = {}
    for stage in STAGES:
        path = Path(config["paths"]["results"]) / stage.folder / "metrics.jsonl"
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        if (minutes := from_lines(lines)) is not None:
            found[stage.train_rule] = minutes
    from vcloud.runtime.rehearsal import rehearsed_epoch_minutes

    rehearsed = {rule: m for rule, m in rehearsed_epoch_minutes(config).items() if rule not in found}
    found.update(rehearsed)  # the real run's own epochs win once it has some
    return EpochMinutes(found, basis=epoch_basis(config, rehearsed=tuple(rehearsed)))


# --- entry points -------------------------------------------------------------------------


def preflight(
    config: dict,
    model_set,
    *,
    apptainer_args: str | None,
    precommand: str | None,
    train_inputs: dict[str, set[str]],
    memory: bool,
    overrides: dict | None = None,
    epoch_minutes: dict | None = None,
    cwd: Path | None = None,
    repo: Path | None = None,
) -> Report:
    """Every check; the Snakefile calls this with the workflow's own settings (overrides:
    `--set-resources` per rule, epoch_minutes: measured per training rule, cwd: where the
    jobs run, repo: the checkout whose code the image must carry, and the host's versions)."""
    cluster = Cluster.from_config(config)
    report = Report()
    if cluster is None:
        report.errors.append("cluster: no cluster section (use config/lumi.yaml)")
        return report
    if problem := cluster.account_problem():
        report.errors.append(problem)
    check_container(cluster, apptainer_args, precommand, report)
    if cwd is not None:
        check_paths(config, cluster, report, Path(cwd))
    if repo is not None:
        from vcloud.runtime.image import check as check_image
        from vcloud.runtime.profile import version_problems, version_warnings

        report.errors += version_problems()
        report.warnings += version_warnings(repo)
        report.errors += check_image(image=cluster.image, env_image=cluster.env_image, repo=repo)
        if not cluster.host_installs:  # snakemake runs from the image: it must carry it (in the image only)
            from vcloud.runtime.image_run import package_problems

            report.errors += package_problems(repo)
        from vcloud.runtime.image import version_stamp
        from vcloud.runtime.rehearsal import doctor_warning

        if advice := doctor_warning(config, version_stamp(repo)):
            report.warnings.append(advice)
    try:
        check_resources(config, cluster, report, overrides)
    except ConfigError as err:  # a refused --set-resources
        report.errors.append(str(err))
        return report
    check_wind(config, model_set, train_inputs, report, overrides)
    gpus = stage_gpus(config, cluster, overrides)
    check_precision(model_set, cluster, gpus, report)
    if memory:  # each stage against the GPU its training runs on
        placement = {s.name: p for p, rules in gpus.items() for s in STAGES if s.train_rule in rules}
        check_memory(model_set, cluster, report, partitions=placement or None)
    check_resubmission(config, model_set, cluster, report, overrides, epoch_minutes)
    bills = billed_hours(config, cluster, report, overrides, model_set=model_set, epoch_minutes=epoch_minutes)
    check_job_count(cluster, report, bills)
    check_site(config, cluster, report, overrides, bills=bills, cwd=cwd)
    from vcloud.runtime.budget import check_budget  # data budget against cluster.quotas

    check_budget(config, model_set if memory else None, report)
    return report


def run(profile: Path, config_file: Path | None) -> Report:
    """`vcloud doctor [--profile DIR] [--config FILE]`."""
    from vcloud.config import load_model_config
    from vcloud.runtime.profile import (
        load_workflow_config,
        render,
        repo_root,
        supports_array_jobs,
    )

    settings = _read_profile(profile)
    files = [Path(f) for f in settings.get("configfiles", [])]
    if config_file is not None:
        files = [Path(config_file)]
    if not files:
        raise ConfigError(f"{profile}: no configfiles, and no --config given")
    config = load_workflow_config(*files)
    model_path = Path(config["model_config"])
    if not model_path.is_absolute() and not model_path.exists():
        model_path = repo_root(files[0]) / model_path
    model_set = load_model_config(model_path)
    wind = model_set.stage1.model.wind_scan
    inputs = {stage.train_rule: ({"wind_cache"} if stage.reads_wind and wind else set()) for stage in STAGES}
    report = preflight(
        config,
        model_set,
        apptainer_args=settings.get("apptainer-args"),
        precommand=settings.get("precommand"),
        train_inputs=inputs,
        memory=True,
        overrides=_profile_overrides(settings),
        epoch_minutes=measured_epoch_minutes(config),
        cwd=Path.cwd(),
        repo=repo_root(files[0]),
    )
    cluster = Cluster.from_config(config)
    if cluster is not None:
        text = (Path(profile) / "config.yaml").read_text()
        if text != render(cluster, source=_profile_source(settings, files), array_jobs=supports_array_jobs()):
            report.errors.append(
                f"{profile}/config.yaml: stale, not generated from {files[-1]}; run `{profile_command(cluster.name)}`"
            )
    return report


def _profile_overrides(settings: dict) -> dict:
    """The profile's own set-resources (rule -> {name: value}), as snakemake would apply them."""
    found = settings.get("set-resources") or {}
    if isinstance(found, list):  # ["rule:name=value", ...]
        out: dict = {}
        for item in found:
            rule, _, pair = str(item).partition(":")
            name, _, value = pair.partition("=")
            out.setdefault(rule, {})[name] = value
        return out
    return found if isinstance(found, dict) else {}


def _profile_source(settings: dict, files: list[Path]) -> str:
    named = settings.get("configfiles") or []
    return named[-1] if named else str(files[-1])


def _read_profile(profile: Path) -> dict:
    path = Path(profile) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{profile}: no config.yaml (a snakemake profile folder)")
    data = parse_yaml(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping")
    return data

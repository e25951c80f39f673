# Input functions and path helpers shared by every rules file (get_* / is_*).
import shlex
import json
import re
from pathlib import Path
from types import SimpleNamespace

from vcloud.config import config_hash, load_model_config, stage_config_dict
from vcloud.errors import ConfigError
from vcloud.data.archive import (
    archive_for,
    check_data_config,
    classify,
    discover_raw_rois,
    index_file,
)
from vcloud.data.layout import parse_roi
from vcloud.data.splits import assign_splits
from vcloud.runtime.lumi import (
    Cluster,
    RuleResources,
    billing,
    launch_prefix,
    retries_needed,
    slurm_resources,
    uses_container,
)

check_data_config(config)  # one line for old keys (data.raw_dir) before anything else
DATA = config["data"]
PATHS = config["paths"]
PREPARED = PATHS["prepared"]
RESULTS = PATHS["results"]


wildcard_constraints:
    roi=r"ROIs\d{4}_\d+",
    split="train|val|test",
    archive=r"s[12]_[A-Za-z]+(_test)?\.tar\.gz",


def is_synthetic():
    return config["synthetic"]["enabled"]


def get_raw_paths():
    """Raw inputs: the synthetic folder, or data.raw (a path or a list of paths)."""
    if is_synthetic():
        return [PATHS["synthetic_raw"]]
    raw = DATA["raw"]
    return [raw] if isinstance(raw, str) else list(raw)


def is_archive_input():
    """The raw data are downloaded archives (read in place), not an extracted tree."""
    if is_synthetic():
        return config["synthetic"]["archives"]
    return any(classify(Path(path)) != "tree" for path in get_raw_paths())


def get_index_dir():
    return f"{PREPARED}/index"


def get_synthetic_outputs():
    """synth_raw's outputs: the archives that hold the synthetic ROIs, or the tree folder."""
    root = PATHS["synthetic_raw"]
    if not config["synthetic"]["archives"]:
        return {"raw": directory(root)}
    rois = [parse_roi(text) for text in config["synthetic"]["rois"]]
    names = sorted(
        {archive_for(roi, kind).filename for roi in rois for kind in ("s1", "s2")}
    )
    files = {"archives": [f"{root}/{name}" for name in names]}
    files.update(wind=f"{root}/wind.csv", truth=f"{root}/truth.csv")
    return files


def find_archive(name):
    """The downloaded (or synthetic) archive of that name among the raw paths."""
    for raw in get_raw_paths():
        path = Path(raw)
        candidate = path if path.name == name else path / name
        if is_synthetic() or candidate.is_file():
            return str(candidate)
    raise WorkflowError(
        f"data.raw: no archive {name} under {', '.join(get_raw_paths())}"
    )


def get_synthetic_root(output):
    """The folder synth_raw writes: its directory output, or the folder of its archives."""
    return output.raw if "raw" in output.keys() else str(Path(output.wind).parent)


def get_archive(wildcards):
    return find_archive(wildcards.archive)


def get_rois():
    """ROIs to prepare: the synthetic list, the configured list, or every ROI of the raw data."""
    if is_synthetic():
        return [parse_roi(text) for text in config["synthetic"]["rois"]]
    if DATA["rois"] != "all":
        return [parse_roi(text) for text in DATA["rois"]]
    found = discover_raw_rois([Path(p) for p in get_raw_paths()])
    if not found:
        raise WorkflowError(
            f"data.raw: no ROI in {', '.join(get_raw_paths())} (no SEN12MS-CR-TS archive, "
            "no ROIsXXXX/<roi> folder)"
        )
    return found


def get_split_rois(split):
    splits = assign_splits(
        get_rois(), test=DATA["splits"]["test"], val=DATA["splits"]["val"]
    )
    if not splits[split]:
        raise WorkflowError(
            f"data.splits: split '{split}' has no ROI among the ROIs to prepare"
        )
    return splits[split]


def get_prepared_roi(roi):
    return f"{PREPARED}/rois/{roi.slug}.zarr"


def get_split_store(split):
    return f"{PREPARED}/{split}.zarr"


def get_prepare_input(wildcards):
    """The ROI's two archives and their indexes, or its folder of an extracted tree."""
    roi = parse_roi(wildcards.roi)
    if is_archive_input():
        names = [archive_for(roi, kind).filename for kind in ("s1", "s2")]
        archives = [find_archive(name) for name in names]
        return {
            "archives": archives,
            "indexes": [index_file(archive, get_index_dir()) for archive in archives],
        }
    if is_synthetic():
        return {"raw": rules.synth_raw.output.raw}
    for raw in get_raw_paths():
        folder = Path(raw) / roi.rois / str(roi.roi)
        if folder.is_dir():
            return {"raw": str(folder)}
    raise WorkflowError(
        f"data.raw: ROI {roi} not found under {', '.join(get_raw_paths())}"
    )


def get_raw_flags():
    return " ".join(f"--raw {shlex.quote(str(path))}" for path in get_raw_paths())


def get_wind_table():
    """The wind prepare_roi stores: the synthetic tree's wind.csv, data.wind_table, or None."""
    if is_synthetic():
        return f"{PATHS['synthetic_raw']}/wind.csv"
    return DATA["wind_table"]


def get_wind_input(wildcards):
    """prepare_roi's wind as an input, so that rule era5_wind runs first when it makes it.
    (The synthetic wind.csv comes inside the synth_raw folder, already an input.)"""
    table = None if is_synthetic() else DATA["wind_table"]
    return {"wind": table} if table else {}


def get_era5_rois():
    return [] if is_synthetic() else get_rois()


def get_era5_input():
    """The raw inputs whose places and dates need wind (real data only): what prepare_roi reads."""
    files = []
    for roi in get_era5_rois():
        for value in get_prepare_input(SimpleNamespace(roi=roi.slug)).values():
            files.extend([value] if isinstance(value, str) else value)
    return sorted(set(files))


def get_model_config():
    """config.model_config, relative to the working directory or else to this repository."""
    path = Path(config["model_config"])
    if not path.is_absolute() and not path.exists():
        path = Path(VCLOUD_ROOT) / path
    return str(path)


MODEL_SET = load_model_config(get_model_config())


def get_stage_hash(stage):
    """Changes when a setting the stage depends on changes: the rule reruns (params trigger)."""
    return config_hash(stage_config_dict(MODEL_SET, stage))


def get_checkpoint(stage):
    return f"{RESULTS}/stage{stage}/best.pt"


def is_wind_scan():
    return MODEL_SET.stage1.model.wind_scan


def get_wind_cache():
    return f"{RESULTS}/wind/scan_orders.npz"


def get_wind_grid():
    """The CFDT's coarsest token grid for whole patches: patch_size / 8 on each side."""
    scale = 2 ** (len(MODEL_SET.stage1.model.widths) - 1)
    size = DATA["patch_size"]
    if size % scale:
        raise WorkflowError(
            f"data.patch_size: {size} is not a multiple of {scale} (the CFDT's downsampling)"
        )
    return size // scale, size // scale


def get_train_input(stage):
    """Split stores, the best.pt of every stage this one builds on, and the wind cache."""
    upstream = {0: (), 1: (), 2: (0, 1), 3: (0, 1, 2)}[stage]
    inputs = {"train": get_split_store("train"), "val": get_split_store("val")}
    inputs.update({f"stage{n}": get_checkpoint(n) for n in upstream})
    if stage >= 1 and is_wind_scan():
        inputs["wind_cache"] = get_wind_cache()
    return inputs


def get_upstream_flags(input):
    names = [n for n in input.keys() if n.startswith("stage") or n == "wind_cache"]
    return " ".join(f"--{n.replace('_', '-')} {input[n]}" for n in names)


def get_evaluate_input(stage):
    """The test split and the checkpoints a stage's predictions need."""
    needed = {0: (0,), 1: (1,), 2: (0, 1, 2), 3: (3,)}[stage]
    inputs = {"store": get_split_store("test")}
    inputs.update({f"stage{n}": get_checkpoint(n) for n in needed})
    if stage >= 1 and is_wind_scan():
        inputs["wind_cache"] = get_wind_cache()
    return inputs


def get_eval_report(stage):
    return f"{RESULTS}/eval/stage{stage}.json"


def get_viewer_input():
    """The test split, every stage's checkpoint (stages 1-3 are shown) and the wind cache."""
    inputs = {"store": get_split_store("test")}
    inputs.update({f"stage{n}": get_checkpoint(n) for n in range(4)})
    if is_wind_scan():
        inputs["wind_cache"] = get_wind_cache()
    return inputs


def get_viewer_page():
    return f"{RESULTS}/viewer/index.html"


def get_report_file(name):
    """Figures and tables made for `snakemake --report` (results/report/...)."""
    return f"{RESULTS}/report/{name}"


def get_curves(stage):
    return get_report_file(f"curves/stage{stage}.png")


def get_metrics_logs(checkpoints):
    """results/stage<n>/metrics.jsonl beside each best.pt (written by the same rule)."""
    return [str(Path(ckpt).parent / "metrics.jsonl") for ckpt in checkpoints]


def get_resources_json():
    """Each rule's resources as its jobs get them (--set-resources applied) and what LUMI
    bills for them per hour, as one JSON string for `vcloud accounting --resources`."""
    out = {}
    for rule_name in get_resource_rules():
        res = get_rule_resources(rule_name)
        entry = {
            "threads": res.threads,
            "gpus": res.gpus,
            "nodes": res.nodes,
            "mem_mb": res.mem_mb,
            "partition": res.partition,
        }
        part = CLUSTER.partitions.get(res.partition) if CLUSTER else None
        if part is not None:
            bill = billing(res, part)
            entry["billing"] = {"unit": bill.unit, "per_hour": bill.per_hour}
        out[rule_name] = entry
    return json.dumps(out, sort_keys=True)


def get_accounting_input():
    """Everything the run makes but the accounting itself: it runs last and counts them all."""
    splits = [get_split_store(split) for split in ("train", "val", "test")]
    checkpoints = [get_checkpoint(stage) for stage in range(4)]
    return (
        splits
        + checkpoints
        + [get_eval_report(stage) for stage in range(4)]
        + [get_viewer_page()]
        + [get_curves(stage) for stage in range(4)]
        + [get_report_file("evaluation.html")]
    )


def get_final_outputs():
    return get_accounting_input() + [get_report_file("accounting.tsv")]


CLUSTER = Cluster.from_config(config)  # None: local run (no cluster section)


def get_resources(rule_name):
    return config["resources"][rule_name]


def get_resource_key(rule_name):
    """The config entry of a rule: its name, or its family (evaluate_stage2 -> evaluate)."""
    if rule_name in config["resources"]:
        return rule_name
    return re.sub(r"_stage\d+$", "", rule_name)


def get_resource_rules():
    """Every rule with a resources entry (the evaluate entry serves four rules)."""
    names = []
    for key in config["resources"]:
        names += [f"{key}_stage{n}" for n in range(4)] if key == "evaluate" else [key]
    return names


def get_resource_overrides(rule_name):
    """`--set-resources RULE:NAME=VALUE` of this rule (jobs receive the same arguments)."""
    found = workflow.resource_settings.overwrite_resources.get(rule_name) or {}
    return {name: getattr(value, "raw", value) for name, value in dict(found).items()}


def get_thread_override(rule_name):
    found = workflow.resource_settings.overwrite_threads.get(rule_name)
    return None if found is None else int(getattr(found, "raw", found))


def get_rule_resources(rule_name):
    """The rule's resources entry after --set-resources/--set-threads: the launch line, the
    doctor and the accounting all follow what the job is actually given."""
    res = RuleResources.from_config(config, get_resource_key(rule_name), rule=rule_name)
    try:
        return res.with_overrides(
            get_resource_overrides(rule_name), threads=get_thread_override(rule_name)
        )
    except ConfigError as err:
        raise WorkflowError(str(err)) from None


def get_threads(rule_name):
    return get_rule_resources(rule_name).threads


def get_slurm_resources(rule_name):
    """runtime and mem_mb; on a cluster also partition, account, GPUs, CPUs, nodes, and for
    GPU rules the wall-time warning (slurm_extra) and their own job step (mpi)."""
    return slurm_resources(get_rule_resources(rule_name), CLUSTER)


def get_container(rule_name):
    """The cluster's image, except for self-launched rules (they srun into it themselves)."""
    if uses_container(get_rule_resources(rule_name), CLUSTER):
        return CLUSTER.image
    return None


def get_launch_prefix(rule_name):
    """srun + singularity exec on a cluster (+ torchrun for several GCDs on one node)."""
    return launch_prefix(get_rule_resources(rule_name), CLUSTER)


def get_epoch_minutes():
    """Measured minutes per epoch of the stages that logged epochs already."""
    from vcloud.runtime.doctor import measured_epoch_minutes

    return measured_epoch_minutes(config)


EPOCH_MINUTES = get_epoch_minutes() if CLUSTER is not None else {}


def get_retries(rule_name):
    """On a cluster, resubmissions of a GPU job: enough jobs for the stage's epochs at the
    measured (else configured) epoch time, plus cluster.spare_retries. None elsewhere (the
    global --retries applies)."""
    if CLUSTER is None:
        return None
    if not workflow.is_main_process:
        # Inside the SLURM job: a rule's own retries would rerun the command in the same
        # allocation after the warning (measured: a second step, killed at the time limit).
        # Snakemake >= 9.14.1 does this for --retries; the rule directive needs it here.
        return 0
    res = get_rule_resources(rule_name)
    stage = re.fullmatch(r"train_stage(\d)", rule_name)
    minutes = EPOCH_MINUTES.get(rule_name) or res.epoch_minutes
    if stage is None or minutes is None:
        return CLUSTER.spare_retries
    epochs = getattr(MODEL_SET, f"stage{stage.group(1)}").train.epochs
    try:
        return retries_needed(
            epochs=epochs,
            epoch_minutes=minutes,
            runtime=res.runtime,
            signal_seconds=CLUSTER.signal_seconds,
            restart_minutes=CLUSTER.restart_minutes,
            spare=CLUSTER.spare_retries,
        )
    except ConfigError as err:
        raise WorkflowError(f"resources.{get_resource_key(rule_name)}: {err}") from None


def get_runtime_env_flags():
    return " ".join(
        f"--env {shlex.quote(f'{name}={value}')}"
        for name, value in config["runtime_env"].items()
    )


def get_precommand():
    """The profile's precommand; None while unknown (remote settings come after parsing)."""
    remote = workflow.remote_execution_settings
    return None if remote is None else (remote.precommand or "")


def get_cluster_report():
    """vcloud doctor's checks, with this run's own apptainer args and rule inputs."""
    from vcloud.runtime.doctor import preflight

    settings = workflow.deployment_settings
    inputs = {
        f"train_stage{n}": set(getattr(rules, f"train_stage{n}").input.keys())
        for n in range(4)
    }
    found = preflight(
        config,
        MODEL_SET,
        apptainer_args=settings.apptainer_args,
        precommand=get_precommand(),
        train_inputs=inputs,
        memory=False,
        overrides={name: get_resource_overrides(name) for name in get_resource_rules()},
        epoch_minutes=EPOCH_MINUTES,
    )
    methods = {str(m).lower() for m in settings.deployment_method}
    if not any("apptainer" in m for m in methods):
        found.errors.append(
            "software-deployment-method: apptainer is not on, so rules would run outside "
            "the image (use the lumi profile)"
        )
    return found


def warn_cluster_problems():
    """At parse time (dry runs too): every failed check as a warning."""
    if CLUSTER is None or not workflow.is_main_process:
        return
    for line in get_cluster_report().errors:
        logger.warning(f"vcloud doctor: {line}")


def check_cluster():
    """At workflow start (onstart: real runs only): stop before anything is submitted."""
    if CLUSTER is None:
        return
    found = get_cluster_report()
    logger.info("\n".join(found.lines))
    if found.errors:
        raise WorkflowError(
            "vcloud doctor: "
            + "\nvcloud doctor: ".join(found.errors)
            + "\n(nothing was submitted)"
        )

# Result paths and the input functions of the training, evaluation and export rules. Which
# checkpoints a rule takes comes from the stage registry (src/vcloud/registry.py) through
# vcloud.workflow; this file only names the paths of the runs (common.smk: RUNS, RUN_PATHS).
# The rules that each run has (training, evaluation, the fixed protocol, the wind cache, the
# stage tables) take the run from the wildcard {run}: empty for a single run, else the run's
# folder under the results, <experiment>/seed<k>, with a leading slash; their input functions read
# that run's model set and paths.
from vcloud import workflow as logic
from vcloud.config import config_hash, stage_config_dict
from vcloud.config.experiments import baseline_run
from vcloud.errors import ConfigError
from vcloud.registry import STAGE_NUMBERS, VIEWER_STAGES

# The paths of the rules that have a {run} wildcard (results{run}/stage<n>/best.pt, ...).
PATTERN = RunPaths(prepared=PREPARED, results=f"{RESULTS}{{run}}")
RUN_OF = {run.prefix: (run, paths) for run, paths in zip(RUNS, RUN_PATHS)}


def get_run(wildcards):
    """(Run, RunPaths) of a job's {run} wildcard."""
    return RUN_OF[wildcards.run]


def get_run_model_set(wildcards):
    return RUN_OF[wildcards.run][0].model_set


def get_makers(key):
    """The {run} wildcard's constraint for a file `key` of RunPaths.homes ("stage<n>", "eval<n>",
    "fixed_protocol", "wind"): the runs that make it, not those that read another run's.
    """
    return logic.prefix_pattern(logic.makers(RUNS, RUN_PATHS, key))


def get_all_runs():
    return logic.prefix_pattern(RUN_OF)


def get_research_runs():
    """run_config's constraint: research runs only (a single run uses the model config itself)."""
    return logic.prefix_pattern(RUN_OF if RESEARCH else [])


def get_run_model_config(wildcards):
    """The model config a run's jobs read: config.model_config, or the run's own (run_config)."""
    return (
        RUN_OF[wildcards.run][1].run_model_config() if RESEARCH else get_model_config()
    )


def get_run_config_input(wildcards):
    """A research run's model config as an input, ancient: the stage hash (a param) decides what
    reruns when it changes, not its time."""
    return (
        {"model_config": ancient(get_run_model_config(wildcards))} if RESEARCH else {}
    )


def get_run_changes(wildcards):
    """A research run's model-config changes (the experiment's, then the seed's) as JSON."""
    return json.dumps(get_run(wildcards)[0].changes, sort_keys=True)


def get_stage_hash(stage):
    """Changes when a setting the stage depends on changes: the rule reruns (params trigger)."""
    return lambda wildcards: config_hash(
        stage_config_dict(get_run(wildcards)[0].model_set, stage)
    )


def is_wind_scan(model_set=MODEL_SET):
    return model_set.stage1.model.wind_scan


def get_wind_grid(model_set=MODEL_SET):
    """The CFDT's coarsest token grid for whole patches: patch_size / 8 on each side."""
    try:
        return logic.wind_grid(DATA["patch_size"], model_set.stage1.model.widths)
    except ConfigError as err:
        raise WorkflowError(str(err)) from None


def get_wind_cache_input(model_set=MODEL_SET, paths=RUN):
    """The wind cache when the CFDT scans by wind (stages that read it take it as input)."""
    return paths.wind_cache() if is_wind_scan(model_set) else None


def get_train_input(stage):
    """Split stores, the best.pt of every stage this one builds on, and the wind cache."""

    def inputs(wildcards):
        run, paths = get_run(wildcards)
        found = logic.train_inputs(
            stage,
            run.model_set,
            train=paths.split_store("train"),
            val=paths.split_store("val"),
            checkpoint_path=paths.checkpoint,
            wind_cache=get_wind_cache_input(run.model_set, paths),
        )
        return {**found, **get_run_config_input(wildcards)}

    return inputs


def get_checkpoint_flags(input):
    """--stage<n> PATH and --wind-cache PATH of a rule's inputs (vcloud train/evaluate/viewer)."""
    return logic.checkpoint_flags(dict(input.items()))


def get_scored(path):
    """An evaluation file of RunPaths with its split as the wildcard {scored} (RunPaths.split_suffix:
    empty for test, ".val" for val)."""
    stem, _, ext = path.rpartition(".")
    return f"{stem}{{scored}}.{ext}"


def get_scored_splits():
    """{scored}'s constraint: test only for a single run (its pipeline unchanged), test and val for
    research runs (designs are chosen on val, reported on test)."""
    splits = ["test", "val"] if RESEARCH else ["test"]
    return logic.prefix_pattern([RunPaths.split_suffix(split) for split in splits])


def get_scored_split(wildcards):
    return "val" if wildcards.scored else "test"


def get_evaluate_input(stage):
    """The split's store (test, or val in research runs), the checkpoints a stage's predictions
    need, the fixed protocol's detection on that store, and the pairing file of protocol
    uncrtaints when the model config names one (the test split's; vcloud evaluate reads it there).
    """

    def inputs(wildcards):
        run, paths = get_run(wildcards)
        split = get_scored_split(wildcards)
        found = logic.evaluate_inputs(
            stage,
            store=paths.split_store(split),
            checkpoint_path=paths.checkpoint,
            wind_cache=get_wind_cache_input(run.model_set, paths),
        )
        found["fixed_protocol"] = paths.fixed_protocol(split)
        pairs = run.model_set.evaluation.uncrtaints.pairs
        found.update({"uncrtaints_pairs": pairs} if pairs and split == "test" else {})
        return {**found, **get_run_config_input(wildcards)}

    return inputs


def get_fixed_protocol_input(wildcards):
    """The store whose fixed samples are detected (test, or val in research runs)."""
    store = RUN.split_store(get_scored_split(wildcards))
    return {**get_run_config_input(wildcards), "store": store}


def get_evaluation_hash(wildcards):
    """Changes when the model config's evaluation section changes: the evaluations rerun."""
    return config_hash(get_run(wildcards)[0].model_set.evaluation)


def get_fixed_protocol_hash(wildcards):
    """Changes when a model setting the fixed samples depend on changes: the file is remade."""
    return config_hash(logic.fixed_protocol_settings(get_run(wildcards)[0].model_set))


def get_stage_tables_input(wildcards):
    """report_tables' inputs: the run's evaluation reports, where each run's stage is scored."""
    paths = get_run(wildcards)[1]
    return [paths.eval_report(stage) for stage in STAGE_NUMBERS]


def get_compare_reports(split="test"):
    """Every research run's evaluation reports on a split (a shared one where it is shared)."""
    return [
        (run, paths.eval_report(stage, split))
        for run, paths in zip(RUNS, RUN_PATHS)
        for stage in STAGE_NUMBERS
    ]


def get_compare_flags():
    """vcloud compare's --baseline, and --val-report/--report EXPERIMENT SEED REPORT per run."""
    flags = [
        f"--{flag} {run.experiment} {'-' if run.seed is None else run.seed} {shlex.quote(path)}"
        for split, flag in (("val", "val-report"), ("test", "report"))
        for run, path in get_compare_reports(split)
    ]
    return " ".join([f"--baseline {baseline(config, RUNS)}", *flags])


def get_all_outputs():
    """What `all` asks for: the single run's every output, or each research run's checkpoints,
    evaluations and stage tables, the comparison of the runs, the viewer (the baseline's) and the
    accounting."""
    if not RESEARCH:
        return RUN.final_outputs(MODEL_SET.name)
    return get_research_outputs() + [
        RUN.viewer_page(),
        RUN.report_file("accounting.tsv"),
    ]


def get_comparison_outputs():
    """results/compare.json and .md: a research run's, in `all` through the accounting."""
    return [RUN.comparison(), RUN.comparison("md")] if RESEARCH else []


def get_tracking_outputs():
    """results/mlflow.db (rule export_mlflow) with tracking.mlflow on; off by default, MLflow being
    optional: the default pipeline neither needs it nor waits for the export."""
    return [f"{RESULTS}/mlflow.db"] if config["tracking"]["mlflow"] else []


def get_research_outputs():
    """Every research run's files (a shared one once), the accounting's inputs."""
    files = [f for paths in RUN_PATHS for f in paths.run_outputs()]
    return list(dict.fromkeys(files))


def get_accounting_input():
    if RESEARCH:
        return get_research_outputs() + get_comparison_outputs() + [RUN.viewer_page()]
    return RUN.accounting_inputs()


def get_viewer_run():
    """(Run, RunPaths) whose samples the viewer shows: the single run, or in a research run
    compare's baseline experiment under its first seed (beside the comparison of every run).
    """
    if not RESEARCH:
        return RUNS[0], RUN
    return RUN_OF[baseline_run(config, RUNS).prefix]


def get_viewer_input():
    """The test split, the checkpoints of the shown stages' predictors, the wind cache and the
    fixed protocol's detection, of the run the viewer shows (another run's where it shares them);
    in a research run also that run's model config and the comparison of the runs."""
    run, paths = get_viewer_run()
    inputs = logic.viewer_inputs(
        VIEWER_STAGES,
        store=paths.split_store("test"),
        checkpoint_path=paths.checkpoint,
        wind_cache=get_wind_cache_input(run.model_set, paths),
    )
    inputs["fixed_protocol"] = paths.fixed_protocol()
    if RESEARCH:
        inputs["model_config"] = ancient(paths.run_model_config())
        inputs["comparison"] = RUN.comparison()
    return inputs


def get_viewer_model_config():
    """The viewer's --config: config.model_config, or the shown research run's own (run_config)."""
    return get_viewer_run()[1].run_model_config() if RESEARCH else get_model_config()


def get_viewer_comparison_flags(input):
    """--comparison results/compare.json --run EXPERIMENT SEED of a research run's viewer (with a
    leading space); nothing for a single run, whose command line stays as it was."""
    run = get_viewer_run()[0]
    comparison = input.comparison if RESEARCH else None
    return logic.viewer_comparison_flags(
        comparison, experiment=run.experiment, seed=run.seed
    )


def is_rehearsal():
    """The dev-g rehearsal (config/lumi-rehearsal.yaml): its transport step and summary run."""
    return config["rehearsal"]["enabled"]


def get_full_model_config():
    """The real run's model config (config/models/full.yaml): the epoch sizes the rehearsal's
    measured step times are turned into."""
    return f"{VCLOUD_ROOT}/config/models/full.yaml"


def get_rehearsal_summary_input(wildcards):
    found = {
        "train": RUN.split_store("train"),
        "reports": [RUN.eval_report(stage) for stage in STAGE_NUMBERS],
        "checkpoints": [RUN.checkpoint(stage) for stage in STAGE_NUMBERS],
    }
    if config["rehearsal"]["transport"]:
        found["transport"] = RUN.transport_report()
    return found


def get_rehearsal_outputs():
    return [config["rehearsal"]["summary"]] if is_rehearsal() else []


# --- vcloud predict (workflow/rules/predict.smk) ---


def get_predict_rois():
    return [roi.slug for roi in get_split_rois(PREDICT["split"])]


def get_predict_outputs():
    """What `all` asks of predict (the manifests when predict.enabled, else nothing)."""
    if not PREDICT["enabled"]:
        return []
    return [RUN.predict_manifest(PREDICT["stage"], roi) for roi in get_predict_rois()]


def get_predict_input(wildcards):
    """The ROI's prepared store and the checkpoints (and wind cache) the stage's predictor reads."""
    return logic.evaluate_inputs(
        PREDICT["stage"],
        store=RUN.roi_store(wildcards.roi),
        checkpoint_path=RUN.checkpoint,
        wind_cache=get_wind_cache_input(),
    )


def get_predict_flags():
    """The predict section as vcloud predict flags (a params entry: a change reruns the jobs)."""
    flags = f"--min-cover {PREDICT['min_cover']} --batch-size {PREDICT['batch_size']}"
    if PREDICT["draws"] is not None:
        flags += f" --draws {PREDICT['draws']}"
    return flags


# --- vcloud bundle (workflow/rules/predict.smk) ---


def get_bundle_input():
    """The checkpoints (and wind cache) of the viewer's stages, the training split (the card's
    patch size and data) and those stages' evaluation reports (the card's figures)."""
    inputs = logic.viewer_inputs(
        VIEWER_STAGES,
        store=RUN.split_store("train"),
        checkpoint_path=RUN.checkpoint,
        wind_cache=get_wind_cache_input(),
    )
    return {**inputs, "reports": [RUN.eval_report(stage) for stage in VIEWER_STAGES]}


def get_bundle_stage_flags():
    return " ".join(f"--stage {stage}" for stage in VIEWER_STAGES)


def get_rehearsed_model_config():
    """The model config of the run the rehearsal tries: a grid's run's own (run_config), else
    config.model_config."""
    return RUN_PATHS[0].run_model_config() if RESEARCH else get_model_config()


def get_rehearsed_input(wildcards):
    """The summary's inputs, and a grid's rehearsed run's model config (made by run_config)."""
    found = get_rehearsal_summary_input(wildcards)
    return (
        {**found, "model_config": get_rehearsed_model_config()} if RESEARCH else found
    )


def get_rehearsed_run_flags():
    """--experiment and --seed of a grid's rehearsed run, which the summary names; none else."""
    if not RESEARCH:
        return ""
    run = RUNS[0]
    seed = "" if run.seed is None else f" --seed {run.seed}"
    return f"--experiment {shlex.quote(run.experiment)}{seed}"

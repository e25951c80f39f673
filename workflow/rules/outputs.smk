# What `all` asks for (the predict and rehearsal parts: predict_inputs.smk, rehearsal_inputs.smk)
# and the input functions of the rules that gather every run's results: the stage tables, the
# comparison of research runs and the accounting (report.smk), the viewer (export.smk). Each run's
# paths: runs.smk.
from vcloud.config.experiments import baseline, baseline_run
from vcloud.registry import VIEWER_STAGES


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

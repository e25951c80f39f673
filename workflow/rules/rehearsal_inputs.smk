# The input functions of the rehearsal (its rules: rehearsal.smk; config/rehearsal.yaml sets
# rehearsal.enabled): whether it runs, what `all` asks of it, its summary's inputs and flags.
# With experiments and seeds the rehearsal tries one run of the grid, RUNS' only one
# (vcloud.config.experiments.rehearsed_run), its files where a single run's lie.


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

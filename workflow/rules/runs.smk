# Each run's paths and the input functions of the training, wind-cache and evaluation rules
# (train.smk, wind.smk, evaluate.smk). The runs are common.smk's RUNS and RUN_PATHS: one per
# experiment and seed (config experiments:, seeds:), else a single run. Which checkpoints a rule
# takes comes from the stage registry (src/vcloud/registry.py) through vcloud.workflow; this file
# only names the paths of the runs.
# The rules that each run has (training, evaluation, the fixed protocol, the wind cache, the
# stage tables) take the run from the wildcard {run}: empty for a single run, else the run's
# folder under the results, <experiment>/seed<k>, with a leading slash; their input functions read
# that run's model set and paths.
import json

from vcloud import workflow as logic
from vcloud.config import config_hash, stage_config_dict
from vcloud.errors import ConfigError
from vcloud.registry import STAGE_NUMBERS

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

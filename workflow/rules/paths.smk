# Result paths and the input functions of the training, evaluation and export rules. Which
# checkpoints a rule takes comes from the stage registry (src/vcloud/registry.py) through
# vcloud.workflow; this file only names the paths of this run.
from vcloud import workflow as logic
from vcloud.config import config_hash, stage_config_dict
from vcloud.errors import ConfigError
from vcloud.registry import STAGE_NUMBERS, VIEWER_STAGES


def get_stage_hash(stage):
    """Changes when a setting the stage depends on changes: the rule reruns (params trigger)."""
    return config_hash(stage_config_dict(MODEL_SET, stage))


def is_wind_scan():
    return MODEL_SET.stage1.model.wind_scan


def get_wind_grid():
    """The CFDT's coarsest token grid for whole patches: patch_size / 8 on each side."""
    try:
        return logic.wind_grid(DATA["patch_size"], MODEL_SET.stage1.model.widths)
    except ConfigError as err:
        raise WorkflowError(str(err)) from None


def get_wind_cache_input():
    """The wind cache when the CFDT scans by wind (stages that read it take it as input)."""
    return RUN.wind_cache() if is_wind_scan() else None


def get_train_input(stage):
    """Split stores, the best.pt of every stage this one builds on, and the wind cache."""
    return logic.train_inputs(
        stage,
        MODEL_SET,
        train=RUN.split_store("train"),
        val=RUN.split_store("val"),
        checkpoint_path=RUN.checkpoint,
        wind_cache=get_wind_cache_input(),
    )


def get_checkpoint_flags(input):
    """--stage<n> PATH and --wind-cache PATH of a rule's inputs (vcloud train/evaluate/viewer)."""
    return logic.checkpoint_flags(dict(input.items()))


def get_evaluate_input(stage):
    """The test split, the checkpoints a stage's predictions need, and the pairing file of
    protocol uncrtaints when the model config names one (vcloud evaluate reads it there).
    """
    inputs = logic.evaluate_inputs(
        stage,
        store=RUN.split_store("test"),
        checkpoint_path=RUN.checkpoint,
        wind_cache=get_wind_cache_input(),
    )
    inputs["fixed_protocol"] = RUN.fixed_protocol()
    pairs = MODEL_SET.evaluation.uncrtaints.pairs
    return {**inputs, "uncrtaints_pairs": pairs} if pairs else inputs


def get_evaluation_hash():
    """Changes when the model config's evaluation section changes: the evaluations rerun."""
    return config_hash(MODEL_SET.evaluation)


def get_fixed_protocol_hash():
    """Changes when a model setting the fixed samples depend on changes: the file is remade."""
    return config_hash(logic.fixed_protocol_settings(MODEL_SET))


def get_viewer_input():
    """The test split, the checkpoints of the shown stages' predictors, the wind cache and the
    fixed protocol's detection."""
    inputs = logic.viewer_inputs(
        VIEWER_STAGES,
        store=RUN.split_store("test"),
        checkpoint_path=RUN.checkpoint,
        wind_cache=get_wind_cache_input(),
    )
    return {**inputs, "fixed_protocol": RUN.fixed_protocol()}


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

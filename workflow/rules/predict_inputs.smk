# The input functions of vcloud predict and vcloud bundle (their rules: predict.smk) and the
# predict section they read, PREDICT (predict.smk reads it too).
from vcloud.data.splits import split_location_store
from vcloud.registry import VIEWER_STAGES

PREDICT = config["predict"]


def get_predict_rois():
    return [roi.slug for roi in get_split_rois(PREDICT["split"])]


def get_predict_outputs():
    """What `all` asks of predict (the manifests when predict.enabled, else nothing)."""
    if not PREDICT["enabled"]:
        return []
    return [RUN.predict_manifest(PREDICT["stage"], roi) for roi in get_predict_rois()]


def get_predict_store(roi):
    """The ROI's prepared store; under data.temporal_split its predict.split dates only (rule
    split_location), so that no date of another split is reconstructed."""
    if FOLDER and FOLDER.temporal:
        return split_location_store(PREPARED, PREDICT["split"], roi)
    return RUN.roi_store(roi)


def get_predict_input(wildcards):
    """The ROI's prepared store and the checkpoints (and wind cache) the stage's predictor reads."""
    return logic.evaluate_inputs(
        PREDICT["stage"],
        store=get_predict_store(wildcards.roi),
        checkpoint_path=RUN.checkpoint,
        wind_cache=get_wind_cache_input(),
    )


def get_predict_flags():
    """The predict section as vcloud predict flags (a params entry: a change reruns the jobs)."""
    flags = f"--min-cover {PREDICT['min_cover']} --batch-size {PREDICT['batch_size']}"
    if PREDICT["draws"] is not None:
        flags += f" --draws {PREDICT['draws']}"
    return flags


# --- vcloud bundle ---


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

"""The stage hash: what a stage depends on, so what reruns when a setting changes.

A stage depends on the data section, its own section and the `model` sections of the stages
upstream of it (registry.STAGES). The hash decides whether latest.pt may be resumed, and the
workflow passes it as a rule parameter: changing stage 3's settings reruns stage 3 only, a
stage-1 model width reruns stages 1, 2 and 3.
"""

from __future__ import annotations

import hashlib
import json

from vcloud.config.model_sets import ModelSetConfig, config_to_dict
from vcloud.registry import get_stage

# Settings of how a run is observed, not of what it learns: they change no stage hash.
NOT_HASHED_TRAIN_KEYS = ("tensorboard",)


def stage_config_dict(cfg: ModelSetConfig, stage: int) -> dict:
    """What a stage depends on: data, its own section and the model sections upstream of it."""
    full = config_to_dict(cfg)
    name = get_stage(stage).name
    for key in NOT_HASHED_TRAIN_KEYS:
        full[name].get("train", {}).pop(key, None)
    picked = {"data": full["data"], name: full[name]}
    for upstream in get_stage(stage).upstream:
        picked[f"stage{upstream}"] = {"model": full[f"stage{upstream}"].get("model")}
    return picked


def config_hash(config) -> str:
    """Stable hash of a config: a changed hyperparameter starts training fresh."""
    text = json.dumps(config_to_dict(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

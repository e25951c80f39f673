"""The stage hash: what a stage depends on, so what reruns when a setting changes.

A stage depends on the data section, its own section and, transitively, the whole identity
of every stage it builds on (registry.STAGES `upstream`, and `init_from` when the config turns
it on): stage 3's hash holds the hashes of
stages 1 and 2, and stage 2's holds stage 1's. The workflow passes it as a rule parameter:
changing stage 3's settings reruns stage 3 only, any stage-1 setting reruns stages 1, 2 and 3.
The trainer adds the digests of the upstream weights (known only at run time) to make the
resume key (train/checkpoint.py resume_key): latest.pt is resumed only under the same key.
"""

from __future__ import annotations

import hashlib
import json

from vcloud.config.model_sets import ModelSetConfig, config_to_dict
from vcloud.registry import get_stage

# Settings of how a run is observed, not of what it learns: they change no stage hash.
NOT_HASHED_TRAIN_KEYS = ("tensorboard",)
# The evaluation keys a stage that validates on the natural-cloud protocols reads (its best
# checkpoint depends on them); the rest of the evaluation section reruns evaluations only.
NATURAL_VALIDATION_KEYS = ("reference_truths", "uncrtaints.dates", "uncrtaints.min_cov", "uncrtaints.max_cov")


def stage_config_dict(cfg: ModelSetConfig, stage: int) -> dict:
    """What a stage depends on: data, its own section, the model sections of the stages it
    builds on (read by its builder) and their whole identities, transitively ("upstream")."""
    full = config_to_dict(cfg)
    spec = get_stage(stage)
    for key in NOT_HASHED_TRAIN_KEYS:
        full[spec.name].get("train", {}).pop(key, None)
    if full["data"].get("bands") == "l1c":  # the default band set hashes as before data.bands existed
        full["data"].pop("bands")
    picked = {"data": full["data"], spec.name: full[spec.name]}
    builds_on = spec.builds_on(cfg)
    for upstream in builds_on:
        picked[f"stage{upstream}"] = {"model": full[f"stage{upstream}"].get("model")}
    if spec.validates_natural:
        picked["validation"] = {key: _lookup(full["evaluation"], key) for key in NATURAL_VALIDATION_KEYS}
    if builds_on:  # absent for a first stage: its hash is what it was before (resumable)
        picked["upstream"] = {f"stage{n}": stage_hash(cfg, n) for n in builds_on}
    return picked


def _lookup(section: dict, dotted: str):
    for part in dotted.split("."):
        section = section[part]
    return section


def stage_hash(cfg: ModelSetConfig, stage: int) -> str:
    """The hash of everything stage `stage` depends on (stage_config_dict)."""
    return config_hash(stage_config_dict(cfg, stage))


def config_hash(config) -> str:
    """Stable hash of a config: a changed hyperparameter starts training fresh."""
    text = json.dumps(config_to_dict(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]

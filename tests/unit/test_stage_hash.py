"""The stage hash is transitive: a stage's key holds the whole identity of every stage it builds on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from vcloud import registry
from vcloud.config import config_hash, load_model_config, stage_config_dict
from vcloud.config.stage_hash import stage_hash
from vcloud.train import checkpoint as ckpt

SMALL = Path(__file__).parents[2] / "config/models/small.yaml"


def _hash(tmp_path, stage, edit=lambda d: None) -> str:
    data = yaml.safe_load(SMALL.read_text())
    edit(data)
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(data))
    return stage_hash(load_model_config(path), stage)


@pytest.fixture
def chain(monkeypatch):
    """Stage 3 builds on stage 2 only: what stage 1 is reaches it through stage 2 alone."""
    stages = tuple(dataclasses.replace(s, upstream=(2,)) if s.number == 3 else s for s in registry.STAGES)
    monkeypatch.setattr(registry, "STAGES", stages)


def test_a_change_two_stages_up_changes_the_key_through_the_stage_between(tmp_path, chain):
    base = _hash(tmp_path, 3)
    assert set(stage_config_dict(load_model_config(SMALL), 3)["upstream"]) == {"stage2"}
    assert (
        _hash(tmp_path, 3, lambda d: d["stage1"]["model"].update(gate_width=d["stage1"]["model"]["gate_width"] * 2))
        != base
    )
    assert _hash(tmp_path, 3, lambda d: d["stage1"]["train"].update(seed=d["stage1"]["train"]["seed"] + 1)) != base
    assert _hash(tmp_path, 3, lambda d: d["stage2"]["model"].update(ensemble=2)) != base
    assert _hash(tmp_path, 3, lambda d: d["stage0"]["train"].update(seed=7)) != base  # stage 1 starts from it
    assert _hash(tmp_path, 3, lambda d: d["stage3"]["train"].update(tensorboard=False)) == base  # not learnt


def test_a_first_stage_hashes_its_own_settings_and_what_it_is_selected_on():
    cfg = load_model_config(SMALL)
    # stage 1 starts from stage 0 (init_from_stage0); its best checkpoint is chosen on the
    # natural-cloud protocols too
    assert set(stage_config_dict(cfg, 1)) == {"data", "stage0", "stage1", "upstream", "validation"}
    off = dataclasses.replace(cfg, stage1=dataclasses.replace(cfg.stage1, init_from_stage0=False))
    assert set(stage_config_dict(off, 1)) == {"data", "stage1", "validation"}
    assert set(stage_config_dict(cfg, 0)) == {"data", "stage0"}  # the autoencoder validates on its own
    assert stage_hash(cfg, 1) == config_hash(stage_config_dict(cfg, 1))


def test_the_natural_validation_settings_rerun_the_stages_selected_on_them_only():
    import dataclasses

    cfg = load_model_config(SMALL)
    more = dataclasses.replace(cfg, evaluation=dataclasses.replace(cfg.evaluation, reference_truths=2))
    assert stage_hash(more, 0) == stage_hash(cfg, 0)
    assert all(stage_hash(more, n) != stage_hash(cfg, n) for n in (1, 2, 3))
    baseline = dataclasses.replace(cfg, evaluation=dataclasses.replace(cfg.evaluation, nearest_clear_max_cover=0.2))
    assert all(stage_hash(baseline, n) == stage_hash(cfg, n) for n in (0, 1, 2, 3))  # evaluation only


def test_other_upstream_weights_make_another_resume_key(tmp_path):
    import torch

    def best(name, value):
        path = tmp_path / name
        weights = {"w": torch.full((2, 2), value)}
        ckpt.save_checkpoint(path, {**ckpt.checkpoint_meta(stage=1, config_hash="s1"), "model": weights})
        return path

    stage2 = stage_hash(load_model_config(SMALL), 2)
    one, again, other = best("a.pt", 1.0), best("b.pt", 1.0), best("c.pt", 2.0)
    key = ckpt.resume_key(stage2, {1: ckpt.weights_digest(one)})
    assert ckpt.resume_key(stage2, {1: ckpt.weights_digest(again)}) == key  # same weights, another file
    assert ckpt.resume_key(stage2, {1: ckpt.weights_digest(other)}) != key

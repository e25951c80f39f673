"""The stage-1 curriculum of the shipped configs shows every cloud kind early enough."""

from pathlib import Path

import pytest

from vcloud.config import load_model_config
from vcloud.train.stages import EVAL_KINDS, _cloudy

CONFIGS = Path(__file__).parents[2] / "config" / "models"


def test_small_config_trains_on_every_cloud_kind_from_the_first_epoch(tiny_store):
    cfg = load_model_config(CONFIGS / "small.yaml")
    train_set = _cloudy(cfg, tiny_store, train=True, stage_epochs=cfg.stage1.train.epochs)
    for epoch in range(cfg.stage1.train.epochs):
        assert set(train_set.kinds_at(epoch)) == set(EVAL_KINDS), epoch
    seen = {int(train_set[i]["cloud_class"]) for i in range(len(train_set))}  # the first epoch's draws
    assert seen == {1, 2, 3}  # thin, thick and opaque all drawn in one short epoch


@pytest.mark.parametrize("name", ["small.yaml", "full.yaml"])
def test_curriculum_reaches_opaque_clouds_within_the_first_third(tiny_store, name):
    cfg = load_model_config(CONFIGS / name)
    epochs = cfg.stage1.train.epochs
    train_set = _cloudy(cfg, tiny_store, train=True, stage_epochs=epochs)
    first_all = next(e for e in range(epochs) if "opaque" in train_set.kinds_at(e))
    assert first_all <= epochs // 3, (name, first_all, epochs)

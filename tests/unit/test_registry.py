"""The stage registry: a consistent declaration per stage, and everything else reads it."""

import dataclasses
import inspect

import pytest

from vcloud import workflow as logic
from vcloud.config import ModelSetConfig
from vcloud.errors import ConfigError
from vcloud.registry import STAGE_NUMBERS, STAGES, VIEWER_STAGES, get_stage, require_checkpoints, resolve


def test_stages_are_numbered_in_order_and_build_only_on_earlier_stages():
    assert STAGE_NUMBERS == tuple(range(len(STAGES)))
    for stage in STAGES:
        assert all(n < stage.number for n in stage.upstream), stage
        assert stage.init_from is None or stage.init_from < stage.number, stage
        # A predictor reads finished stages only: this one and those it was trained on.
        assert set(stage.predictor_needs) <= {stage.number, *stage.upstream}, stage
        assert stage.name == f"stage{stage.number}" and stage.train_rule == f"train_stage{stage.number}"


def test_every_stage_has_a_config_section_a_builder_and_a_predictor():
    sections = {f.name for f in ModelSetConfig.__dataclass_fields__.values()}
    for stage in STAGES:
        assert stage.name in sections
        builder = inspect.signature(resolve(stage.builder))
        # The builder takes exactly what Stage.build passes.
        starts = () if stage.init_from is None else (stage.init_from,)
        wanted = {"train", "val", *(f"stage{n}_ckpt" for n in (*stage.upstream, *starts))}
        wanted |= {"wind"} if stage.reads_wind else set()
        wanted |= {"device"} if stage.needs_device else set()
        assert set(list(builder.parameters)[1:]) == wanted, stage
        assert list(inspect.signature(resolve(stage.predictor)).parameters) == ["cfg", "checkpoints", "wind"]


def test_unknown_stage_and_missing_checkpoints_are_one_line():
    with pytest.raises(ConfigError, match=r"^no stage 4 \(stages: 0, 1, 2, 3\)$"):
        get_stage(4)
    with pytest.raises(ConfigError, match=r"^vcloud train --stage 3 needs --stage1 and --stage2 CHECKPOINT$"):
        get_stage(3).upstream_checkpoints({0: "a.pt"}, None)
    assert require_checkpoints((0, 1), {0: "a", 1: "b", 3: "c"}, command="x") == {0: "a", 1: "b"}


def fake_path(n):
    return f"R/stage{n}/best.pt"


@pytest.mark.parametrize("init", [True, False])
@pytest.mark.parametrize("wind", [None, "W.npz"])
def test_workflow_inputs_follow_the_registry(wind, init, small):
    cfg = dataclasses.replace(small, stage1=dataclasses.replace(small.stage1, init_from_stage0=init))
    for stage in STAGES:
        train = logic.train_inputs(stage.number, cfg, train="T", val="V", checkpoint_path=fake_path, wind_cache=wind)
        starts = (stage.init_from,) if init and stage.init_from is not None else ()
        assert {k: v for k, v in train.items() if k.startswith("stage")} == {
            f"stage{n}": fake_path(n) for n in (*stage.upstream, *starts)
        }
        assert ("wind_cache" in train) == bool(wind and stage.reads_wind)
        evaluate = logic.evaluate_inputs(stage.number, store="S", checkpoint_path=fake_path, wind_cache=wind)
        assert sorted(k for k in evaluate if k.startswith("stage")) == [f"stage{n}" for n in stage.predictor_needs]
        assert ("wind_cache" in evaluate) == bool(wind and stage.reads_wind)
    viewer = logic.viewer_inputs(VIEWER_STAGES, store="S", checkpoint_path=fake_path, wind_cache=wind)
    # the pixel-space refiner reads no stage-0 weights: the viewer does not wait for stage 0
    assert sorted(k for k in viewer if k.startswith("stage")) == ["stage1", "stage2", "stage3"]


def test_stage1_builds_on_stage0_only_where_the_config_says(small):
    assert small.stage1.init_from_stage0  # the shipped default
    assert get_stage(1).builds_on(small) == (0,)
    off = dataclasses.replace(small, stage1=dataclasses.replace(small.stage1, init_from_stage0=False))
    assert get_stage(1).builds_on(off) == ()
    with pytest.raises(ConfigError, match=r"^vcloud train --stage 1 needs --stage0 CHECKPOINT$"):
        get_stage(1).upstream_checkpoints({}, small)
    assert get_stage(1).upstream_checkpoints({}, off) == {}


def test_only_the_stage_heading_a_chain_trains_first():
    assert [logic.train_priority(stage.number) for stage in STAGES] == [1, 0, 0, 0]


def test_checkpoint_flags_pass_every_checkpoint_and_the_wind_cache_in_order():
    inputs = {"store": "S", "stage0": "a b/best.pt", "stage2": "c.pt", "wind_cache": "w.npz", "train": "T"}
    assert logic.checkpoint_flags(inputs) == "--stage0 'a b/best.pt' --stage2 c.pt --wind-cache w.npz"


def test_wind_grid_and_rule_lookup():
    assert logic.wind_grid(256, (32, 64, 128, 256)) == (32, 32)
    with pytest.raises(ConfigError, match=r"data.patch_size: 100 is not a multiple of 8"):
        logic.wind_grid(100, (1, 2, 3, 4))
    assert logic.stage_of_rule("train_stage2") is get_stage(2)
    assert logic.stage_of_rule("evaluate_stage2") is None
    assert logic.deployment_problems(["apptainer", "conda"]) == []
    assert "apptainer is not on" in logic.deployment_problems(["conda"])[0]


def test_the_viewer_shows_the_registry_stages_with_their_labels():
    from vcloud.export.viewer import LAYERS, METHODS, THUMBNAIL_LAYERS, needed_checkpoints

    assert VIEWER_STAGES == (1, 2, 3)
    assert [layer.key for layer in LAYERS if layer.key.startswith("stage")] == ["stage1", "stage2", "stage3"]
    assert METHODS["stage2"] == "stage 2 refined" and LAYERS[-1].label == "error of stage 3"
    assert THUMBNAIL_LAYERS == ("input", "stage1", "stage2", "stage3", "truth", "error")
    assert needed_checkpoints() == (1, 2, 3)


def test_fixed_protocol_settings_are_what_the_fixed_samples_depend_on(small):
    from dataclasses import replace

    base = logic.fixed_protocol_settings(small)
    assert base == {"input_dates": 4, "clear_target_max_cover": small.data.clear_target_max_cover}
    for change in ({"input_dates": 5}, {"clear_target_max_cover": 0.2}):
        assert logic.fixed_protocol_settings(replace(small, data=replace(small.data, **change))) != base
    # Training-only data settings never remake the file (the fixed samples are whole patches).
    assert logic.fixed_protocol_settings(replace(small, data=replace(small.data, crop=16, num_workers=3))) == base

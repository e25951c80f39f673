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


# --- the drills (issue 26, outcome 3): a stage added, a folder moved, in the registry only ------

REPO = __import__("pathlib").Path(__file__).parents[2]


def use_registry(monkeypatch, stages) -> None:
    """`stages` as the registry, also where a module imported its names (as the next process
    would see them after an edit of registry.py)."""
    import sys

    from vcloud import registry

    derived = {
        "STAGES": stages,
        "STAGE_NUMBERS": tuple(s.number for s in stages),
        "VIEWER_STAGES": tuple(s.number for s in stages if s.viewer_label),
    }
    before = {name: getattr(registry, name) for name in derived}
    for module in [m for name, m in sys.modules.items() if name.startswith("vcloud") and m is not None]:
        for name, value in derived.items():
            if getattr(module, name, None) is before[name]:
                monkeypatch.setattr(module, name, value)


@pytest.fixture
def with_stage4(monkeypatch):
    """A test registry with a stage 4 that fine-tunes stage 3's refiner and is shown in the viewer;
    the viewer module is rebuilt from it (and from the real registry afterwards)."""
    import importlib

    from vcloud.export import viewer

    stage4 = dataclasses.replace(
        get_stage(3),
        number=4,
        upstream=(1, 3),
        predictor_needs=(1, 4),
        folder="",
        viewer_label="stage 4 fine-tuned",
        label="fine-tuned",
        trains="stage2",
        predictor="vcloud.evaluation.predict:refined",
    )
    import sys

    imported = set(sys.modules)
    use_registry(monkeypatch, (*STAGES, stage4))
    yield stage4
    monkeypatch.undo()
    # A module first imported during the test (a lazy import of the code under test) took the test
    # registry's names: it goes, and is imported again, from the real registry, where next needed.
    for name in [name for name in sys.modules if name.startswith("vcloud") and name not in imported]:
        del sys.modules[name]
    importlib.reload(viewer)


def test_a_stage_added_to_a_test_registry_gets_rules_folder_resources_bill_line_and_viewer_layer(with_stage4):
    import importlib

    from vcloud.config.workflow import fill_stage_resources
    from vcloud.export import viewer
    from vcloud.runtime.bill import rule_bills
    from vcloud.runtime.cluster import Cluster, RuleResources
    from vcloud.runtime.profile import load_workflow_config

    assert with_stage4.folder == "stage4" and with_stage4.model_section == "stage2"
    assert "train_stage4" in logic.train_rules() and "evaluate_stage4" in logic.evaluate_rules()
    # Resources: the registry's defaults, local and on LUMI, with no config entry.
    local = fill_stage_resources({"resources": {}})["resources"]
    assert local["train_stage4"] == {"runtime": 60, "mem_mb": 4000, "threads": 2}
    config = load_workflow_config(REPO / "config/lumi.yaml")  # validated against the schema
    assert config["resources"]["evaluate_stage4"]["partition"] == "small-g"
    # The bill has its lines, priced as one GCD.
    model_set = __import__("vcloud.config", fromlist=["x"]).load_model_config(REPO / "config/models/full.yaml")
    model_set = type(
        "WithStage4",
        (),
        {**{f: getattr(model_set, f) for f in model_set.__dataclass_fields__}, "stage4": model_set.stage3},
    )()
    cluster = Cluster.from_config(config)
    bills, _ = rule_bills(config, cluster, lambda rule: RuleResources.from_config(config, rule), model_set=model_set)
    by_rule = {bill.rule: bill for bill in bills}
    assert by_rule["train_stage4"].jobs == 1 and by_rule["train_stage4"].unit == "GPU-h"
    assert by_rule["evaluate_stage4"].per_hour == by_rule["evaluate_stage3"].per_hour
    # The viewer: its layer, and the page opens on it (the last shown stage).
    importlib.reload(viewer)
    assert ("stage4", "stage 4 fine-tuned") in [(layer.key, layer.label) for layer in viewer.LAYERS]
    assert viewer.LAST == "stage4"
    # The accounting books its hours under it.
    from vcloud.export.report import stage_of

    assert stage_of("evaluate_stage4") == "stage4" and stage_of("index_archive") == "data"


def test_a_stage_rule_the_registry_does_not_know_is_one_line():
    from vcloud.config.workflow import fill_stage_resources

    with pytest.raises(
        ConfigError, match=r"^resources\.train_stage7: no stage 7 in the registry \(stages: 0, 1, 2, 3\)$"
    ):
        fill_stage_resources({"resources": {"train_stage7": {"runtime": 1}}})


def test_a_config_entry_changes_the_registry_resources_key_by_key():
    from vcloud.config.workflow import fill_stage_resources

    config = fill_stage_resources({"cluster": {"name": "x"}, "resources": {"train_stage3": {"epoch_minutes": 5}}})
    assert config["resources"]["train_stage3"] == {
        **get_stage(3).rule_resources("train", cluster=True),
        "epoch_minutes": 5,
    }
    assert config["resources"]["train_stage3"]["runtime"] == 2880  # stage 3's own, from its entry


def test_a_results_folder_moved_in_the_registry_moves_every_path(monkeypatch, tmp_path):
    """The doctor's measured epoch times and the rehearsal's summary follow the folder (the rules'
    paths: tests/workflow/test_registry_drills.py runs the real pipeline)."""
    from vcloud.runtime.doctor import measured_epoch_minutes
    from vcloud.runtime.rehearsal import stage_summary

    use_registry(monkeypatch, tuple(dataclasses.replace(s, folder="refiner") if s.number == 2 else s for s in STAGES))
    rows = [{"epoch": e, "epoch_s": 120.0, "wall_time": 1000.0 + 120 * e} for e in range(3)]
    (tmp_path / "refiner").mkdir()
    (tmp_path / "refiner/metrics.jsonl").write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    (tmp_path / "refiner/best.pt").write_bytes(b"")
    found = measured_epoch_minutes({"paths": {"results": str(tmp_path)}, "rehearsal": {"enabled": False}})
    assert "train_stage2" in found
    summary = stage_summary(results=tmp_path, logs=tmp_path, stage=get_stage(2))
    assert summary["finished"] and summary["epochs"] == 3

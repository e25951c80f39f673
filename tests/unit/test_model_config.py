"""The model-config loader (YAML -> frozen dataclasses, one-line errors naming the key) and the
stage hash (what a setting's change reruns)."""

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from vcloud.config import (
    DataConfig,
    TrainConfig,
    coerce,
    config_hash,
    from_dict,
    load_model_config,
    stage_config_dict,
)
from vcloud.errors import ConfigError
from vcloud.registry import STAGE_NUMBERS

ROOT = Path(__file__).parents[2]
SMALL = ROOT / "config/models/small.yaml"


def small() -> dict:
    return yaml.safe_load(SMALL.read_text())


def write(tmp_path, data) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def one_line_error(path) -> str:
    with pytest.raises(ConfigError) as info:
        load_model_config(path)
    text = str(info.value)
    assert "\n" not in text, text
    return text


# --- loader ---------------------------------------------------------------------------------


def test_every_shipped_model_config_loads():
    for path in sorted((ROOT / "config/models").glob("*.yaml")) + [ROOT / "tests/workflow/tiny_models.yaml"]:
        cfg = load_model_config(path)
        assert cfg.stage1.model.widths and cfg.data.input_dates >= 1, path


def test_unknown_key_is_named_with_its_path_and_the_allowed_keys(tmp_path):
    data = small()
    data["stage1"]["model"]["tmt_layer"] = 3
    text = one_line_error(write(tmp_path, data))
    assert text.startswith(f"{tmp_path / 'models.yaml'}: unknown key stage1.model.tmt_layer (allowed: ")
    assert "tmt_layers" in text


@pytest.mark.parametrize(
    ("where", "value", "expected"),
    [
        (("stage0", "train", "epochs"), "3", "key stage0.train.epochs: expected an integer, got '3'"),
        (("stage0", "train", "epochs"), True, "key stage0.train.epochs: expected an integer, got True"),
        (("stage2", "train", "lr"), "fast", "key stage2.train.lr: expected a number, got 'fast'"),
        (("stage1", "train", "bf16"), 1, "key stage1.train.bf16: expected true or false, got 1"),
        (("stage1", "model", "widths"), [8, 8, 8], "key stage1.model.widths: expected 4 values, got 3"),
        (("stage1", "model", "widths"), 8, "key stage1.model.widths: expected a list, got 8"),
        (("stage2", "model", "schedule"), "cubic", "key stage2.model.schedule: 'cubic' is not one of cosine, linear"),
        (("stage0", "model"), [1], "key stage0.model: expected a mapping, got list"),
        (("name",), 3, "key name: expected a string, got 3"),
    ],
)
def test_wrong_type_is_one_line_naming_the_key(tmp_path, where, value, expected):
    data = small()
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    assert one_line_error(write(tmp_path, data)) == f"{tmp_path / 'models.yaml'}: {expected}"


def test_missing_required_key_is_named(tmp_path):
    data = small()
    del data["stage2"]["train"]["batch_size"]
    assert one_line_error(write(tmp_path, data)).endswith(": missing key stage2.train.batch_size")


def test_a_post_init_check_names_the_full_key_path(tmp_path):
    data = small()
    data["stage1"]["model"]["tmt_heads"] = 0
    assert one_line_error(write(tmp_path, data)).endswith(": key stage1.model.tmt_heads: 0 must be > 0")
    # the refiner's ensemble size and pixel-unshuffle factor, a stage's own samples per epoch
    for section, key in (("model", "ensemble"), ("model", "patch"), ("train", "samples_per_epoch")):
        data = small()
        data["stage2"][section][key] = 0
        assert one_line_error(write(tmp_path, data)).endswith(f": key stage2.{section}.{key}: 0 must be > 0")
    data = small()
    data["stage1"]["curriculum"] = {"mixed_from": 0.9, "all_from": 0.3}
    assert ": key stage1.curriculum: need 0 <= mixed_from (0.9) <= all_from (0.3) <= 1" in one_line_error(
        write(tmp_path, data)
    )


def test_missing_and_unparsable_files_are_named(tmp_path):
    assert one_line_error(tmp_path / "none.yaml") == f"{tmp_path / 'none.yaml'}: model configuration file not found"
    (tmp_path / "bad.yaml").write_text("a: [1,\n")
    assert one_line_error(tmp_path / "bad.yaml").startswith(f"{tmp_path / 'bad.yaml'}: not valid YAML")


def test_coerce_keeps_values_and_converts_only_int_to_float():
    assert coerce(float, 2, "k") == 2.0 and isinstance(coerce(float, 2, "k"), float)
    assert coerce(int | None, None, "k") is None
    assert coerce(tuple[int, ...], [1, 2, 3], "k") == (1, 2, 3)
    with pytest.raises(ConfigError, match=r"key k\[1\]: expected an integer, got 'x'"):
        coerce(tuple[int, ...], [1, "x"], "k")
    train = from_dict(TrainConfig, {"epochs": 2, "batch_size": 4, "lr": 1}, "stage0.train")
    assert train == TrainConfig(epochs=2, batch_size=4, lr=1.0) and dataclasses.is_dataclass(train)
    assert from_dict(DataConfig, {"input_dates": 3}, "data").crop is None  # the default


# --- stage hash -----------------------------------------------------------------------------


def hashes(data: dict, tmp_path) -> list[str]:
    cfg = load_model_config(write(tmp_path, data))
    return [config_hash(stage_config_dict(cfg, n)) for n in STAGE_NUMBERS]


def changed(tmp_path, edit) -> set[int]:
    """The stages whose hash changes when `edit` is applied to config/models/small.yaml."""
    before = hashes(small(), tmp_path)
    data = small()
    edit(data)
    after = hashes(data, tmp_path)
    return {n for n, (a, b) in enumerate(zip(before, after)) if a != b}


def test_the_hash_of_an_unchanged_config_is_stable(tmp_path):
    assert hashes(small(), tmp_path) == hashes(small(), tmp_path)
    assert len(set(hashes(small(), tmp_path))) == len(STAGE_NUMBERS)  # every stage its own


@pytest.mark.parametrize(
    ("edit", "reruns"),
    [
        # Stage 1 starts from the autoencoder (stage1.init_from_stage0): it is upstream of every stage...
        (
            lambda d: d["stage0"]["model"].update(latent_channels=d["stage0"]["model"]["latent_channels"] + 1),
            {0, 1, 2, 3},
        ),
        (lambda d: d["stage1"].update(init_from_stage0=False), {1, 2, 3}),
        (lambda d: d["stage2"]["model"].update(ensemble=2), {2, 3}),
        (lambda d: d["stage1"]["model"].update(gate_width=d["stage1"]["model"]["gate_width"] * 2), {1, 2, 3}),
        (lambda d: d["stage2"]["model"].update(sample_steps=d["stage2"]["model"]["sample_steps"] + 1), {2, 3}),
        (lambda d: d["stage3"].setdefault("self_training", {}).update(max_seed_spread=0.5), {3}),
        # A stage's whole identity is upstream of its dependants, training settings included: other
        # stage-1 weights make stages 2 and 3 other experiments (docs/resume.md).
        (lambda d: d["stage1"]["train"].update(lr=d["stage1"]["train"]["lr"] * 2), {1, 2, 3}),
        (lambda d: d["stage0"]["train"].update(epochs=d["stage0"]["train"]["epochs"] + 1), {0, 1, 2, 3}),
        (lambda d: d["stage1"]["curriculum"].update(all_from=1.0), {1, 2, 3}),
        (lambda d: d["stage2"]["train"].update(lr=d["stage2"]["train"]["lr"] * 2), {2, 3}),
        # Data settings feed every stage.
        (lambda d: d["data"].update(input_dates=d["data"]["input_dates"] + 1), {0, 1, 2, 3}),
        # How a run is observed, not what it learns.
        (lambda d: [d[f"stage{n}"]["train"].update(tensorboard=False) for n in STAGE_NUMBERS], set()),
        (lambda d: d.update(name="renamed"), set()),
        # How the stages are evaluated: the evaluations rerun (their own hash), no stage retrains...
        (lambda d: d["evaluation"]["uncrtaints"].update(region="europa"), set()),
        (lambda d: d["evaluation"].update(nearest_clear_max_cover=0.2), set()),
        # ...but stages 1-3 choose their best checkpoint on the natural-cloud protocols of the val
        # split too: what those read (T of uncrtaints, reference truths) reruns them.
        (lambda d: d["evaluation"]["uncrtaints"].update(dates=4), {1, 2, 3}),
        (lambda d: d["evaluation"].update(reference_truths=2), {1, 2, 3}),
        (lambda d: d["stage2"].update(clear_share=0.5), {2, 3}),
        (lambda d: d["stage3"]["self_training"].update(natural_clouds=8), {3}),
    ],
)
def test_what_a_change_reruns(tmp_path, edit, reruns):
    assert changed(tmp_path, edit) == reruns


def test_without_init_from_stage0_the_autoencoder_is_upstream_of_nothing(tmp_path):
    # stage 2 refines in pixel space: only stage 1's start reads stage 0
    def off(d):
        d["stage1"]["init_from_stage0"] = False

    base = small()
    off(base)
    before = hashes(base, tmp_path)
    base["stage0"]["model"]["latent_channels"] += 1
    assert [a != b for a, b in zip(before, hashes(base, tmp_path))] == [True, False, False, False]


def test_init_from_stage0_needs_first_levels_that_match(tmp_path):
    data = small()
    data["stage0"]["model"]["widths"] = [24, 32]
    with pytest.raises(
        ConfigError,
        match=r": key stage1.init_from_stage0: stage0.model's first level \(width 24, 1 blocks\) must equal stage1.model's \(width 16, 1 blocks\)$",
    ):
        load_model_config(write(tmp_path, data))
    data["stage1"]["init_from_stage0"] = False
    assert load_model_config(write(tmp_path, data)).stage0.model.widths == (24, 32)


def test_stage_config_dict_holds_data_its_section_and_upstream_models_only():
    cfg = load_model_config(SMALL)
    picked = stage_config_dict(cfg, 3)
    assert set(picked) == {
        "data",
        "stage1",
        "stage2",
        "stage3",
        "upstream",
        "validation",
    }  # no stage 0: stage 2 refines pixels
    assert set(picked["upstream"]) == {"stage1", "stage2"}  # their whole identities (hashes)
    assert set(picked["stage1"]) == {"model"} and "tensorboard" not in picked["stage3"]["train"]
    assert set(stage_config_dict(cfg, 1)) == {"data", "stage0", "stage1", "upstream", "validation"}
    with pytest.raises(ConfigError, match="no stage 7"):
        stage_config_dict(cfg, 7)


# --- derived model configs: based_on a file beside it, changes only ---------------------------


def test_a_derived_config_reads_its_base_and_changes_only_what_it_names(tmp_path):
    from vcloud.config import config_to_dict

    shipped = Path(__file__).resolve().parents[2] / "config" / "models"
    (tmp_path / "full.yaml").write_text((shipped / "full.yaml").read_text())
    (tmp_path / "short.yaml").write_text("based_on: full.yaml\nname: short\nstage1: {train: {epochs: 2}}\n")
    full = config_to_dict(load_model_config(tmp_path / "full.yaml"))
    short = config_to_dict(load_model_config(tmp_path / "short.yaml"))
    assert short["name"] == "short" and short["stage1"]["train"]["epochs"] == 2
    short["name"], short["stage1"]["train"]["epochs"] = full["name"], full["stage1"]["train"]["epochs"]
    assert short == full


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("based_on: full.yaml\nstage1: {train: {epochz: 2}}\n", "stage1.train.epochz: no such key to override"),
        ("based_on: short.yaml\nname: loop\n", "based_on: short.yaml derives from itself"),
        ("based_on: absent.yaml\n", "absent.yaml: model configuration file not found"),
    ],
)
def test_a_bad_derived_config_is_refused_naming_file_and_key(tmp_path, text, message):
    shipped = Path(__file__).resolve().parents[2] / "config" / "models"
    (tmp_path / "full.yaml").write_text((shipped / "full.yaml").read_text())
    (tmp_path / "short.yaml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_model_config(tmp_path / "short.yaml")

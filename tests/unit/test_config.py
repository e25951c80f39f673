from pathlib import Path

import pytest
import yaml

from vcloud.config import validate_config
from vcloud.errors import ConfigError

ROOT = Path(__file__).parents[2]
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"


@pytest.fixture
def config():
    return yaml.safe_load((ROOT / "config/config.yaml").read_text())


def test_default_config_is_valid(config):
    validate_config(config, SCHEMA)


def test_unknown_key_is_named(config):
    config["data"]["timez"] = 3
    with pytest.raises(ConfigError, match=r"unknown key data\.timez"):
        validate_config(config, SCHEMA)


def test_missing_key_is_named(config):
    del config["data"]["cloud_classes"]["thick_min_prob"]
    with pytest.raises(ConfigError, match=r"missing key data\.cloud_classes\.thick_min_prob"):
        validate_config(config, SCHEMA)


def test_mistyped_key_is_named(config):
    config["data"]["times"] = "thirty"
    with pytest.raises(ConfigError, match=r"key data\.times: 'thirty' is not of type 'integer'"):
        validate_config(config, SCHEMA)


def test_bad_roi_name_and_policy_are_named(config):
    config["data"]["splits"]["val"] = ["2017/22"]
    with pytest.raises(ConfigError, match=r"data\.splits\.val\.0"):
        validate_config(config, SCHEMA)
    config["data"]["splits"]["val"] = []
    config["data"]["on_bad_image"] = "ignore"
    with pytest.raises(ConfigError, match=r"data\.on_bad_image"):
        validate_config(config, SCHEMA)


def test_fill_missing_adds_only_absent_keys_recursively(tmp_path):
    from vcloud.config import fill_missing

    defaults = tmp_path / "defaults.yaml"
    defaults.write_text("data: {times: 30, patch_size: 64, splits: {test: [a], val: [b]}}\nviewer: {samples: 12}\n")
    config = {"data": {"patch_size": 32, "splits": {"test": [c := "x"]}}, "extra": None}
    fill_missing(config, defaults)
    assert config == {
        "data": {"times": 30, "patch_size": 32, "splits": {"test": [c], "val": ["b"]}},
        "viewer": {"samples": 12},
        "extra": None,
    }


def test_the_old_shared_evaluate_resources_key_names_its_replacement(config):
    config["resources"]["evaluate"] = {"runtime": 60, "mem_mb": 4000, "threads": 1}
    with pytest.raises(
        ConfigError,
        match=r"unknown key resources\.evaluate \(resources\.evaluate is now "
        r"resources\.evaluate_stage0\.\.3",
    ):
        validate_config(config, SCHEMA)

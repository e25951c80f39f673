"""The doctor's wind checks on the shipped LUMI configuration (wind scanning on, ERA5 wind)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from vcloud.config import load_model_config
from vcloud.runtime.doctor import Report, check_wind
from vcloud.runtime.profile import load_workflow_config

REPO = Path(__file__).parents[2]
WITH_CACHE = {f"train_stage{n}": {"train", "val"} | ({"wind_cache"} if n else set()) for n in range(4)}


@pytest.fixture(scope="module")
def lumi():
    return load_workflow_config(REPO / "config" / "lumi.yaml")


@pytest.fixture(scope="module")
def full():
    return load_model_config(REPO / "config" / "models" / "full.yaml")


def test_shipped_lumi_config_scans_by_era5_wind(lumi, full):
    assert full.stage1.model.wind_scan
    assert lumi["data"]["wind_table"] == lumi["wind"]["era5_table"]  # made by rule era5_wind
    report = Report()
    check_wind(lumi, full, WITH_CACHE, report)
    assert report.errors == [] and report.warnings == []


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_distributed_scanning_stage_needs_the_cache_as_input(lumi, full, stage):
    config = copy.deepcopy(lumi)
    config["resources"][f"train_stage{stage}"].update(gpus=8)
    inputs = dict(WITH_CACHE, **{f"train_stage{stage}": {"train", "val"}})
    report = Report()
    check_wind(config, full, inputs, report)
    assert report.errors == [
        f"train_stage{stage}: 8 ranks scan by wind but the rule does not take "
        "the wind cache (results/wind/scan_orders.npz) as input"
    ]


def test_wind_scan_without_any_wind_is_flagged(lumi, full):
    config = copy.deepcopy(lumi)
    config["data"]["wind_table"] = None
    report = Report()
    check_wind(config, full, WITH_CACHE, report)
    assert len(report.warnings) == 1 and report.warnings[0].startswith("data.wind_table: null")
    assert report.errors == []

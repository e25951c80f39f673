"""The doctor's bill and data budget of your own locations (data.source: folder): one prepare
job per location, the files as they are on disk, each location's patches from its scenes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workflow.folder_locations import write_locations
from vcloud.runtime.bill import rois_to_prepare
from vcloud.runtime.budget import data_budget, location_bytes
from vcloud.runtime.profile import load_workflow_config

ROOT = Path(__file__).parents[2]
PLAN = {"a": (4, 1), "b": (3, 1), "c": (5, 1), "d": (4, 2)}  # name -> (dates, tiles)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_locations(tmp_path_factory.mktemp("own") / "mine", PLAN)


def config_of(folder: Path, patch_size: int = 32) -> dict:
    config = load_workflow_config(ROOT / "config" / "config.yaml")
    config["synthetic"]["enabled"] = False
    config["data"].update(
        source="folder",
        folder=str(folder),
        locations={"train": ["a", "b"], "val": ["c"], "test": ["d"]},
        patch_size=patch_size,
    )
    return config


def test_the_bill_prepares_each_location_once(folder):
    rois, where = rois_to_prepare(config_of(folder))
    assert len(rois) == 4 and len(set(rois)) == 4 and where == "of data.locations (data.source: folder)"


def test_the_budget_counts_the_files_on_disk_and_every_tile_patch(folder):
    budget = data_budget(config_of(folder))
    (raw,) = [item for item in budget.items if item.what == "raw (your locations)"]
    on_disk = [path for path in folder.rglob("*") if path.is_file()]
    assert raw.files == len(on_disk) and raw.bytes == sum(p.stat().st_size for p in on_disk) and not raw.estimated
    assert budget.rois == 4 and budget.locations == 5  # d holds two tiles of one 32-px patch each
    (stores,) = [item for item in budget.items if item.what == "prepared stores (per ROI)"]
    assert stores.bytes == 5 * location_bytes(32, 5)  # every store's time axis: the longest series (c's 5)


def test_a_scene_smaller_than_the_patch_is_named_not_counted(folder):
    budget = data_budget(config_of(folder, patch_size=64))
    assert budget.locations == 0
    named = [note for note in budget.notes if note.startswith("data.locations: ")]
    assert len(named) == 4 and all("smaller than one 64" in n and "its patches are not counted" in n for n in named)
    assert [note.split(":")[1].strip() for note in named] == ["a", "b", "c", "d"]

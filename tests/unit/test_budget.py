"""The data budget: files and bytes per quota area, from the archive index or the raw listing."""

import copy
from pathlib import Path

import pytest

from vcloud.data.archive import ensure_index
from vcloud.data.layout import RoiId
from vcloud.data.synthetic import write_raw_tree
from vcloud.runtime.budget import FILES_PER_LOCATION, check_budget, data_budget, location_bytes
from vcloud.runtime.doctor import Report, preflight
from vcloud.runtime.profile import load_workflow_config

REPO = Path(__file__).parents[2]
ARGS = {"patches": 3, "times": 2, "size": 16, "seed": 1}
ROIS = [RoiId("ROIs1970", 119), RoiId("ROIs1970", 21)]  # europa and africa train archives


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    base = tmp_path_factory.mktemp("budget")
    write_raw_tree(base / "archives", rois=ROIS, archives=True, **ARGS)
    write_raw_tree(base / "tree", rois=ROIS, **ARGS)
    return base


def _config(raw_path: Path, area: Path, *, files=2_000_000, nbytes=50e12) -> dict:
    config = copy.deepcopy(load_workflow_config(REPO / "config/lumi.yaml"))
    config["data"].update(raw=str(raw_path), times=ARGS["times"], patch_size=ARGS["size"])
    config["paths"].update(prepared=str(area / "prepared"), results=str(area / "results"))
    config["cluster"]["quotas"] = {
        "scratch": {"path": str(area), "bytes": nbytes, "files": files},
        "projappl": {"path": "/projappl/{account}", "bytes": 50e9, "files": 100000},
    }
    return config


def test_locations_come_from_the_archive_index_exactly(raw, tmp_path):
    config = _config(raw / "archives", tmp_path)
    for archive in sorted((raw / "archives").glob("*.tar.gz")):
        ensure_index(archive, index_dir=tmp_path / "prepared" / "index")
    budget = data_budget(config)
    assert budget.rois == 2 and budget.locations == 2 * ARGS["patches"]
    assert not any("no index yet" in note for note in budget.notes)
    stores = next(i for i in budget.items if i.what == "prepared stores (per ROI)")
    assert stores.files >= FILES_PER_LOCATION * budget.locations
    assert stores.bytes == budget.locations * location_bytes(ARGS["size"], ARGS["times"])
    archives = [i for i in budget.items if i.what == "raw archives"]
    assert len(archives) == 4 and sum(i.bytes for i in archives) == sum(
        p.stat().st_size for p in (raw / "archives").glob("*.tar.gz")
    )


def test_without_an_index_the_locations_are_estimated_and_said_so(raw, tmp_path):
    budget = data_budget(_config(raw / "archives", tmp_path))
    assert budget.locations >= 2  # estimated from the archive sizes
    assert any("no index yet" in note and "vcloud index" in note for note in budget.notes)


def test_the_tree_listing_counts_every_raw_file(raw, tmp_path):
    budget = data_budget(_config(raw / "tree", tmp_path))
    tree = next(i for i in budget.items if i.what == "raw (extracted tree)")
    assert tree.files == 2 * 2 * ARGS["patches"] * ARGS["times"]  # 2 ROIs x S1, S2
    assert budget.locations == 2 * ARGS["patches"]


def test_budget_refuses_a_dataset_over_the_file_quota(raw, tmp_path):
    import shutil

    shutil.copytree(raw, tmp_path / "raw")  # the raw data inside the quota area too
    config = _config(tmp_path / "raw" / "tree", tmp_path, files=30)
    report = Report()
    check_budget(config, None, report)
    scratch = [e for e in report.errors if e.startswith("cluster.quotas.scratch")]
    assert len(scratch) == 1 and "quota of 30 files" in scratch[0] and str(tmp_path) in scratch[0]
    assert not any("projappl" in e for e in report.errors)
    files_tree = int(scratch[0].split("keeps ")[1].split(" files")[0].replace(",", ""))
    # The same data as archives (4 archives + 4 indexes instead of 24 TIFFs) fit in a quota
    # one file short of what the extracted tree needs.
    for archive in sorted((tmp_path / "raw" / "archives").glob("*.tar.gz")):
        ensure_index(archive, index_dir=tmp_path / "prepared" / "index")
    report = Report()
    check_budget(_config(tmp_path / "raw" / "archives", tmp_path, files=files_tree - 1), None, report)
    assert report.errors == []
    report = Report()
    check_budget(_config(tmp_path / "raw" / "archives", tmp_path, files=files_tree - 17), None, report)
    assert len(report.errors) == 1 and f"keeps {files_tree - 16:,} files" in report.errors[0]


def test_budget_refuses_bytes_over_quota_in_doctor_preflight(raw, tmp_path):
    from vcloud.config import load_model_config

    config = _config(raw / "archives", tmp_path, nbytes=1e5)
    model_set = load_model_config(REPO / "config/models/small.yaml")
    report = preflight(config, model_set, apptainer_args=None, precommand=None, train_inputs={}, memory=False)
    lines = [e for e in report.errors if e.startswith("cluster.quotas.scratch")]
    assert len(lines) == 1 and "more than its quota of 100.0 kB" in lines[0]
    assert any(line.startswith("data budget (") for line in report.lines)


def test_paths_outside_every_quota_area_are_not_counted(raw, tmp_path):
    config = _config(raw / "archives", tmp_path, files=1)
    config["cluster"]["quotas"]["scratch"]["path"] = str(tmp_path / "elsewhere")
    report = Report()
    check_budget(config, None, report)
    assert report.errors == []  # nothing of the run lies under tmp/elsewhere
    assert any("no quota area" in line for line in report.lines)


def test_old_raw_dir_key_gets_one_clear_line():
    from vcloud.data.archive import check_data_config
    from vcloud.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^data.raw_dir: renamed to data.raw \(a path or a list"):
        check_data_config({"data": {"raw_dir": "/x"}})
    check_data_config({"data": {"raw": "/x"}})


def test_each_stage_checkpoint_is_priced_for_the_model_it_trains(monkeypatch):
    """Stage 3 fine-tunes the stage-1 draft model (under the frozen refiner): its checkpoints hold
    the CFDT's weights and Adam state (12 bytes a parameter), not the refiner's."""
    import sys
    from types import SimpleNamespace

    from vcloud.runtime.budget import Budget, _checkpoint_bytes

    counts = {"stage0": 10, "stage1": 156_000_000, "stage2": 45_000_000}  # per config section's model
    fake = SimpleNamespace(section_parameters=lambda model_set, section: counts[section])  # no torch needed
    monkeypatch.setitem(sys.modules, "vcloud.models.memory", fake)
    got = _checkpoint_bytes(object(), Budget())
    assert got == {"stage0": 120, "stage1": 12 * 156_000_000, "stage2": 12 * 45_000_000, "stage3": 12 * 156_000_000}

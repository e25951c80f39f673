"""data.source: folder — your own locations through the whole workflow (docs/data.md, "Your own
locations"): the plan, its one-line refusals, and one real run of the chain with tiny models on a
folder of four locations in the plain-folder layout (tests/workflow/folder_locations.py)."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest
import yaml

from tests.workflow.folder_locations import write_locations
from tests.workflow.snakemake_run import ROOT, run

pytestmark = pytest.mark.workflow

# alpha: two tiles (scenes) of 6 dates; bravo: a series of 3 dates; charlie 5, delta 6.
PLAN = {"alpha": (6, 2), "bravo": (3, 1), "charlie": (5, 1), "delta": (6, 1)}
SPLITS = {"train": ["alpha", "bravo"], "val": ["charlie"], "test": ["delta"]}


def _config(work, folder, **data) -> list[str]:
    config = {
        "data": {
            "source": "folder",
            "folder": str(folder),
            "patch_size": 32,
            "s1_max_days": 3,  # every other date's S1 is 4 days off (folder_locations.py): left out
            "locations": SPLITS,
            **data,
        },
        "synthetic": {"enabled": False},
        "model_config": str(ROOT / "tests/workflow/tiny_models.yaml"),
        "predict": {"enabled": True},
    }
    (work / "folder.yaml").write_text(yaml.safe_dump(config))
    return ["--configfile", "folder.yaml", "-d", str(work)]


def _names_only(folder):
    """The locations as the parse-time checks see them: dated S2 file names, never opened."""
    for name, (dates, tiles) in PLAN.items():
        for tile in range(tiles):
            s2 = folder / name / (f"tile{tile}" if tiles > 1 else "") / "S2"
            s2.mkdir(parents=True)
            for day in range(dates):
                (s2 / f"T32TQM_201803{day + 1:02d}.tif").write_bytes(b"")
    return folder


def test_the_plan_prepares_each_location_and_assembles_its_split(tmp_path):
    folder = _names_only(tmp_path / "mine")
    plan = run(["-n", "-p", *_config(tmp_path, folder)], cwd=tmp_path).stdout
    prepares = sorted(line for line in plan.splitlines() if line.startswith("Shell command: vcloud prepare"))
    assert len(prepares) == 4 and plan.count("rule index_archive:") == 0 and "rule synth_raw:" not in plan
    assert "rule era5_wind:" not in plan and "--wind " not in plan  # data.wind_table: null
    for number, name in enumerate(sorted(PLAN), start=1):
        line = next(p for p in prepares if f"--out results/prepared/rois/{name}.zarr" in p)
        assert f"--raw {folder / name} " in line and f"--roi ROIs9000/{number} " in line
        assert "--times 6 " in line and "--s1-max-days 3 " in line  # the longest series; the S1 window
    for split, names in SPLITS.items():
        stores = " ".join(f"results/prepared/rois/{name}.zarr" for name in names)
        assert f"vcloud assemble --out results/prepared/{split}.zarr {stores} >" in plan
    assert "vcloud predict --stage 3 --store results/prepared/rois/delta.zarr" in plan


def _jobs(plan: str) -> list[dict]:
    """The jobs of a `snakemake -n -p` plan in its order: rule, its fields (input, reason, ...), shell."""
    jobs = []
    for line in plan.splitlines():
        if line.startswith("rule ") and line.endswith(":"):
            jobs.append({"rule": line[5:-1]})
        elif jobs and line.startswith("    ") and ": " in line:
            key, value = line.strip().split(": ", 1)
            jobs[-1][key] = value
        elif jobs and line.startswith("Shell command: "):
            jobs[-1]["shell"] = line.removeprefix("Shell command: ")
    return jobs


def test_era5_wind_of_your_own_locations_is_fetched_before_each_prepare(tmp_path):
    folder = _names_only(tmp_path / "mine")
    table = "resources/wind/era5_u10v10.zarr"
    jobs = _jobs(run(["-n", "-p", *_config(tmp_path, folder, wind_table=table)], cwd=tmp_path).stdout)
    rules = [job["rule"] for job in jobs]
    assert rules.count("era5_wind") == 1 and rules.count("prepare_roi") == 4, rules
    fetch = jobs[rules.index("era5_wind")]
    assert all(rules.index("era5_wind") < i for i, rule in enumerate(rules) if rule == "prepare_roi")
    # its inputs: every location's S2 GeoTIFFs (alpha's two tiles' too), their headers and names the places and dates
    assert fetch["input"].split(", ") == sorted(str(path) for path in folder.glob("**/S2/*.tif"))
    for number, name in enumerate(sorted(PLAN), start=1):  # each location's folder and ROI, as prepare_roi's
        assert f"--location {folder / name} ROIs9000/{number} " in fetch["shell"]
    assert "--raw" not in fetch["shell"] and "--roi " not in fetch["shell"]
    assert f"--out {table} " in fetch["shell"] and "--times 6 --size 32 " in fetch["shell"]
    for job in jobs:
        if job["rule"] == "prepare_roi":
            assert table in job["input"].split(", ") and f"--wind {table} " in job["shell"]
            assert f"Input files updated by another job: {table}" in job["reason"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"locations": {**SPLITS, "val": ["charlie", "alpha"]}},
            "data.locations.val: 'alpha' listed also in data.locations.train",
        ),
        ({"locations": {**SPLITS, "test": ["echo"]}}, "data.locations.test: 'echo': no folder "),
    ],
)
def test_a_bad_location_stops_the_dry_run_in_one_line(tmp_path, change, message):
    folder = _names_only(tmp_path / "mine")
    proc = run(["-n", *_config(tmp_path, folder, **change)], cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


# --- one location is enough: val and test as date ranges of it (data.temporal_split) ----------

# YAML dates, as a user writes them unquoted; alpha: 24 dates every 15 days from 2018-01-05
TEMPORAL = {"val": [dt.date(2018, 6, 1), dt.date(2018, 7, 31)], "test": [dt.date(2018, 10, 1), dt.date(2018, 12, 31)]}


def _one_location(folder):
    s2 = folder / "alpha" / "S2"
    s2.mkdir(parents=True)
    for step in range(24):
        (s2 / f"T32TQM_{dt.date(2018, 1, 5) + dt.timedelta(days=15 * step):%Y%m%d}.tif").write_bytes(b"")
    return folder


def test_one_location_plans_three_splits_of_its_dates(tmp_path):
    folder = _one_location(tmp_path / "mine")
    config = _config(tmp_path, folder, locations=["alpha"], temporal_split={**TEMPORAL, "gap_days": 20})
    jobs = _jobs(run(["-n", "-p", *config], cwd=tmp_path).stdout)
    rules = [job["rule"] for job in jobs]
    assert rules.count("prepare_roi") == 1 and rules.count("assemble_split") == 3, rules
    # every split assembles the one location's store, with the split's dates: training's all but
    # those within 20 days of val and test
    flags = {
        "train": "--drop 2018-05-12 2018-08-20 --drop 2018-09-11 2019-01-20",
        "val": "--keep 2018-06-01 2018-07-31",
        "test": "--keep 2018-10-01 2018-12-31",
    }
    shells = sorted(job["shell"] for job in jobs if job["rule"] == "assemble_split")
    assert shells == sorted(
        f"vcloud assemble --out results/prepared/{split}.zarr {flags[split]} results/prepared/rois/alpha.zarr "
        f"> logs/assemble_split/{split}.log 2>&1"
        for split in flags
    )
    # predict (predict.split test) reads the location's test dates only
    (split,) = [job for job in jobs if job["rule"] == "split_location"]
    assert split["shell"] == (
        "vcloud assemble --out results/prepared/test/alpha.zarr --keep 2018-10-01 2018-12-31 "
        "results/prepared/rois/alpha.zarr > logs/assemble_split/test/alpha.log 2>&1"
    )
    (predict,) = [job for job in jobs if job["rule"] == "predict"]
    assert "--store results/prepared/test/alpha.zarr " in predict["shell"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"temporal_split": {**TEMPORAL, "test": TEMPORAL["val"], "gap_days": 20}},
            "data.temporal_split.test: 2018-06-01..2018-07-31 overlaps val 2018-06-01..2018-07-31; keep them more "
            "than gap_days (20) days apart",
        ),
        (
            {"temporal_split": {**TEMPORAL, "gap_days": 70}},
            "data.temporal_split.test: 2018-10-01..2018-12-31 starts 62 days after val 2018-06-01..2018-07-31; keep "
            "them more than gap_days (70) days apart",
        ),
        (  # alpha's dates: 06-04 alone in 06-01..06-10
            {"temporal_split": {**TEMPORAL, "val": [dt.date(2018, 6, 1), dt.date(2018, 6, 10)], "gap_days": 20}},
            "data.temporal_split.val: 'alpha' has 1 of its 24 S2 dates there (2018-06-01..2018-06-10); each split "
            "needs at least 2 of every location's",
        ),
        ({"temporal_split": TEMPORAL}, "missing key data.temporal_split.gap_days"),
        (
            {"temporal_split": None},
            "data.locations: a list puts every location in every split, which needs data.temporal_split",
        ),
    ],
)
def test_a_bad_temporal_split_stops_the_dry_run_in_one_line(tmp_path, change, message):
    folder = _one_location(tmp_path / "mine")
    change = {key: value for key, value in change.items() if value is not None}
    proc = run(["-n", *_config(tmp_path, folder, locations=["alpha"], **change)], cwd=tmp_path, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert message in out and "Traceback" not in out
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()


@pytest.mark.slow  # the whole chain with tiny models: ~2.5 min on the 2-core machine
def test_the_chain_trains_scores_predicts_and_bundles_your_own_locations(tmp_path):
    from vcloud.data.store import open_store

    folder = write_locations(tmp_path / "mine", PLAN)
    work = tmp_path / "work"
    work.mkdir()
    run(["--cores", "2", *_config(work, folder)], cwd=work)

    # every location in exactly its split, each of its patches (alpha's two scenes) with it
    expected = {"train": ["ROIs9000_1_p0", "ROIs9000_1_p1", "ROIs9000_2_p0"], "val": ["ROIs9000_3_p0"]}
    expected["test"] = ["ROIs9000_4_p0"]
    stores = {split: open_store(work / f"results/prepared/{split}.zarr") for split in SPLITS}
    assert {split: [str(v) for v in ds["location"].values] for split, ds in stores.items()} == expected
    for name in PLAN:
        store = open_store(work / f"results/prepared/rois/{name}.zarr")
        assert store.attrs["source"] == f"plain folder {folder / name}"
        assert store.attrs["cloud_mask"]["source"] == "scl"
    train = stores["train"]
    assert train.sizes["time"] == 6
    assert train["valid_s2"].values[2].tolist() == [True] * 3 + [False] * 3  # bravo: its 3 dates
    # S1 4 days off every other date: outside data.s1_max_days 3, those dates are kept without S1
    assert train["valid_s1"].values[0].tolist() == [True, False] * 3

    for stage in range(4):  # stages 0-3 trained
        assert (work / f"results/stage{stage}/best.pt").is_file()
        assert (work / f"results/stage{stage}/metrics.jsonl").read_text().strip()
    with np.load(work / "results/eval/fixed_protocol.npz") as npz:
        assert json.loads(str(npz["meta"]))["target_probability"] == "simulated"
    for stage in (1, 2, 3):
        protocols = json.loads((work / f"results/eval/stage{stage}.json").read_text())["protocols"]
        for name in ("fixed", "reference"):  # simulated clouds on SCL-clear dates; natural pairs
            assert protocols[name]["samples"] > 0
            assert np.isfinite(protocols[name]["model"]["mean"]["psnr"])
        assert protocols["uncrtaints"]["samples"] == 0
        assert "not SEN12MS-CR-TS: the uncrtaints protocol is that dataset's" in protocols["uncrtaints"]["unavailable"]
    stages = (work / "results/eval/stages.md").read_text()
    assert "| natural (reference) |" in stages and "uncrtaints" not in stages
    assert (work / "results/viewer/index.html").is_file() and (work / "results/report/evaluation.html").is_file()

    manifest = json.loads((work / "results/predict/stage3/delta/manifest.json").read_text())
    assert manifest["complete"] and manifest["outputs"]
    assert all(key.startswith("ROIs9000_4_p0") for key in manifest["outputs"])
    assert (work / "results/bundle/tiny.tar").stat().st_size > 0

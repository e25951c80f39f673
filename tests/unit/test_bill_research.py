"""The doctor's bill and job count of research runs (experiments x seeds) and of a grid's
rehearsal, on LUMI's run file: each training at its own run's epochs, a shared stage billed once,
the rehearsal one run, and `jobs` refused above the site's per-user limits in one line."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from vcloud.config import load_model_config
from vcloud.runtime.cluster import Cluster
from vcloud.runtime.doctor import preflight
from vcloud.runtime.profile import load_workflow_config

REPO = Path(__file__).resolve().parents[2]
INPUTS = {f"train_stage{n}": {"train", "val", "wind_cache"} for n in range(4)}
LONG = {"name": "s3_long", "overrides": {"stage3": {"train": {"epochs": 200}}}}


@pytest.fixture(scope="module")
def lumi() -> dict:
    config = load_workflow_config(REPO / "config" / "lumi.yaml")
    config["cluster"]["account"] = "project_465000123"
    return config


def doctor(config, model_config="full.yaml"):
    cluster = Cluster.from_config(config)
    return preflight(
        config,
        load_model_config(REPO / "config" / "models" / model_config),
        apptainer_args=cluster.apptainer_args(),
        precommand=cluster.precommand(),
        train_inputs=INPUTS,
        memory=False,
    )


def bill_lines(report, rule) -> list[tuple[int, str, float, float]]:
    """(jobs, why, expected, worst) of each printed line of `rule`'s bill."""
    found = []
    for line in report.lines:
        m = re.match(
            rf"^  {rule} +(\d+) jobs?(?: \((.*?)\))? x .* = ([\d.]+) GPU-h expected; worst .* = ([\d.]+) GPU-h$", line
        )
        if m:
            found.append((int(m[1]), m[2] or "", float(m[3]), float(m[4])))
    return found


def test_an_experiment_that_changes_epochs_is_billed_at_its_own(lumi, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = copy.deepcopy(lumi)
    grid["experiments"], grid["seeds"] = [{"name": "base"}, LONG], [0]
    report = doctor(grid)
    assert report.errors == []
    base, long = bill_lines(report, "train_stage3")
    # config/lumi.yaml: stage 3 at 100 min per epoch in 48 h jobs, 0.5 GPU-h per GCD-hour, 10 min
    # per start, 2 spare retries. base: 10 epochs, one job: (10 x 100 + 10) min. s3_long: 200
    # epochs = 20,000 min, 47.75 h of training per 48 h job (300 s warning, 10 min start): 7 jobs.
    assert base[:2] == (1, "2 experiments x 1 seeds; trained by base") and long[0] == 1
    assert base[2] == pytest.approx(0.5 * (10 * 100 + 10) / 60, abs=0.05)
    assert long[2] == pytest.approx(0.5 * (200 * 100 + 7 * 10) / 60, abs=0.06)
    # The rule's retries are the longest run's, for every job of it: 6 + 2 spare, 9 attempts of 48 h.
    assert base[3] == long[3] == pytest.approx(0.5 * 9 * 48)
    assert any(re.match(r"^  train_stage3 +200 epochs x 100.0 min .*: 8 retries$", x) for x in report.lines)


def test_a_stage_shared_between_runs_is_billed_once(lumi, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    single = doctor(lumi)
    grid = copy.deepcopy(lumi)
    grid["experiments"], grid["seeds"] = [{"name": "base"}, LONG], [0, 1, 2]
    report = doctor(grid)
    for rule in ("train_stage0", "train_stage1", "train_stage2"):
        # s3_long changes stage 3 only: stages 0-2 are base's, trained once per seed, at base's hours.
        ((jobs, why, expected, worst),) = bill_lines(report, rule)
        ((_, _, one, one_worst),) = bill_lines(single, rule)
        assert (jobs, why) == (3, "2 experiments x 3 seeds, 3 read from a run of the same identity")
        assert (expected, worst) == pytest.approx((3 * one, 3 * one_worst), abs=0.15)
    assert [line[0] for line in bill_lines(report, "train_stage3")] == [3, 3]
    jobs = next(x for x in report.lines if x.startswith("Jobs: "))
    assert jobs.startswith("Jobs: ") and "at most 32 queued at once (cluster.jobs) + 2 controllers" in jobs


def test_the_default_run_keeps_its_bill_and_counts_its_jobs(lumi, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = doctor(lumi)
    total = next(x for x in report.lines if x.startswith("  total "))
    assert total.startswith("  total 65.0 GPU-h expected, 420.0 GPU-h worst case"), total
    # 20 index_archive + 53 prepare_roi + 3 assemble_split + wind_cache + fixed_protocol +
    # export_viewer + 4 trainings + 4 evaluations: 87 jobs (the audit's 92 less the 5 local
    # rules), every training in one job; 16 more if each of the 8 GPU rules used its 2 retries.
    assert "Jobs: 87 submitted over the run, 103 if every retry is used; at most 32 queued" in "\n".join(report.lines)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"jobs": 40, "partitions": {"small": {"max_submit": 40}}},
            "cluster.jobs: 40 jobs + 2 controllers queued at once on small, more than LUMI's 40 jobs of a user "
            "there (partitions.small.max_submit); lower cluster.jobs",
        ),
        (
            {"max_submit": 30},
            "cluster.jobs: 32 jobs + 2 controllers queued at once, more than LUMI's 30 jobs of a user "
            "(cluster.max_submit); lower cluster.jobs",
        ),
    ],
)
def test_jobs_above_a_sites_per_user_limit_are_refused_in_one_line(lumi, tmp_path, monkeypatch, change, message):
    monkeypatch.chdir(tmp_path)
    config = copy.deepcopy(lumi)
    for key, value in change.items():
        if key == "partitions":
            config["cluster"]["partitions"]["small"].update(value["small"])
        else:
            config["cluster"][key] = value
    errors = [e for e in doctor(config).errors if e.startswith("cluster.jobs")]
    assert len(errors) == 1 and errors[0].startswith(message), errors
    # 34 at once fit 36: the controllers counted, nothing refused.
    config["cluster"].update(jobs=32, max_submit=34)
    config["cluster"]["partitions"]["small"]["max_submit"] = 34
    assert [e for e in doctor(config).errors if e.startswith("cluster.jobs")] == []


def test_lumis_partition_limits_hold_the_default_run_and_the_dev_g_rehearsal(lumi, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    parts = Cluster.from_config(lumi).partitions
    assert {name: p.max_submit for name, p in parts.items()} == {
        "small": 220,
        "small-g": 210,
        "standard-g": 210,
        "dev-g": 2,
    }
    rehearsal = load_workflow_config(REPO / "config" / "lumi.yaml", REPO / "config" / "lumi-rehearsal.yaml")
    rehearsal["cluster"]["account"] = "project_465000123"
    # dev-g takes 2 jobs of a user; its max_running resource lets snakemake queue one at a time.
    # Without it the rehearsal's 9 GPU jobs (4 trainings, 4 evaluations, the transport) could queue.
    report = doctor(rehearsal, "rehearsal.yaml")
    assert [e for e in report.errors if e.startswith("cluster.jobs")] == []
    rehearsal["cluster"]["partitions"]["dev-g"]["max_running"] = None
    assert [e for e in doctor(rehearsal, "rehearsal.yaml").errors if e.startswith("cluster.jobs")] == [
        "cluster.jobs: 9 jobs queued at once on dev-g, more than LUMI's 2 jobs of a user there "
        "(partitions.dev-g.max_submit); lower cluster.jobs (the site file's `jobs:`) and run `vcloud profile`"
    ]


def test_a_grids_rehearsal_bills_one_run_and_says_which(lumi, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rehearsal = load_workflow_config(REPO / "config" / "lumi.yaml", REPO / "config" / "lumi-rehearsal.yaml")
    rehearsal["cluster"]["account"] = "project_465000123"
    rehearsal["experiments"], rehearsal["seeds"] = [{"name": "base"}, LONG], [3, 4, 5]
    rehearsal["compare"] = {"baseline": "s3_long"}
    report = doctor(rehearsal, "rehearsal.yaml")
    assert [e for e in report.errors if not e.startswith("rehearsal")] == []
    assert (
        "  the rehearsal: one run of the grid: experiment s3_long (compare's baseline), seed 3, of 2 experiments "
        "x 3 seeds; its stage3.train.epochs left to the rehearsal's"
    ) in report.lines
    for n in range(4):  # one run: each stage once, at the rehearsal's one epoch, scored on test and val
        ((jobs, _, expected, _),) = bill_lines(report, f"train_stage{n}")
        assert jobs == 1 and expected == pytest.approx(0.5 * (4 + 3) / 60, abs=0.05)
        assert bill_lines(report, f"evaluate_stage{n}")[0][0] == 2
    total = next(x for x in report.lines if x.startswith("  total "))
    assert float(total.split()[1]) < 1.0, total


# --- samples per epoch ------------------------------------------------------------------------


def base_model_config(tmp_path, samples: int) -> Path:
    """full.yaml with `samples` random samples per epoch (its own: one per training location),
    stage 1's key written out so that an experiment may change it."""
    import yaml

    from vcloud.config.model_sets import model_config_data

    data = model_config_data(REPO / "config" / "models" / "full.yaml")
    data["data"]["samples_per_epoch"] = samples
    data["stage1"]["train"]["samples_per_epoch"] = None
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def grid_over(lumi, model_config: Path, *experiments) -> dict:
    grid = copy.deepcopy(lumi)
    grid["model_config"] = str(model_config)
    grid["experiments"], grid["seeds"] = [{"name": "base"}, *experiments], [0]
    return grid


def test_an_experiment_with_twice_a_stages_samples_per_epoch_bills_twice_its_epoch_hours(lumi, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = base_model_config(tmp_path, 1000)
    twice = {"name": "twice", "overrides": {"stage1": {"train": {"samples_per_epoch": 2000}}}}
    report = doctor(grid_over(lumi, base, twice), base)
    assert report.errors == []
    (jobs, why, expected, worst), (_, twice_why, twice_expected, twice_worst) = bill_lines(report, "train_stage1")
    assert (jobs, why, twice_why) == (
        1,
        "2 experiments x 1 seeds; trained by base",
        "2 experiments x 1 seeds; trained by twice",
    )
    # config/lumi.yaml: stage 1 at 27 min per epoch for base.yaml's 1000 samples, 100 epochs, in
    # 72 h jobs (4305 min of training each), 10 min per start, 0.5 GPU-h per GCD-hour. base: 2700
    # min, one job. twice: 2000 samples, 54 min per epoch, 5400 min: two jobs, two starts.
    assert expected == pytest.approx(0.5 * (100 * 27 + 10) / 60, abs=0.05)
    assert twice_expected == pytest.approx(0.5 * (100 * 54 + 2 * 10) / 60, abs=0.05)
    # The rule's retries are the longest training's for every job of it: 1 + 2 spare, 4 attempts.
    assert worst == twice_worst == pytest.approx(0.5 * 4 * 72)
    line = next(x for x in report.lines if x.startswith("  train_stage1 ") and "trained by twice" in x)
    assert "100 epochs x 27.0 min estimated x 2000/1000 samples per epoch (this run's / " in line, line
    assert "base.yaml's) + 2 x 10 min start" in line, line
    assert any(
        re.match(r"^  train_stage1 +100 epochs x 27.0 min \(estimated\) x 2000/1000 .*: 3 retries$", x)
        for x in report.lines
    )
    for rule in ("train_stage0", "train_stage2", "train_stage3"):  # their samples are base's in both runs
        assert all("samples per epoch" not in x for x in report.lines if x.startswith(f"  {rule} "))


def test_an_experiment_that_changes_data_samples_per_epoch_scales_every_stage(lumi, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = base_model_config(tmp_path, 1000)
    twice = {"name": "twice", "overrides": {"data": {"samples_per_epoch": 2000}}}
    report = doctor(grid_over(lumi, base, twice), base)
    assert report.errors == []
    # (epochs, config/lumi.yaml's minutes per epoch, jobs the doubled epochs need): stage 3 in 48 h
    # jobs (2865 min of training), the others in 72 h jobs (4305 min).
    for n, epochs, minutes, jobs in ((0, 50, 32, 1), (1, 100, 27, 2), (2, 50, 30, 1), (3, 10, 100, 1)):
        (_, _, expected, _), (_, why, doubled, _) = bill_lines(report, f"train_stage{n}")
        assert why.endswith("trained by twice")
        assert expected == pytest.approx(0.5 * (epochs * minutes + 10) / 60, abs=0.06), n
        assert doubled == pytest.approx(0.5 * (epochs * 2 * minutes + jobs * 10) / 60, abs=0.06), n


def test_a_rehearsed_epoch_time_is_scaled_from_the_samples_the_rehearsal_measured_it_at(lumi, tmp_path, monkeypatch):
    import json

    from vcloud.runtime.doctor import measured_epoch_minutes

    monkeypatch.chdir(tmp_path)
    summary = tmp_path / "results-rehearsal" / "rehearsal.json"
    summary.parent.mkdir()
    summary.write_text(
        json.dumps(
            {
                "passed": True,
                "epoch_minutes": {"train_stage1": 30.0},
                "epoch_samples": {"train_stage1": 1500},
                "train_locations": 1500,
            }
        )
    )
    cluster = Cluster.from_config(lumi)

    def stage1_line(config, model_config):
        report = preflight(
            config,
            load_model_config(model_config),
            apptainer_args=cluster.apptainer_args(),
            precommand=cluster.precommand(),
            train_inputs=INPUTS,
            memory=False,
            epoch_minutes=measured_epoch_minutes(config),
        )
        bill = next(x for x in report.lines if x.startswith("  train_stage1 ") and "GPU-h/h" in x)
        return bill_lines(report, "train_stage1"), bill

    # full.yaml: one sample per training location, the 1500 the rehearsal counted: its 30 min.
    ((_, _, expected, _),), line = stage1_line(lumi, REPO / "config" / "models" / "full.yaml")
    assert expected == pytest.approx(0.5 * (100 * 30 + 10) / 60, abs=0.05) and "samples per epoch" not in line
    # 3000 samples per epoch: twice the rehearsal's 1500, 60 min per epoch, 6000 min in two jobs.
    single = copy.deepcopy(lumi)
    single["model_config"] = str(base_model_config(tmp_path, 3000))
    ((_, _, expected, _),), line = stage1_line(single, single["model_config"])
    assert expected == pytest.approx(0.5 * (100 * 60 + 2 * 10) / 60, abs=0.05)
    assert "100 epochs x 30.0 min measured x 3000/1500 samples per epoch (this run's / the rehearsal's)" in line


def test_samples_per_epoch_against_uncounted_locations_are_billed_unscaled_and_say_so(lumi, tmp_path, monkeypatch):
    """LUMI's full.yaml takes one sample per training location, not counted before a rehearsal:
    an experiment's own number cannot be set against it, and its line says so."""
    monkeypatch.chdir(tmp_path)
    fixed = {"name": "fixed", "overrides": {"data": {"samples_per_epoch": 5000}}}
    report = doctor(grid_over(lumi, REPO / "config" / "models" / "full.yaml", fixed))
    (_, _, expected, _), (_, _, fixed_expected, _) = bill_lines(report, "train_stage1")
    assert fixed_expected == pytest.approx(expected)
    line = next(x for x in report.lines if x.startswith("  train_stage1 ") and "trained by fixed" in x)
    assert "(not scaled to this run's 5000 samples per epoch from " in line, line
    assert "full.yaml's one per training location: the training locations are not counted before a rehearsal)" in line

"""vcloud export-mlflow: research runs (experiments x seeds x stages) into one MLflow SQLite database,
read back through MLflow's own client; idempotent, incremental after a resume, complete after a
kill, and bad input refused in one line. The results tree is laid out by the workflow's own
planners (plan_runs, run_paths, write_run_config, write_metrics) in the rules' real formats."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.system import require_module
from vcloud.cli import main
from vcloud.config.experiments import plan_runs, write_run_config
from vcloud.registry import STAGE_NUMBERS
from vcloud.train.records import write_metrics
from vcloud.workflow import run_paths

try:
    import mlflow
except ImportError:  # the fixture below says what to install (a failure under CI=true)
    mlflow = None

MLFLOW_EXTRA = "pip install -e '.[mlflow]' installs it (the test extra includes it)"


@pytest.fixture(autouse=True)
def _mlflow():
    require_module("mlflow", install=MLFLOW_EXTRA)


ROOT = Path(__file__).parents[2]
TINY = ROOT / "tests/workflow/tiny_models.yaml"
# Two experiments x two seeds; s3_lr changes stage 3 only, so it trains stage 3 and reads base's 0-2.
GRID = {
    "experiments": [{"name": "base"}, {"name": "s3_lr", "overrides": {"stage3": {"train": {"lr": 1.0e-4}}}}],
    "seeds": [0, 1],
}
EPOCHS = 3  # rows per stage: the validated start (-1), then epochs 0 and 1 (of train.epochs 2)


def row(epoch: int, start: float) -> dict:
    """A metrics.jsonl row as the trainer writes it (loss/lr absent from the validated start)."""
    out = {"epoch": epoch, "val_psnr": 20.0 + epoch, "val_score": 0.5 + epoch / 10, "best": True}
    if epoch >= 0:
        out.update(loss=1.0 / (epoch + 2), lr=1e-3, samples_per_s=10.0, data_wait_fraction=0.1, epoch_s=2.0)
    out.update(val_per_sample={"fixed": [1.0, 2.0]}, peak_memory_mb=100.0, world_size=1, wall_time=start + epoch)
    return out


def report(stage: int, psnr: float) -> dict:
    """An evaluation report's shape (vcloud.evaluation.evaluate): the protocols' model means."""
    scored = {"mean": {"psnr": psnr, "ssim": 0.9, "sam": 3.0, "mae": 0.01, "rmse": 0.02}, "seen_mae": 0.005}
    protocols = {
        "fixed": {"protocol": {"protocol": "fixed"}, "samples": 4, "model": scored},
        "reference": {"protocol": {"protocol": "reference"}, "samples": 2, "model": scored},
        "uncrtaints": {"protocol": {"protocol": "uncrtaints"}, "samples": 0, "unavailable": "fewer dates than T"},
    }
    return {"stage": stage, "store": "results/prepared/test.zarr", "protocols": protocols}


def build(work: Path, *, rows: int = EPOCHS) -> list[list[str]]:
    """The results tree of GRID under work/results, made where the workflow puts it; the --run flags."""
    results = work / "results"
    models = yaml.safe_load(TINY.read_text())
    for stage in STAGE_NUMBERS:  # two epochs finish a stage
        models[f"stage{stage}"]["train"]["epochs"] = 2
    base = work / "models.yaml"
    base.write_text(yaml.safe_dump(models))
    runs = plan_runs(GRID, base)
    flags = []
    for index, (run, paths) in enumerate(zip(runs, run_paths(runs, prepared="", results=str(results), patch_size=16))):
        model = Path(paths.run_model_config())
        write_run_config(base, run.changes, model)
        flags.append([run.experiment, str(run.seed), paths.results, str(model)])
        for stage in STAGE_NUMBERS:
            if f"stage{stage}" not in dict(paths.homes):
                metrics = Path(paths.metrics_log(stage))
                metrics.parent.mkdir(parents=True, exist_ok=True)
                start = 1.7e9 + 1000 * index + 100 * stage
                write_metrics(metrics, [row(epoch, start) for epoch in range(-1, rows - 1)])
            for split in ("test", "val"):
                path = Path(paths.eval_report(stage, split))
                if not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(report(stage, 30.0 + stage + index / 10)))
    return flags


def export(work: Path, flags, db: Path | None = None) -> int:
    args = ["export-mlflow", "--db", str(db or work / "results/mlflow.db"), "--results", str(work / "results")]
    return main([*args, *(arg for run in flags for arg in ("--run", *run))])


def content(db: Path) -> dict:
    """What the database holds, through MLflow's client, keyed by vcloud.key (run ids differ
    between databases): experiment, name, parent's key, status, tags, params, metric histories.
    Read from a copy under a new name: MLflow keeps a store per URI, open on the file it first saw."""
    copy = db.with_name(f"read-{time.monotonic_ns()}.db")
    shutil.copyfile(db, copy)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{copy}")
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    runs = client.search_runs(list(experiments), max_results=1000)
    keys = {r.info.run_id: r.data.tags["vcloud.key"] for r in runs}
    out = {}
    for r in runs:
        tags = {k: v for k, v in r.data.tags.items() if k != "mlflow.parentRunId"}
        history = {
            name: sorted((m.step, m.timestamp, m.value) for m in client.get_metric_history(r.info.run_id, name))
            for name in r.data.metrics
        }
        out[keys[r.info.run_id]] = {
            "experiment": experiments[r.info.experiment_id],
            "name": r.info.run_name,
            "parent": keys.get(r.data.tags.get("mlflow.parentRunId")),
            "status": r.info.status,
            "tags": tags,
            "params": dict(r.data.params),
            "metrics": history,
        }
    return out


def rows_of(db: Path) -> dict[str, list]:
    """Every row of every MLflow table: what "changes nothing" is checked on."""
    with sqlite3.connect(db) as con:
        tables = [t for (t,) in con.execute("select name from sqlite_master where type='table'")]
        return {t: sorted(map(repr, con.execute(f"select * from {t}"))) for t in tables}


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    work = tmp_path_factory.mktemp("grid")
    flags = build(work)
    assert export(work, flags) == 0
    return work, flags, content(work / "results/mlflow.db")


def test_each_experiment_seed_and_trained_stage_is_a_run_with_its_config_and_curves(grid):
    work, _, got = grid
    parents = {k: v for k, v in got.items() if v["tags"]["vcloud.kind"] == "run"}
    stages = {k: v for k, v in got.items() if v["tags"]["vcloud.kind"] == "stage"}
    assert sorted(v["name"] for v in parents.values()) == ["base/seed0", "base/seed1", "s3_lr/seed0", "s3_lr/seed1"]
    # base trains all four stages per seed, s3_lr only stage 3: 4 + 4 + 1 + 1 stage runs.
    assert len(stages) == 10
    s3 = next(v for v in parents.values() if v["name"] == "s3_lr/seed1")
    assert s3["experiment"] == "s3_lr" and s3["params"]["stage3.train.lr"] == "0.0001"
    assert s3["params"]["stage3.train.seed"] == "1" and s3["params"]["name"] == "tiny"
    assert s3["tags"]["vcloud.stage2"] == str(work / "results/base/seed1/stage2")
    assert s3["tags"]["vcloud.stage3"] == str(work / "results/s3_lr/seed1/stage3")
    # Scores of every stage on both splits, the shared stages' included; a protocol not run: its 0 samples.
    assert [(step, value) for step, _, value in s3["metrics"]["val/stage3/fixed/psnr"]] == [(0, pytest.approx(33.3))]
    assert s3["metrics"]["test/stage2/reference/seen_mae"][0][2] == 0.005
    assert (
        s3["metrics"]["test/stage1/uncrtaints/samples"][0][2] == 0
        and "test/stage1/uncrtaints/psnr" not in s3["metrics"]
    )
    child = next(v for v in stages.values() if v["tags"]["vcloud.folder"].endswith("s3_lr/seed1/stage3"))
    assert child["parent"] == next(k for k, v in parents.items() if v is s3) and child["name"] == "s3_lr/seed1/stage3"
    assert child["params"]["stage3.train.lr"] == "0.0001" and "stage0.train.lr" not in child["params"]
    assert child["tags"]["vcloud.stage_hash"] == s3["tags"]["vcloud.stage3.hash"]
    # Per-epoch metrics, step = epoch, timestamps the rows' wall times, named as in TensorBoard.
    assert [step for step, _, _ in child["metrics"]["val/psnr"]] == [-1, 0, 1]
    assert [value for _, _, value in child["metrics"]["train/loss"]] == [0.5, pytest.approx(1 / 3)]
    assert child["metrics"]["val/psnr"][0][1] == 1000 * int(1.7e9 + 3000 + 300 - 1)
    assert child["status"] == "FINISHED" and s3["status"] == "FINISHED"
    shared = next(v for v in stages.values() if v["tags"]["vcloud.folder"].endswith("base/seed1/stage2"))
    assert shared["tags"]["vcloud.used_by"] == f"{work}/results/base/seed1,{work}/results/s3_lr/seed1"


def test_a_second_export_changes_nothing(grid):
    work, flags, got = grid
    db = work / "results/mlflow.db"
    before = rows_of(db)
    assert export(work, flags) == 0
    assert rows_of(db) == before and content(db) == got


def test_a_resumed_stage_gets_only_its_new_epochs(tmp_path, capsys):
    flags = build(tmp_path, rows=2)  # killed after epoch 0
    assert export(tmp_path, flags) == 0
    db = tmp_path / "results/mlflow.db"
    first = content(db)
    stage = next(k for k, v in first.items() if v["tags"].get("vcloud.folder", "").endswith("base/seed0/stage1"))
    assert [s for s, _, _ in first[stage]["metrics"]["val/psnr"]] == [-1, 0] and first[stage]["status"] == "RUNNING"
    build(tmp_path, rows=3)  # resumed: the same rows, then epoch 1
    capsys.readouterr()
    assert export(tmp_path, flags) == 0
    # 10 stage runs, one new row each of 8 metrics (val/psnr, val/score, train/loss, train/lr, run/*).
    assert capsys.readouterr().out.strip().endswith("4 runs exported; 80 metrics written")
    second = content(db)
    assert set(second) == set(first)  # the same MLflow runs, none new
    assert [s for s, _, _ in second[stage]["metrics"]["val/psnr"]] == [-1, 0, 1]
    assert second[stage]["metrics"]["val/psnr"][:2] == first[stage]["metrics"]["val/psnr"]
    assert second[stage]["status"] == "FINISHED"


def test_a_stage_trained_again_from_scratch_is_a_new_run_and_the_old_one_not_current(tmp_path):
    flags = build(tmp_path)
    assert export(tmp_path, flags) == 0
    metrics = tmp_path / "results/base/seed0/stage0/metrics.jsonl"
    write_metrics(metrics, [row(epoch, 1.8e9) for epoch in range(-1, 2)])  # new wall times: a fresh start
    assert export(tmp_path, flags) == 0
    got = content(tmp_path / "results/mlflow.db")
    runs = [v for v in got.values() if v["tags"].get("vcloud.folder") == str(metrics.parent)]
    assert sorted(v["tags"]["vcloud.current"] for v in runs) == ["false", "true"]
    new = next(v for v in runs if v["tags"]["vcloud.current"] == "true")
    assert new["metrics"]["val/psnr"][0][1] == 1000 * int(1.8e9 - 1)


KILLER = """
import sys, time
from mlflow.tracking import MlflowClient
from vcloud.cli import main

calls = 0
real = MlflowClient.log_batch
def slow(self, *args, **kwargs):
    global calls
    calls += 1
    if calls == int(sys.argv[1]):
        print("killing now", flush=True)
        time.sleep(60)
    return real(self, *args, **kwargs)
MlflowClient.log_batch = slow
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
def test_an_export_killed_midway_then_run_again_ends_as_an_uninterrupted_one(tmp_path):
    flags = build(tmp_path)
    whole = tmp_path / "whole.db"
    assert export(tmp_path, flags, db=whole) == 0
    db = tmp_path / "results/mlflow.db"
    args = ["export-mlflow", "--db", str(db), "--results", str(tmp_path / "results")]
    args += [a for run in flags for a in ("--run", *run)]
    # SIGKILL in the 12th batch written (after parents, stages and epochs of several runs).
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    proc = subprocess.Popen([sys.executable, str(script), "12", *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "killing now"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not db.exists()  # nothing published: the database appears whole or not at all
    assert export(tmp_path, flags) == 0
    assert content(db) == content(whole)
    # Killed again, in the middle of a later export that had something to add: the old database stays.
    before = rows_of(db)
    write_metrics(tmp_path / "results/base/seed0/stage0/metrics.jsonl", [row(e, 1.9e9) for e in range(-1, 2)])
    proc = subprocess.Popen([sys.executable, str(script), "2", *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "killing now"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert rows_of(db) == before
    assert not [p for p in db.parent.iterdir() if p.name.startswith(".mlflow.db")]  # noqa: E501  # no temporary left beside it


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda text: text + '{"epoch": 2, "val_psnr": 1.0, "wall_ti\n', ":4: not a JSON line"),
        (lambda text: "\n".join(text.splitlines()[:1] + text.splitlines()[2:]) + "\n", ": epoch 0 missing"),
        (lambda text: text + json.dumps({"epoch": 2, "val_psnr": 1.0}) + "\n", ":4: no 'wall_time'"),
    ],
    ids=["torn line", "missing row", "no wall time"],
)
def test_damaged_metrics_are_refused_in_one_line_naming_the_file_before_anything_is_written(
    tmp_path, capsys, damage, message
):
    flags = build(tmp_path)
    metrics = tmp_path / "results/s3_lr/seed0/stage3/metrics.jsonl"
    metrics.write_text(damage(metrics.read_text()))
    assert export(tmp_path, flags) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"vcloud export-mlflow: error: {metrics}{message}") and "\n" not in err, err
    assert not (tmp_path / "results/mlflow.db").exists()


def test_a_report_of_another_stage_is_refused_naming_it(tmp_path, capsys):
    flags = build(tmp_path)
    path = tmp_path / "results/base/seed1/eval/stage2.val.json"
    path.write_text(json.dumps(report(1, 30.0)))
    assert export(tmp_path, flags) == 2
    assert f"{path}: not the evaluation report of stage 2" in capsys.readouterr().err


def test_without_mlflow_the_command_says_what_to_install_in_one_line(tmp_path):
    flags = build(tmp_path, rows=1)
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "mlflow.py").write_text("raise ImportError('No module named mlflow')\n")
    args = ["export-mlflow", "--db", str(tmp_path / "x.db"), "--results", str(tmp_path / "results")]
    args += [a for run in flags for a in ("--run", *run)]
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "vcloud.cli", *args], capture_output=True, text=True, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'vcloud[mlflow]'" in lines[0], proc.stderr
    assert not (tmp_path / "x.db").exists()


def test_a_file_that_is_no_mlflow_database_is_refused_and_left_as_it_is(tmp_path, capsys):
    flags = build(tmp_path, rows=1)
    db = tmp_path / "results/mlflow.db"
    db.write_bytes(b"not a database")
    assert export(tmp_path, flags) == 2
    assert f"{db}: not an MLflow SQLite database this MLflow can open" in capsys.readouterr().err
    assert db.read_bytes() == b"not a database"

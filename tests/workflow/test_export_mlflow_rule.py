"""Rule export_mlflow: a local rule, off by default (the default plan does not change), planned once
after every run and evaluation when tracking.mlflow is on, and run by snakemake for real over a
research run's results tree: the database brought up to date in place, its runs kept."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.system import require_module
from tests.workflow.snakemake_run import ROOT, run

pytestmark = pytest.mark.workflow

TINY = str(ROOT / "tests/workflow/tiny_models.yaml")


def plan(work: Path, config: dict, *targets: str) -> str:
    work.mkdir(exist_ok=True)
    (work / "run.yaml").write_text(yaml.safe_dump(config))
    args = [*targets, "-n", "-p", "--cores", "1", "-d", str(work), "--configfile", "run.yaml"]
    return run(args, cwd=work).stdout


def test_the_rule_is_local():
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

    with SnakemakeApi(OutputSettings()) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(), config_settings=ConfigSettings(), snakefile=ROOT / "Snakefile"
        )
        assert "export_mlflow" in workflow._workflow._localrules  # one writer: the controller's process


def test_off_by_default_and_on_planned_once_after_every_run(tmp_path):
    default = plan(tmp_path / "default", {})
    assert "export_mlflow" not in default and "export-mlflow" not in default
    grid = {
        "experiments": [{"name": "base"}, {"name": "s3_lr", "overrides": {"stage3": {"train": {"lr": 1.0e-4}}}}],
        "seeds": [0, 1],
        "model_config": TINY,
        "tracking": {"mlflow": True},
    }
    out = plan(tmp_path / "grid", grid)
    (command,) = [line for line in out.splitlines() if "vcloud export-mlflow" in line]
    assert "vcloud export-mlflow --db results/mlflow.db --results results --run base 0 results/base/seed0 " in command
    assert "--run s3_lr 1 results/s3_lr/seed1 results/s3_lr/seed1/model.yaml" in command
    block = out.split("rule export_mlflow:", 1)[1].split("\n\n", 1)[0]
    inputs = block.split("input: ", 1)[1].splitlines()[0].split(", ")
    # s3_lr reads base's stages 0-2: their curves are inputs once, its own stage 3 and every report too.
    assert inputs.count("results/base/seed1/stage2/metrics.jsonl") == 1
    assert (
        "results/s3_lr/seed1/stage3/metrics.jsonl" in inputs
        and "results/s3_lr/seed1/stage2/metrics.jsonl" not in inputs
    )
    assert "results/s3_lr/seed0/eval/stage3.val.json" in inputs and "results/base/seed0/model.yaml" in inputs
    assert "output: results/mlflow.db (update)" in block
    # The single run: its model config is config.model_config, its folder results/ itself.
    single = plan(tmp_path / "single", {"model_config": TINY}, "results/mlflow.db")
    assert f"--run base - results {TINY} " in single


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
def test_snakemake_runs_it_in_place_and_the_runs_keep_their_ids(tmp_path):
    mlflow = require_module("mlflow", install="pip install -e '.[mlflow]' installs it (the test extra includes it)")
    from tests.unit.test_export_mlflow import GRID, build

    flags = build(tmp_path)
    config = {**GRID, "model_config": flags[0][3], "tracking": {"mlflow": True}}  # base/seed0's model.yaml
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    # Only the export: the results tree is there, as the rules before it would have left it.
    args = ["results/mlflow.db", "--cores", "1", "-d", str(tmp_path), "--configfile", "run.yaml"]
    args += ["--allowed-rules", "export_mlflow"]
    run(args, cwd=tmp_path)
    db = tmp_path / "results/mlflow.db"

    def run_ids():
        copy = tmp_path / f"read-{len(list(tmp_path.glob('read-*')))}.db"  # a new name: MLflow keeps a store per URI
        shutil.copyfile(db, copy)
        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{copy}")
        experiments = [e.experiment_id for e in client.search_experiments()]
        return {r.data.tags["vcloud.key"]: r.info.run_id for r in client.search_runs(experiments)}

    first = run_ids()
    assert len(first) == 4 + 10, first  # 4 seeds of experiments, 10 trained stages
    assert "4 runs exported" in (tmp_path / "logs/export_mlflow/export_mlflow.log").read_text()
    metrics = tmp_path / "results/s3_lr/seed0/stage3/metrics.jsonl"
    later = os.stat(db).st_mtime + 10
    os.utime(metrics, (later, later))  # a resumed stage: snakemake exports again, into the same database
    assert "export_mlflow" in run(args, cwd=tmp_path).stderr
    assert run_ids() == first

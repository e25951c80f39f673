"""The `predict` rule: opt-in, one job per ROI of predict.split, and a real run after the pipeline."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.workflow.snakemake_run import SMALL, run

pytestmark = pytest.mark.workflow


def _config(work, **predict):
    (work / "small.yaml").write_text(yaml.safe_dump({**SMALL, "predict": predict} if predict else SMALL))
    return ["--configfile", "small.yaml", "-d", str(work)]


def test_predict_is_opt_in_and_one_job_per_test_roi(tmp_path):
    default = run(["-n", *_config(tmp_path)], cwd=tmp_path)
    assert "rule predict:" not in default.stdout
    planned = run(["predict_all", "-n", "-p", *_config(tmp_path)], cwd=tmp_path).stdout
    assert planned.count("rule predict:") == 1  # SMALL has one test ROI
    assert "output: results/predict/stage3/ROIs1868_119/manifest.json" in planned
    assert "vcloud predict --stage 3 --store results/prepared/rois/ROIs1868_119.zarr" in planned
    assert "--stage2 results/stage2/best.pt --stage3 results/stage3/best.pt" in planned
    enabled = run(["-n", "-p", *_config(tmp_path, enabled=True, stage=2, draws=3)], cwd=tmp_path).stdout
    assert "rule predict:" in enabled and "--stage 2" in enabled and "--draws 3" in enabled


@pytest.mark.slow
def test_predict_rule_writes_cogs_after_the_pipeline(pipeline_run):
    from rio_cogeo.cogeo import cog_validate

    work, _, _ = pipeline_run
    run(["predict_all", "--cores", "2", *_config(work)], cwd=work)
    manifest = json.loads((work / "results/predict/stage3/ROIs1868_119/manifest.json").read_text())
    assert manifest["complete"] and manifest["outputs"]
    for entry in manifest["outputs"].values():
        path = work / "results/predict/stage3/ROIs1868_119" / entry["files"]["prediction"]["path"]
        assert cog_validate(str(path), quiet=True)[0]

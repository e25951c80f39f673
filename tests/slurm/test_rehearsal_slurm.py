"""The dev-g rehearsal end to end on the test SLURM, as LUMI would run it: config/lumi.yaml +
config/lumi-rehearsal.yaml through `snakemake --profile lumi`, in the strict container
stand-in, with tiny models on the one-node cluster. The forced wall-time warning on stage 1
must checkpoint, be resubmitted and resume; every GPU job runs on dev-g, one at a time; the
closing summary must pass. (The RCCL transport step needs RCCL: it is off here and tested
on its own in tests/unit/test_rehearsal.py.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.lumi.helpers import REPO, require_stand_in, stand_in_env, write_overlay
from tests.slurm.polling import fast_polling
from tests.slurm.test_slurm import FAST, sacct, slurm_cluster  # noqa: F401 - the cluster fixture

pytestmark = [pytest.mark.slurm, pytest.mark.container, pytest.mark.workflow]
ROIS = ["ROIs1970/21", "ROIs2017/22", "ROIs2017/32"]  # africa: train, val, test (the rehearsal's)
GPU = {"partition": "dev-g", "gpus": 1, "cpus_per_gpu": 2, "threads": 2, "mem_mb_per_gpu": 1500, "runtime": 10}
CPU = {"partition": "small", "threads": 1, "mem_mb": 1500, "runtime": 10}


def test_rehearsal_runs_every_rule_resumes_after_the_forced_warning_and_passes(slurm_cluster, tmp_path):  # noqa: F811
    require_stand_in()
    models = yaml.safe_load((REPO / "tests/workflow/tiny_models.yaml").read_text())
    # Paced (tests/slurm/pace): stage 1's first job sleeps 1 s after each optimizer step, so the
    # forced warning (4 s) finds it training; the resumed job runs unpaced. 10 epochs of 2 steps.
    models["stage1"]["train"]["epochs"] = 10
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(models))
    resources = {f"train_stage{n}": dict(GPU, epoch_minutes=0.1) for n in range(4)}
    resources["train_stage1"]["rehearse_warning"] = 4
    resources.update({f"evaluate_stage{n}": dict(GPU) for n in range(4)})
    cpu_rules = ("synth_raw", "prepare_roi", "assemble_split", "wind_cache", "fixed_protocol", "export_viewer")
    resources.update({rule: dict(CPU) for rule in cpu_rules})
    overlay, cluster = write_overlay(
        tmp_path,
        binds=[str(tmp_path), str(REPO)],  # on LUMI the clone is the working directory, bound
        synthetic={"enabled": True, "rois": ROIS, "patches": 1},
        model_config=str(tmp_path / "models.yaml"),
        rehearsal={"enabled": True, "summary": "results-rehearsal/rehearsal.json", "transport": False},
        paths={"prepared": "results-rehearsal/prepared", "results": "results-rehearsal"},
    )
    extra = yaml.safe_load(overlay.read_text())
    extra["cluster"].update(signal_seconds=60, restart_minutes=0)
    extra["resources"] = resources
    overlay.write_text(yaml.safe_dump(extra))
    env = stand_in_env(tmp_path)
    pace = shutil.copytree(REPO / "tests/slurm/pace", tmp_path / "pace")  # under the bind
    env.update(PYTHONPATH=str(pace), VCLOUD_TEST_PACE_STEP_S="1", VCLOUD_TEST_PACE_ONLY="stage1")
    fast_polling(env, pace)
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        "lumi",
        "-d",
        str(tmp_path),
        "--configfile",
        "config/lumi.yaml",
        "config/lumi-rehearsal.yaml",
        str(overlay),
        "--apptainer-args",
        cluster.apptainer_args(),
        *FAST,
    ]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=2400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    summary = json.loads((tmp_path / "results-rehearsal/rehearsal.json").read_text())
    assert summary["passed"] and summary["problems"] == [], summary
    assert summary["stages"]["stage1"]["resumed"] and not summary["stages"]["stage0"]["resumed"]
    rows = [json.loads(x) for x in (tmp_path / "results-rehearsal/stage1/metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["epoch"] >= 0]
    assert [r["epoch"] for r in rows] == list(range(10)) and rows[0]["epoch_s"] >= 1.0  # the paced job
    assert summary["stamp"] and summary["stamp"].startswith("vcloud ")  # read inside the container
    assert set(summary["epoch_minutes"]) == {f"train_stage{n}" for n in range(4)}
    # Stage 1: the first job was warned (exit 3 of its step), the next one finished it.
    jobs = sorted((tmp_path / "logs/slurm/rule_train_stage1").rglob("*.log"), key=lambda p: int(p.stem))
    states = [sacct(job.stem) for job in jobs]
    assert len(jobs) == 2 and states[-1]["state"] == "COMPLETED", states
    steps = subprocess.run(
        ["sacct", "-n", "-P", "-j", jobs[0].stem, "-o", "JobID,ExitCode"], capture_output=True, text=True
    ).stdout.split()
    assert f"{jobs[0].stem}.0|3:0" in steps, steps
    # Every GPU job on dev-g.
    for rule in [*(f"train_stage{n}" for n in range(4)), *(f"evaluate_stage{n}" for n in range(4))]:
        for log in (tmp_path / f"logs/slurm/rule_{rule}").rglob("*.log"):
            assert sacct(log.stem)["partition"] == "dev-g", rule
    assert "rehearsal: PASSED" in (tmp_path / "logs/rehearsal_summary/rehearsal_summary.log").read_text()

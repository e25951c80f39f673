"""Through the test SLURM: a train_stage1 job killed late in the stage is resubmitted by
snakemake and the stage ends with the same weights as an uninterrupted run.

The pipeline up to stage 1 runs on the local executor (the reference, and the data); then
`-R train_stage1 --retries 1` goes through `--executor slurm`: the first job's trainer is
SIGKILLed entering its last validation (best at an earlier epoch), SLURM records the job
FAILED, snakemake deletes its best.pt and submits it again; the second job takes over the
dead run's lock, resumes from latest.pt and re-creates best.pt. Skipped like the other SLURM
tests where no cluster can be brought up.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
import yaml

from tests.lumi.helpers import TEST_ACCOUNT
from tests.slurm.polling import fast_polling
from tests.slurm.test_slurm import FAST, SLURM_CONFIG, sacct, slurm_cluster  # noqa: F401 (fixture)
from tests.workflow.snakemake_run import ONE_REGION, ROOT, SNAKEMAKE
from tests.workflow.test_resume_snakemake import TARGET, models_config, rows, write_shim

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]


def test_killed_train_stage1_job_is_resubmitted_and_resumes(slurm_cluster, tmp_path):  # noqa: F811
    work = tmp_path / "work"
    work.mkdir()
    (work / "models.yaml").write_text(yaml.safe_dump(models_config()))
    config = {**ONE_REGION, "model_config": str(work / "models.yaml"), "resources": SLURM_CONFIG["resources"]}
    (work / "resume.yaml").write_text(yaml.safe_dump(config))
    write_shim(tmp_path / "bin", kill_group=False)  # the job's trainer dies, not the snakemake master
    env = dict(
        os.environ,
        PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        KILL=str(tmp_path / "kill"),
    )
    fast_polling(env)
    common = ["-d", str(work), "--configfile", "resume.yaml"]

    local = subprocess.run(
        [*SNAKEMAKE, "--cores", "2", *common, "--", TARGET],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert local.returncode == 0, (local.stdout + local.stderr)[-4000:]
    reference = torch.load(work / TARGET, weights_only=True)
    reference_rows = rows(work)
    assert reference["epoch"] == 2 and [row["best"] for row in reference_rows] == [True, True, False]

    (tmp_path / "kill").touch()
    # A deliberate retrain (docs/resume.md): -R alone would find the finished latest.pt and train nothing.
    os.replace(work / "results/stage1/latest.pt", work / "results/stage1/latest.before.pt")
    proc = subprocess.run(
        [
            *SNAKEMAKE,
            *common,
            "--executor",
            "slurm",
            "--jobs",
            "1",
            "--retries",
            "1",
            "--default-resources",
            f"slurm_account={TEST_ACCOUNT}",
            "--slurm-logdir",
            str(work / "slurm_logs"),
            "--slurm-keep-successful-logs",
            *FAST,
            "-R",
            "train_stage1",
            "--",
            TARGET,
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert not (tmp_path / "kill").exists()  # the first job did die

    jobs = sorted((work / "slurm_logs").rglob("*.log"), key=lambda log: int(log.stem))
    states = [sacct(log.stem)["state"] for log in jobs]
    assert states == ["FAILED", "COMPLETED"], states
    log = (work / "logs/train_stage1/train_stage1.log").read_text()
    assert "took over a stale lock" in log and "resuming from" in log and "re-creating" in log
    resumed = torch.load(work / TARGET, weights_only=True)
    assert resumed["epoch"] == reference["epoch"] and resumed["best_value"] == reference["best_value"]
    for key, value in reference["model"].items():
        assert torch.equal(resumed["model"][key], value), key
    assert rows(work) == reference_rows

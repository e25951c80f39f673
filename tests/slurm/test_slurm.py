"""Against a real SLURM (Debian slurm-wlm, one node, partitions named as on LUMI).

tests/slurm/cluster-up.sh brings the cluster up from the packages that tests/system-packages.sh
installs; where that is impossible (not root, packages missing) it exits 77 and these tests skip
with its reason (fail under CI=true: CI runs them).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.lumi.helpers import (
    REPO,
    TEST_ACCOUNT,
    binds_of,
    exec_calls,
    lumi_tree,
    stand_in_env,
    write_overlay,
)
from tests.slurm.polling import fast_polling
from tests.system import unavailable

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
FAST = ["--slurm-init-seconds-before-status-checks", "5", "--seconds-between-status-checks", "3"]

# The default pipeline on tiny models, each rule on the partition LUMI would use; GPU rules ask
# for the node's one (fake) GPU and one core per GPU (the node has two cores).
GPU = {"partition": "small-g", "gpus": 1, "cpus_per_gpu": 1, "threads": 1, "mem_mb": 1500}
SLURM_CONFIG = {
    "data": {"patch_size": 32},
    # One location in each of a train, a val and a test ROI of one region (africa): 4 archives.
    "synthetic": {"patches": 1, "rois": ["ROIs1970/21", "ROIs2017/22", "ROIs2017/32"]},
    "model_config": str(REPO / "tests/workflow/tiny_models.yaml"),
    "resources": {
        "synth_raw": {"runtime": 10, "mem_mb": 1000, "threads": 1, "partition": "small"},
        "index_archive": {"runtime": 17, "mem_mb": 1000, "threads": 1, "partition": "small"},
        "prepare_roi": {"runtime": 20, "mem_mb": 1500, "threads": 1, "partition": "small"},
        "assemble_split": {"runtime": 15, "mem_mb": 1000, "threads": 1, "partition": "small"},
        "wind_cache": {"runtime": 10, "mem_mb": 1000, "threads": 1, "partition": "small"},
        "train_stage0": {"runtime": 30, **GPU},
        "train_stage1": {"runtime": 31, **GPU},
        "train_stage2": {"runtime": 32, **GPU},
        "train_stage3": {"runtime": 33, **GPU},
        "fixed_protocol": {"runtime": 14, "mem_mb": 1000, "threads": 1, "partition": "small"},
        **{f"evaluate_stage{n}": {"runtime": 25, **dict(GPU, partition="dev-g")} for n in range(4)},
        "export_viewer": {"runtime": 16, "mem_mb": 1500, "threads": 1, "partition": "small"},
        "report_curves": {"runtime": 11, "mem_mb": 1000, "threads": 1, "partition": "small"},
        "report_tables": {"runtime": 12, "mem_mb": 1000, "threads": 1, "partition": "small"},
        "accounting": {"runtime": 13, "mem_mb": 1000, "threads": 1, "partition": "small"},
    },
}


@pytest.fixture(scope="session")
def slurm_cluster():
    script = REPO / "tests" / "slurm" / "cluster-up.sh"
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=1200)
    lines = (proc.stdout + proc.stderr).strip().splitlines() or ["(no output)"]
    if proc.returncode == 77:
        unavailable(f"no SLURM here: {lines[-1]}")
    assert proc.returncode == 0, "\n".join(lines[-30:])
    return True


def sacct(job_id: str) -> dict[str, str]:
    # Right after a short job ends, slurmdbd may not have its partition and limit yet.
    for _ in range(20):
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,Partition,Timelimit,AllocTRES,Account,NNodes"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        state, partition, limit, tres, account, nodes = out.splitlines()[0].split("|")
        if partition and limit:
            break
        time.sleep(0.5)
    return {
        "state": state,
        "partition": partition,
        "timelimit": limit,
        "tres": tres,
        "account": account,
        "nodes": nodes,
    }


def minutes(limit: str) -> int:
    days, _, clock = limit.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return int(days or 0) * 24 * 60 + h * 60 + m + (s > 0)


# LUMI's dev-g rehearsal as the tests' pipeline run: config/lumi.yaml + config/lumi-rehearsal.yaml
# through `snakemake --profile lumi`, in the strict container stand-in, tiny models on the one-node
# cluster. Each rule asks for its own wall time (minutes), so sacct shows which request each job got.
REHEARSAL_GPU = {"partition": "dev-g", "gpus": 1, "cpus_per_gpu": 2, "threads": 2, "mem_mb_per_gpu": 1500}
REHEARSAL_CPU = {"partition": "small", "threads": 1, "mem_mb": 1500}
REHEARSAL_RUNTIME = {
    **{f"train_stage{n}": 30 + n for n in range(4)},
    **{f"evaluate_stage{n}": 25 + n for n in range(4)},
    **dict(synth_raw=10, index_archive=17, prepare_roi=20, assemble_split=15, wind_cache=11),
    **dict(fixed_protocol=14, export_viewer=16),
}
REHEARSAL_EPOCHS = 10  # stage 1's, 2 steps each: its first job, paced, is warned after 4 s


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster, tmp_path_factory):
    """The rehearsal's working folder and its time. Paced (tests/slurm/pace): stage 1's first job
    sleeps 1 s after each optimizer step, so the forced warning (4 s) finds it training; the
    resumed job runs unpaced. (The RCCL transport step needs RCCL: it is off here and tested on
    its own in tests/unit/test_rehearsal.py.)"""
    from tests.lumi.helpers import require_stand_in

    require_stand_in()
    work = tmp_path_factory.mktemp("rehearsal")
    models = yaml.safe_load((REPO / "tests/workflow/tiny_models.yaml").read_text())
    models["stage1"]["train"]["epochs"] = REHEARSAL_EPOCHS
    (work / "models.yaml").write_text(yaml.safe_dump(models))
    resources = {
        rule: dict(REHEARSAL_GPU if "stage" in rule else REHEARSAL_CPU, runtime=minutes)
        for rule, minutes in REHEARSAL_RUNTIME.items()
    }
    for n in range(4):
        resources[f"train_stage{n}"]["epoch_minutes"] = 0.1
    resources["train_stage1"]["rehearse_warning"] = 4
    overlay, cluster = write_overlay(
        work,
        binds=[str(work), str(REPO)],  # on LUMI the clone is the working directory, bound
        synthetic={"enabled": True, "rois": ["ROIs1970/21", "ROIs2017/22", "ROIs2017/32"], "patches": 1},
        model_config=str(work / "models.yaml"),
        rehearsal={"enabled": True, "summary": "results-rehearsal/rehearsal.json", "transport": False},
        paths={"prepared": "results-rehearsal/prepared", "results": "results-rehearsal"},
    )
    extra = yaml.safe_load(overlay.read_text())
    extra["cluster"].update(signal_seconds=60, restart_minutes=0)
    extra["resources"] = resources
    overlay.write_text(yaml.safe_dump(extra))
    env = stand_in_env(work)
    pace = shutil.copytree(REPO / "tests/slurm/pace", work / "pace")  # under the bind
    env.update(PYTHONPATH=str(pace), VCLOUD_TEST_PACE_STEP_S="1", VCLOUD_TEST_PACE_ONLY="stage1")
    fast_polling(env, pace)
    command = [*SNAKEMAKE, "--profile", "lumi", "-d", str(work), "--configfile", "config/lumi.yaml"]
    command += ["config/lumi-rehearsal.yaml", str(overlay), "--apptainer-args", cluster.apptainer_args(), *FAST]
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=2400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return work, time.perf_counter() - started


def job_rules(logs: Path) -> dict[str, str]:
    """SLURM job id -> rule, from the plugin's per-job log files (<logdir>/rule_<rule>/.../<id>.log)."""
    return {log.stem: log.relative_to(logs).parts[0].removeprefix("rule_") for log in logs.rglob("*.log")}


def test_every_rule_ran_as_a_slurm_job_with_its_configured_request(slurm_run):
    work, seconds = slurm_run
    jobs = job_rules(work / "logs" / "slurm")  # slurm-logdir from the lumi profile
    ran = sorted(jobs.values())
    expected = (
        ["assemble_split"] * 3
        + [f"evaluate_stage{n}" for n in range(4)]
        + ["prepare_roi"] * 3
        + ["synth_raw"]
        + [f"train_stage{n}" for n in range(4)]
        + ["train_stage1"]  # resubmitted after the forced wall-time warning
        + ["export_viewer", "wind_cache"]  # the models scan by wind
        + ["fixed_protocol"]  # the fixed protocol's detection, once for every evaluation
        + ["index_archive"] * 4
    )  # the synthetic raw data come as archives: s1 and s2, train and test, of one region
    assert ran == sorted(expected), ran
    # The report rules and the closing summary are local rules (seconds of work): made, never queued.
    made = ["accounting.tsv", "evaluation.html", "curves/stage3.png"]
    for path in [*(f"results-rehearsal/report/{name}" for name in made), "results-rehearsal/rehearsal.json"]:
        assert (work / path).is_file(), path
    warned = min((job for job, rule in jobs.items() if rule == "train_stage1"), key=int)
    for job_id, rule in jobs.items():
        acct = sacct(job_id)
        assert acct["state"] == ("FAILED" if job_id == warned else "COMPLETED"), (rule, acct)
        assert acct["partition"] == ("dev-g" if "stage" in rule else "small"), (rule, acct)
        assert minutes(acct["timelimit"]) == REHEARSAL_RUNTIME[rule], (rule, acct)
        assert acct["account"] == TEST_ACCOUNT, (rule, acct)
        assert ("gres/gpu=1" in acct["tres"]) == ("stage" in rule), (rule, acct)
    for stage in range(4):
        assert (work / f"results-rehearsal/eval/stage{stage}.json").is_file()
    print(f"slurm pipeline (the dev-g rehearsal): {len(jobs)} jobs in {seconds:.0f} s")


def test_the_rehearsal_resumes_after_the_forced_warning_and_passes(slurm_run):
    """Stage 1's first job is warned (exit 3 of its step) and the next one finishes it; the closing
    summary, read inside the container, passes."""
    work, _ = slurm_run
    summary = json.loads((work / "results-rehearsal/rehearsal.json").read_text())
    assert summary["passed"] and summary["problems"] == [], summary
    assert summary["stages"]["stage1"]["resumed"] and not summary["stages"]["stage0"]["resumed"]
    rows = [json.loads(x) for x in (work / "results-rehearsal/stage1/metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["epoch"] >= 0]
    assert [r["epoch"] for r in rows] == list(range(REHEARSAL_EPOCHS)) and rows[0]["epoch_s"] >= 1.0  # paced
    assert summary["stamp"] and summary["stamp"].startswith("vcloud ")  # read inside the container
    assert set(summary["epoch_minutes"]) == {f"train_stage{n}" for n in range(4)}
    jobs = sorted((work / "logs/slurm/rule_train_stage1").rglob("*.log"), key=lambda p: int(p.stem))
    assert len(jobs) == 2 and sacct(jobs[-1].stem)["state"] == "COMPLETED"
    steps = subprocess.run(
        ["sacct", "-n", "-P", "-j", jobs[0].stem, "-o", "JobID,ExitCode"], capture_output=True, text=True
    ).stdout.split()
    assert f"{jobs[0].stem}.0|3:0" in steps, steps
    assert "rehearsal: PASSED" in (work / "logs/rehearsal_summary/rehearsal_summary.log").read_text()


def test_two_task_srun_ddp_through_the_multinode_launch_line(slurm_run, tmp_path):
    """The multi-node path (srun + singularity exec, rank 0's host from squeue) on one node:
    two gloo ranks train stage 0 and agree on rank, world size and rank 0's address."""
    from vcloud.runtime.cluster import RuleResources
    from vcloud.runtime.slurm import multinode_prefix

    work, _ = slurm_run
    overlay, cluster = write_overlay(tmp_path, binds=[str(tmp_path), str(work), str(REPO)])
    res = RuleResources(
        rule="train_stage0", runtime=10, mem_mb=3000, threads=1, partition="small", gpus=0, nodes=2, cpus_per_gpu=7
    )
    line = multinode_prefix(dataclasses.replace(res, nodes=1), cluster, tasks_per_node=2)
    out = tmp_path / "ddp"
    command = (
        f"{line} vcloud train --stage 0 --config {REPO / 'tests/workflow/tiny_models.yaml'}"
        f" --train {work / 'results-rehearsal/prepared/train.zarr'} --val {work / 'results-rehearsal/prepared/val.zarr'}"
        f" --out {out}"
    )
    # As the SLURM jobstep does for a rule with an mpi resource: no SLURM_* but the job id.
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\nset -euo pipefail\n"
        "for v in $(compgen -e | grep -E '^(SLURM_|SRUN_|SBATCH_)' | grep -v '^SLURM_JOB_ID$'); "
        'do unset "$v"; done\n' + command + "\n"
    )
    env = stand_in_env(tmp_path)
    env["PYTHONPATH"] = str(REPO)
    submit = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--wait",
            "-p",
            "small",
            "-A",
            TEST_ACCOUNT,
            "-n",
            "2",
            "-c",
            "1",
            "--mem",
            "3000",
            "-t",
            "10",
            "-o",
            str(tmp_path / "job.log"),
            str(script),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=900,
    )
    log = (tmp_path / "job.log").read_text() if (tmp_path / "job.log").exists() else ""
    assert submit.returncode == 0, submit.stderr + log[-4000:]
    job_id = submit.stdout.strip().split(";")[0]
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    port = 29500 + int(job_id) % 1000
    for rank in (0, 1):
        pattern = rf"rank {rank}/2 local {rank} \(slurm\) on \S+ master {re.escape(host)}:{port} "
        assert re.search(pattern, log), log[-4000:]
    assert (out / "best.pt").is_file()
    calls = exec_calls(tmp_path)
    assert len(calls) == 2  # one singularity exec per task
    for call in calls:
        assert "--rocm" not in call["argv"] and cluster.image in call["argv"]
        assert set(cluster.binds) <= set(binds_of(call["argv"]))
        assert call["containlibs"] == ",".join(cluster.containlibs)
        assert call["env"]["SINGULARITYENV_MASTER_ADDR"] == host


def test_lumi_profile_submits_through_slurm_into_the_image(slurm_cluster, tmp_path):
    """`snakemake --profile lumi` as typed, from a clone reached through the /scratch symlink
    (as on LUMI): jobs go to SLURM with the configured partition and account, start in the
    physical /pfs working directory, and each runs in the image with the binds (/pfs among
    them) and containlibs of the profile."""
    lumi = tmp_path / "lumi"
    code = lumi_tree(lumi)
    container = tmp_path / "container"
    container.mkdir()
    binds = [str(lumi / "pfs"), str(lumi / "scratch" / TEST_ACCOUNT), str(container)]
    overlay, cluster = write_overlay(container, binds=binds)
    env = fast_polling(stand_in_env(tmp_path))
    proc = subprocess.run(
        [
            *SNAKEMAKE,
            "--profile",
            "lumi",
            "-d",
            str(code),
            "--configfile",
            "config/lumi.yaml",
            str(overlay),
            "--apptainer-args",
            cluster.apptainer_args(),
            *FAST,
            "--",
            "results/prepared/rois/ROIs1868_119.zarr",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    calls = exec_calls(tmp_path)
    commands = [call["argv"][-1] for call in calls]
    # synth_raw, index_archive of the ROI's S1 and S2 archives, prepare_roi: each in the image.
    assert "vcloud synth" in commands[0] and "vcloud prepare" in commands[-1], commands
    assert sum("vcloud index" in command for command in commands) == 2, commands
    for call in calls:
        assert "--rocm" not in call["argv"] and cluster.image in call["argv"]
        assert set(cluster.binds) <= set(binds_of(call["argv"]))
        # The profile's precommand ran in the job before its snakemake: apptainer saw it.
        assert call["containlibs"] == ",".join(cluster.containlibs)
    assert (code / "results/prepared/rois/ROIs1868_119.zarr/zarr.json").is_file()
    logs = list((code / "logs" / "slurm").rglob("*.log"))
    workdir = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", logs[0].stem, "-o", "WorkDir"], capture_output=True, text=True
    ).stdout.strip()
    assert workdir.startswith(str(lumi / "pfs")), workdir  # the physical path, as on LUMI
    assert len(logs) == 4  # slurm-logdir from the profile: one log per job
    for log in logs:
        acct = sacct(log.stem)
        assert acct["state"] == "COMPLETED" and acct["partition"] == "small"
        assert acct["account"] == TEST_ACCOUNT


PACE_S = 1.0  # sleep after each optimizer step of the wall-time test's first job


def _model_state(path: Path) -> dict:
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    return state["model"]


def test_wall_time_warning_checkpoints_and_snakemake_resubmits_until_done(slurm_cluster, tmp_path):
    """Stage 0 in one-minute jobs through `snakemake --profile lumi`: SLURM sends SIGUSR1
    (--signal=USR1@S from cluster.signal_seconds) to the rule's own job step, the trainer
    writes latest.pt and exits 3, snakemake resubmits the rule (its retries from the config),
    the next job resumes, and the stage completes with the weights of an uninterrupted run.

    Paced (tests/slurm/pace): the first job sleeps PACE_S after every optimizer step, so its
    training would outlast the one-minute limit and SLURM's warning (sent 10-40 s into the job:
    slurmctld checks time limits every 30 s) always finds it mid-epoch; the resumed job and the
    reference run unpaced. Sleeping changes no weight, so the comparison stays exact."""
    import torch

    models = yaml.safe_load((REPO / "tests/workflow/tiny_models.yaml").read_text())
    epochs = 60  # 2 steps each: about 2.1 s paced (126 s, past the limit), 0.1 s unpaced
    models["stage0"]["train"]["epochs"] = epochs
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(models))
    overlay, cluster = write_overlay(
        tmp_path,
        synthetic={"enabled": True, "rois": ["ROIs1868/119", "ROIs2017/22", "ROIs1970/119"], "patches": 1},
        model_config=str(tmp_path / "models.yaml"),
    )
    extra = yaml.safe_load(overlay.read_text())
    extra["cluster"].update(signal_seconds=20, restart_minutes=0, spare_retries=2)
    extra["resources"].update(
        assemble_split={"runtime": 20, "mem_mb": 1000, "threads": 1, "partition": "small"},
        # 1 min jobs, warned 20 s before the end: retries = ceil(60 x 2.1 s / 40 s) - 1 + 2 = 5.
        train_stage0={
            "runtime": 1,
            "mem_mb_per_gpu": 1500,
            "threads": 1,
            "partition": "small-g",
            "gpus": 1,
            "cpus_per_gpu": 2,
            "epoch_minutes": 2.1 / 60,
        },
    )
    overlay.write_text(yaml.safe_dump(extra))
    env = stand_in_env(tmp_path)
    pace = shutil.copytree(REPO / "tests/slurm/pace", tmp_path / "pace")  # under the bind
    env["PYTHONPATH"] = f"{pace}:{REPO / 'src'}"
    env["VCLOUD_TEST_PACE_STEP_S"] = str(PACE_S)
    fast_polling(env, pace)
    base = [
        *SNAKEMAKE,
        "--profile",
        "lumi",
        "-d",
        str(tmp_path),
        "--configfile",
        "config/lumi.yaml",
        str(overlay),
        "--apptainer-args",
        cluster.apptainer_args(),
        *FAST,
    ]
    stores = ["results/prepared/train.zarr", "results/prepared/val.zarr"]
    data = subprocess.run(
        [*base, "--executor", "local", "--cores", "2", "--", *stores],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert data.returncode == 0, (data.stdout + data.stderr)[-4000:]
    proc = subprocess.run(
        [*base, "--", "results/stage0/best.pt"], cwd=REPO, capture_output=True, text=True, env=env, timeout=1500
    )
    out = proc.stdout + proc.stderr
    (tmp_path / "snakemake.out").write_text(out)
    assert proc.returncode == 0, out[-6000:]
    jobs = sorted((tmp_path / "logs" / "slurm" / "rule_train_stage0").rglob("*.log"), key=lambda p: int(p.stem))
    states = [sacct(job.stem) for job in jobs]
    assert len(jobs) >= 2, (states, out[-3000:])
    assert states[-1]["state"] == "COMPLETED"
    assert all(s["state"] in ("FAILED", "TIMEOUT") for s in states[:-1]), states
    assert all(s["partition"] == "small-g" and minutes(s["timelimit"]) == 1 for s in states)
    # The warning path: the trainer's step of an earlier job ended with exit 3 (latest.pt
    # written on SIGUSR1), and no job reran the command inside its allocation (one step each).
    steps = {
        job.stem: subprocess.run(
            ["sacct", "-n", "-P", "-j", job.stem, "-o", "JobID,ExitCode"], capture_output=True, text=True
        ).stdout.split()
        for job in jobs
    }
    assert any(f"{job.stem}.0|3:0" in steps[job.stem] for job in jobs[:-1]), steps
    assert all(not any(line.startswith(f"{job.stem}.1|") for line in steps[job.stem]) for job in jobs), steps
    rows = [json.loads(x) for x in (tmp_path / "results/stage0/metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(epochs))  # one row per epoch across the jobs
    # The first job was paced (its epochs took at least one sleep), the last one was not.
    assert rows[0]["epoch_s"] >= PACE_S > rows[-1]["epoch_s"], [r["epoch_s"] for r in rows]
    # The same training uninterrupted and unpaced, on the host, with the job's thread count
    # (snakemake exports OMP_NUM_THREADS = the rule's threads; another count changes float sums).
    ref = tmp_path / "reference"
    del env["VCLOUD_TEST_PACE_STEP_S"]
    env["OMP_NUM_THREADS"] = str(extra["resources"]["train_stage0"]["threads"])
    train = subprocess.run(
        [
            "vcloud",
            "train",
            "--stage",
            "0",
            "--config",
            str(tmp_path / "models.yaml"),
            "--train",
            str(tmp_path / stores[0]),
            "--val",
            str(tmp_path / stores[1]),
            "--out",
            str(ref),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    got, want = _model_state(tmp_path / "results/stage0/best.pt"), _model_state(ref / "best.pt")
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    print(f"wall-time resubmission: {len(jobs)} jobs: {[s['state'] for s in states]}")

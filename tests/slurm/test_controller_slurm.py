"""Saga's rehearsal end to end on the test SLURM's sigma2 variant, run by `vcloud submit`: the
controller is itself a SLURM job on Saga's CPU partition; it gets its wall-time warning, then its
successor is cancelled, and the run still finishes without training anything twice.

A user's clone (a copy of the working tree) with their run file (config/saga.yaml: account,
image, binds) and its profile (`vcloud profile --site saga`) submits the controller; the GPU
rules go to Saga's rehearsal partition (a100, typed GPUs) under the enforced devel QOS, in
the strict container stand-in with `--nv` on their job steps. Three controllers:

1. the first gets the wall-time warning SLURM sends its batch shell (USR1) while stage 2 trains:
   it submits the next controller, stage 2's job writes latest.pt and stops, it ends;
2. the next one carries on, and is cancelled (`scancel`) while stage 3 trains;
3. a second `vcloud submit` cancels the job the cancelled one left, clears the lock and finishes.

The rehearsal's summary passes; stage 1 resumed after the trainer's forced warning, stage 2
after the controller's, stage 3 after the cancel; every epoch was trained once, and the weights
of every stage that had finished are byte for byte the same.

The variant is a second cluster (tests/slurm/cluster-up.sh --variant). The executor plugin drops
every SLURM_* variable in a job (SLURM_CONF too), so the SLURM commands reach that cluster
through wrappers first on PATH that name its configuration, as a site's default one is found.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.lumi.helpers import REPO, STAND_IN, exec_calls, require_stand_in, write_stand_in_image
from tests.slurm.polling import fast_polling
from tests.slurm.test_site_variants import SITE_CONF, variants  # noqa: F401 - the site cluster fixture
from tests.workflow.snakemake_run import copy_worktree
from vcloud.runtime.controller import JOB_NAME, SCRIPT, STATE

pytestmark = [pytest.mark.slurm, pytest.mark.container, pytest.mark.workflow]
SLURM_COMMANDS = ("sbatch", "squeue", "scancel", "sacct", "scontrol", "srun", "sinfo", "sstat")
ROIS = ["ROIs1970/21", "ROIs2017/22", "ROIs2017/32"]  # the rehearsal's: train, val, test
EPOCHS = {"stage1": 6, "stage2": 10, "stage3": 20}  # 2 steps each; first jobs paced at 1 s a step
GPU = {"cpus_per_gpu": 2, "threads": 2, "mem_mb_per_gpu": 1500, "epoch_minutes": 0.1}
CPU = {"threads": 1, "mem_mb": 1500, "runtime": 10}


def site_bin(folder: Path) -> Path:
    """SLURM's commands, pointed at the site cluster (what a site's default slurm.conf does)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in SLURM_COMMANDS:
        real = shutil.which(name)
        assert real, f"{name} is not installed"
        path = folder / name
        path.write_text(f'#!/bin/sh\nSLURM_CONF={SITE_CONF} exec {real} "$@"\n')
        path.chmod(0o755)
    return folder


def user_clone(tmp_path: Path, **cluster) -> Path:
    """The clone with the user's run file and profile: config/saga.yaml's cluster section names
    the account, the image, the environment and the binds (and `cluster`'s changes), then
    `vcloud profile --site saga`."""
    clone = copy_worktree(tmp_path / "vcloud")
    run_file = clone / "config" / "saga.yaml"
    config = yaml.safe_load(run_file.read_text())
    container = tmp_path / "container"
    # The environment image of the clone's code, stamped as the clone's vcloud stamps it (the
    # host side below runs the clone's package, as a user's install of their clone does).
    build = f"from pathlib import Path as P; from tests.lumi.helpers import build_env_image as b; print(b(P({str(container)!r}), P({str(clone)!r})))"
    env_image = subprocess.run(
        [sys.executable, "-c", build], env=clone_env(clone), cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.splitlines()[-1]  # after mksquashfs's progress
    config["cluster"].update(
        account="nn1234k",  # a Sigma2 account the test cluster knows
        image=str(write_stand_in_image(container)),
        env_image=env_image,
        binds=[str(tmp_path)],
        **cluster,
    )
    run_file.write_text(yaml.safe_dump(config))
    command = ["vcloud", "profile", "--site", "saga"]
    subprocess.run(command, cwd=clone, env=clone_env(clone), check=True, capture_output=True)
    return clone


def clone_env(clone: Path, *paths: Path) -> dict[str, str]:
    """The environment of the clone's own vcloud (its src/ first on the path, then REPO for the
    test helpers), not the host's install of this checkout."""
    return {**os.environ, "PYTHONPATH": ":".join(map(str, (*paths, clone / "src", REPO)))}


def rehearsal_file(tmp_path: Path, clone: Path) -> Path:
    """The rehearsal made tiny: synthetic ROIs of one 32-px location, the tiny models, requests
    that fit the 2-core test node, the forced warning 4 s into stage 1."""
    models = yaml.safe_load((REPO / "tests/workflow/tiny_models.yaml").read_text())
    for stage, epochs in EPOCHS.items():
        models[stage]["train"]["epochs"] = epochs
    (clone / "tiny.yaml").write_text(yaml.safe_dump(models))
    resources = {f"{kind}_stage{n}": dict(GPU) for kind in ("train", "evaluate") for n in range(4)}
    cpu_rules = ("synth_raw", "prepare_roi", "assemble_split", "wind_cache", "fixed_protocol", "export_viewer")
    resources.update({rule: dict(CPU) for rule in cpu_rules})
    test = {
        "synthetic": {"enabled": True, "rois": ROIS, "patches": 1},
        "data": {"patch_size": 32, "wind_table": None},
        "model_config": "tiny.yaml",
        "paths": {"prepared": "results-rehearsal/prepared"},
        "rehearsal": {"transport": False, "warn_after": 4},  # NCCL over IB is not here
        "cluster": {"signal_seconds": 60, "restart_minutes": 0},
        "resources": resources,
    }
    path = clone / "test.yaml"
    path.write_text(yaml.safe_dump(test))
    return path


def wait_for(what: str, condition, timeout: float, log: Path, alive=lambda: True) -> None:
    """Poll `condition`; fail with the controller's log after `timeout` or once `alive` is false."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end or not alive():
            tail = log.read_text()[-4000:] if log.is_file() else "(no controller log)"
            pytest.fail(f"{what}: not within {timeout:.0f} s or the controller ended; its log ends:\n{tail}")
        time.sleep(2)


def train_log(clone: Path, stage: str) -> str:
    return (clone / "logs" / f"train_{stage}" / f"train_{stage}.log").read_text()


def epochs(clone: Path, stage: str) -> list[int]:
    path = clone / "results-rehearsal" / stage / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row["epoch"] for row in rows if row["epoch"] >= 0]


def test_controller_warned_then_cancelled_then_resubmitted_finishes_the_saga_rehearsal(variants, tmp_path):  # noqa: F811
    require_stand_in()
    variants.use("sigma2")
    clone = user_clone(tmp_path)
    rehearsal_file(tmp_path, clone)
    pace = shutil.copytree(REPO / "tests/slurm/pace", tmp_path / "pace")  # under the bind
    env = clone_env(clone, pace)
    env.update(
        PATH=f"{site_bin(tmp_path / 'site-bin')}:{STAND_IN}:{os.environ['PATH']}",
        VCLOUD_APPTAINER_LOG=str(tmp_path / "apptainer.jsonl"),
        VCLOUD_TEST_PACE_STEP_S="1",
        VCLOUD_TEST_PACE_ONLY=",".join(EPOCHS),
    )
    fast_polling(env, pace)
    args = ["--configfile", "config/saga.yaml", "config/rehearsal.yaml", "test.yaml"]
    args += ["--slurm-init-seconds-before-status-checks", "5", "--seconds-between-status-checks", "3"]
    submit = ["vcloud", "submit", "--profile", "profiles/saga", "--runtime", "60", "--", *args]

    def queue() -> list[list[str]]:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%T"], env=env, capture_output=True, text=True)
        return [line.split("|") for line in out.stdout.split()]

    def controller() -> str:  # written by `vcloud submit`, then by each controller that resubmits
        return json.loads((clone / STATE).read_text())["job"]

    def queued(job: str):
        return lambda: any(row[0] == job for row in queue())

    def log(job: str) -> Path:
        return clone / "logs" / "controller" / f"{job}.log"

    def weights(*stages: int) -> dict[int, bytes]:
        return {n: (clone / f"results-rehearsal/stage{n}/best.pt").read_bytes() for n in stages}

    # 1. Submitted from the login node; its wall-time warning comes while stage 2 trains.
    first = subprocess.run(submit, cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "controller bill:" in first.stdout and "on normal for 60 min" in first.stdout, first.stdout
    job_a = controller()
    wait_for("stage 2's first epoch", lambda: len(epochs(clone, "stage2")) >= 1, 900, log(job_a), queued(job_a))
    before_warning = weights(0, 1)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job_a], env=env, check=True)  # --signal=B:USR1@...
    wait_for("the warned controller's end", lambda: not queued(job_a)(), 300, log(job_a))
    job_b = controller()
    assert job_b != job_a and f"next controller {job_b}" in log(job_a).read_text()
    # Stage 2 stopped at the warning with its latest.pt (metrics.jsonl, a declared output, is
    # removed by snakemake as incomplete and written again by the resumed job: not read here).
    assert (clone / "results-rehearsal/stage2/latest.pt").is_file()

    # 2. The next controller carries on; it is cancelled while stage 3 trains.
    wait_for("stage 3's first epoch", lambda: len(epochs(clone, "stage3")) >= 1, 900, log(job_b), queued(job_b))
    before_cancel = weights(2)
    subprocess.run(["scancel", job_b], env=env, check=True)
    wait_for("the cancelled controller gone", lambda: not queued(job_b)(), 120, log(job_b))
    # Its snakemake died with it (SIGTERM, then SIGKILL): stage 3's job is left in the queue.
    left = [row for row in queue() if row[1].startswith("vcloud_")]
    assert left, "no job of the cancelled controller left in the queue"

    # 3. Submitted again: it cancels what is left, clears the lock and finishes the run.
    third = subprocess.run(submit, cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stdout + third.stderr
    job_c = controller()
    wait_for("the third controller's end", lambda: not queue(), 1200, log(job_c))
    text = log(job_c).read_text()
    assert f"cancelling {len(left)} jobs an earlier controller left" in text, text[-4000:]
    states = {}
    for job in (job_a, job_b, job_c):
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], env=env, capture_output=True)
        states[job] = out.stdout.decode().split()[0]
    assert [states[j] for j in (job_a, job_b, job_c)] == ["COMPLETED", "CANCELLED", "COMPLETED"], states

    summary = json.loads((clone / "results-rehearsal/rehearsal.json").read_text())
    assert summary["passed"] and summary["problems"] == [], summary
    # stage 1 after the trainer's forced warning, 2 after the controller's, 3 after the cancel
    assert all(summary["stages"][f"stage{n}"]["resumed"] for n in (1, 2, 3)), summary["stages"]
    for stage, count in EPOCHS.items():  # every epoch once: none trained again
        assert epochs(clone, stage) == list(range(count)), (stage, epochs(clone, stage))
        resumed = re.findall(rf"{stage[:-1]} {stage[-1]}: resuming from \S+ at epoch (\d+)", train_log(clone, stage))
        assert resumed and int(resumed[-1]) < count, (stage, resumed)  # stopped mid-stage, went on from there
    assert weights(0, 1) == before_warning and weights(2) == before_cancel  # finished: never trained again
    # GPU jobs: Saga's a100 partition, the devel QOS, `--nv` on their steps only.
    accounting = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-o", "JobID,JobName,Partition,QOS,AllocTRES,State,WorkDir", "-S", "now-2hours"],
        env=env,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    rows = [line.split("|") for line in accounting if line.endswith(f"|{clone}")]
    jobs = [row[1:] for row in rows if int(row[0]) >= int(job_a)]  # this run's (a former one's folder may match)
    assert sum(1 for j in jobs if j[0] == JOB_NAME) == 3
    gpu_jobs = [j for j in jobs if j[1] == "a100" and j[3]]  # those that started: a job cancelled
    # while it waited (a leftover the third controller cancelled) was never allocated anything
    assert all(j[4].startswith("CANCELLED") for j in jobs if j[1] == "a100" and not j[3]), jobs
    # one GPU each, billed by SLURM as vcloud's bill says (max(2 cores, 1.5 GB x 0.032, 1 GPU x 8) = 8)
    assert gpu_jobs and all(j[2] == "devel" and "billing=8," in j[3] and "gres/gpu=1" in j[3] for j in gpu_jobs), (
        gpu_jobs
    )
    steps = [call["argv"] for call in exec_calls(tmp_path)]
    assert any("--nv" in argv for argv in steps) and not all("--nv" in argv for argv in steps)


def test_a_site_without_host_installs_runs_the_controller_and_every_job_from_the_image(variants, tmp_path):  # noqa: F811
    """Saga as Olivia is (`host_installs: false`): the user starts `vcloud submit` through
    profiles/saga/bin, so vcloud runs in the image on the login node; the controller's batch
    script starts the image's python; every job's snakemake starts in the image; a GPU rule's
    step goes back to the host's apptainer, with `--nv`. SLURM's client reaches the container
    only through the site's slurm_binds: the site cluster's configuration bound over
    /etc/slurm (without it, sbatch in the image would ask the other cluster, which has no
    a100), and munge's socket (the container has no /run). Stage 0 of the rehearsal, trained."""
    require_stand_in()
    variants.use("sigma2")
    slurm_binds = [f"{Path(SITE_CONF).parent}:/etc/slurm", "/run/munge"]
    clone = user_clone(tmp_path, host_installs=False, slurm_binds=slurm_binds)
    rehearsal_file(tmp_path, clone)
    pace = shutil.copytree(REPO / "tests/slurm/pace", tmp_path / "pace")  # under the bind
    # The host has no vcloud and no SLURM of this cluster on its PATH: only apptainer.
    env = {**os.environ, "PATH": f"{STAND_IN}:{os.environ['PATH']}", "SLURM_CONF": SITE_CONF}
    env.update(VCLOUD_APPTAINER_LOG=str(tmp_path / "apptainer.jsonl"), PYTHONPATH=str(pace))
    fast_polling(env, pace)
    target = "results-rehearsal/stage0/best.pt"
    args = ["--configfile", "config/saga.yaml", "config/rehearsal.yaml", "test.yaml", "--", target]
    submit = ["profiles/saga/bin/vcloud", "submit", "--profile", "profiles/saga", "--runtime", "60", "--", *args]
    host = {k: v for k, v in env.items() if k != "SLURM_CONF"}  # the login node's default cluster
    done = subprocess.run(submit, cwd=clone, env=host, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    job = json.loads((clone / STATE).read_text())["job"]
    log = clone / "logs" / "controller" / f"{job}.log"

    def queued() -> bool:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], env=env, capture_output=True, text=True)
        return job in out.stdout.split()

    wait_for("the controller's end", lambda: not queued(), 900, log)
    state = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], env=env, capture_output=True)
    assert state.stdout.decode().split()[0] == "COMPLETED", log.read_text()[-4000:]
    assert (clone / target).is_file()
    text = (clone / SCRIPT).read_text()
    assert "exec python -m vcloud.runtime.controller" in text and str(clone / "profiles/saga/bin") in text

    calls = [call["argv"] for call in exec_calls(tmp_path)]
    entered = [argv for argv in calls if "/run/munge" in argv]  # through profiles/saga/bin
    words = [" ".join(argv[argv.index("/run/munge") + 2 :]) for argv in entered]  # after the image
    assert words[0].startswith("vcloud submit --profile profiles/saga"), words
    assert sum(w.startswith("python -m vcloud.runtime.controller run") for w in words) == 1, words
    jobs = [w for w in words if w.startswith("python -m snakemake")]
    assert len(jobs) >= 5, words  # synth_raw x3, prepare_roi, ..., train_stage0: each its job
    steps = [argv for argv in calls if argv not in entered]  # the GPU step, from the host's apptainer
    assert steps and all("--nv" in argv for argv in steps) and not any("--nv" in argv for argv in entered)
    assert any("train" in argv and "--out" in argv for argv in steps), steps
    accounting = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-o", "JobID,Partition,Comment,WorkDir", "-S", "now-1hours"],
        env=env,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    rows = [line.split("|") for line in accounting if line.endswith(f"|{clone}") and int(line.split("|")[0]) > int(job)]
    assert any(row[1] == "a100" for row in rows), rows  # stage 0 on Saga's GPU partition

"""`vcloud submit`: the controller as a SLURM job. Here with recording stand-ins of sbatch,
squeue, scancel and snakemake on PATH (tests/slurm runs it on the real test SLURM): what is
submitted, what is refused, what an earlier controller's leftovers get, and the clean stop at
the wall-time warning (next controller after this one, the run's jobs warned, snakemake
interrupted)."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vcloud.errors import ConfigError
from vcloud.runtime.cluster import Cluster
from vcloud.runtime.controller import JOB_NAME, configfiles, controller_job, leftovers, script
from vcloud.runtime.profile import load_workflow_config

REPO = Path(__file__).resolve().parents[2]

# One stand-in for every command: it appends its argv to $CALLS, answers squeue from $QUEUE
# (lines "id|name|state|workdir"), sbatch with a job id, and as snakemake sleeps until SIGINT.
STAND_IN = r"""#!{python}
import json, os, signal, sys, time
name = os.path.basename(sys.argv[0])
with open(os.environ["CALLS"], "a") as log:
    log.write(json.dumps([name, *sys.argv[1:]]) + "\n")
if name == "squeue":
    print(open(os.environ["QUEUE"]).read(), end="")
elif name == "sbatch":
    print("4242")
elif name == "scancel":
    ids = [a for a in sys.argv[1:] if not a.startswith("-")]
    lines = [l for l in open(os.environ["QUEUE"]).read().splitlines() if l.split("|")[0] not in ids or "--signal=USR1" in sys.argv]
    if "--signal=USR1" in sys.argv:  # the trainer saves and exits 3: its job leaves the queue
        lines = [l for l in lines if l.split("|")[0] not in ids]
    open(os.environ["QUEUE"], "w").write("".join(l + "\n" for l in lines))
elif name == "snakemake" and "--unlock" not in sys.argv:
    signal.signal(signal.SIGINT, lambda *a: sys.exit(130))
    open(os.environ["CALLS"] + ".started", "w").write(str(os.getpid()))
    time.sleep(120)
"""


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "squeue", "scancel", "snakemake"):
        path = bin_dir / name
        path.write_text(STAND_IN.format(python=sys.executable))
        path.chmod(0o755)
    calls, queue = tmp_path / "calls.jsonl", tmp_path / "queue.txt"
    calls.write_text("")
    queue.write_text("")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls), "QUEUE": str(queue)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("USER", raising=False)  # as in a batch job started without it
    monkeypatch.delenv("LOGNAME", raising=False)
    return {"calls": calls, "queue": queue, "env": {**os.environ, **env}}


def calls(slurm) -> list[list[str]]:
    return [json.loads(line) for line in slurm["calls"].read_text().splitlines()]


def saga_profile(tmp_path: Path) -> Path:
    """The Saga run file with an account over it, and its profile, in a work folder."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"cluster": {"account": "nn1234k"}, "data": {"wind_table": None}}))
    profile = tmp_path / "profiles" / "saga"
    profile.mkdir(parents=True)
    settings = {"executor": "slurm", "configfiles": [str(REPO / "config" / "saga.yaml"), str(mine)]}
    (profile / "config.yaml").write_text(yaml.safe_dump(settings))
    return profile


def saga() -> Cluster:
    config = load_workflow_config(REPO / "config" / "saga.yaml")
    config["cluster"]["account"] = "nn1234k"
    return Cluster.from_config(config)


def test_the_controller_job_runs_on_the_sites_cpu_partition_with_a_warning_to_its_shell(tmp_path):
    job = controller_job(saga())
    assert (job.partition, job.account, job.runtime) == ("normal", "nn1234k", 2880)  # 2 days of normal's 7
    text = script(job, workdir=tmp_path, profile=Path("profiles/saga"), snakemake_args=["--configfile", "x.yaml"])
    assert "#SBATCH --partition=normal" in text and "#SBATCH --account=nn1234k" in text
    assert f"#SBATCH --signal=B:USR1@{job.signal_seconds}" in text and f"#SBATCH --job-name={JOB_NAME}" in text
    assert "exec " in text and "-m vcloud.runtime.controller run --profile profiles/saga" in text
    assert text.rstrip().endswith("-- --configfile x.yaml")
    with pytest.raises(ConfigError, match="above the normal limit of 10080 min"):
        controller_job(saga(), runtime=20000)


def test_an_earlier_controllers_leftovers_are_its_rule_jobs_only():
    jobs = [
        {"id": "1", "name": "vcloud_1b2c", "state": "RUNNING"},
        {"id": "2", "name": JOB_NAME, "state": "RUNNING"},
        {"id": "3", "name": "other", "state": "PENDING"},
        {"id": "4", "name": "vcloud_9f9f", "state": "PENDING"},
    ]
    assert [j["id"] for j in leftovers(jobs, prefix="vcloud", own_job="2")] == ["1", "4"]


def test_submit_refuses_while_a_controller_is_queued_and_submits_otherwise(tmp_path, slurm, monkeypatch):
    from vcloud.runtime.controller import submit

    profile = saga_profile(tmp_path)
    monkeypatch.chdir(tmp_path)
    slurm["queue"].write_text(f"77|{JOB_NAME}|PENDING|{tmp_path}\n")
    with pytest.raises(ConfigError, match=r"a controller of .* is already in the queue: job 77 \(pending\)"):
        submit(profile=profile, workdir=tmp_path, snakemake_args=[])
    assert not [c for c in calls(slurm) if c[0] == "sbatch"]
    slurm["queue"].write_text(f"77|{JOB_NAME}|RUNNING|/elsewhere\n")  # another run's controller
    # The config files after --configfile are the run's (they replace the profile's, as in snakemake):
    # config/saga.yaml alone still has the placeholder account.
    with pytest.raises(ConfigError, match="nnXXXXk"):
        submit(profile=profile, workdir=tmp_path, snakemake_args=["--configfile", str(REPO / "config" / "saga.yaml")])
    assert not [c for c in calls(slurm) if c[0] == "sbatch"]
    args = ["--configfile", str(REPO / "config" / "saga.yaml"), "mine.yaml", "-n"]
    assert configfiles(args) == args[1:3] and configfiles(["--configfile=a.yaml", "b.yaml"]) == ["a.yaml", "b.yaml"]
    lines = submit(profile=profile, workdir=tmp_path, snakemake_args=args)
    assert "controller: job 4242 on normal for 2880 min" in lines[-1]
    assert lines[0].startswith("controller bill: 2 BU-h per hour [max(2 for CPUs, 1.00664 for GiB")  # 3.9 GiB x 0.2577
    assert "at most 96.0 BU-h per 2880 min job" in lines[0]
    (sbatch,) = [c for c in calls(slurm) if c[0] == "sbatch"]
    assert sbatch[-1] == str(tmp_path / "logs" / "controller" / "controller.sh")
    assert json.loads((tmp_path / "logs" / "controller" / "controller.json").read_text())["job"] == "4242"


def test_the_controller_cleans_up_runs_snakemake_and_stops_cleanly_at_the_warning(tmp_path, slurm):
    profile = saga_profile(tmp_path)
    here = str(tmp_path)
    slurm["queue"].write_text(
        f"11|vcloud_deadbeef|RUNNING|{here}\n"  # left by a controller that was cancelled
        f"12|vcloud_deadbeef|RUNNING|/elsewhere\n"  # someone else's run: untouched
    )
    env = {**slurm["env"], "SLURM_JOB_ID": "500"}
    command = [sys.executable, "-m", "vcloud.runtime.controller", "run", "--profile", str(profile)]
    command += ["--script", str(tmp_path / "controller.sh"), "--grace", "5", "--", "--configfile", "extra.yaml"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = Path(str(slurm["calls"]) + ".started")
    for _ in range(600):  # up to 60 s on a loaded machine
        if started.exists():
            break
        time.sleep(0.1)
    assert started.exists(), proc.stdout.read() if proc.poll() is not None else "snakemake did not start"
    # the run's own training job is running when the wall-time warning comes
    with open(slurm["queue"], "a") as queue:
        queue.write(f"21|vcloud_cafe|RUNNING|{here}\n")
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    seen = calls(slurm)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert all(c[1:4] == ["--noheader", "--user", me] for c in seen if c[0] == "squeue")  # never --user ''
    cancels = [c for c in seen if c[0] == "scancel"]
    assert cancels[0] == ["scancel", "11"]  # the dead controller's job, not the other run's
    unlock = next(c for c in seen if c[0] == "snakemake" and "--unlock" in c)
    run = next(c for c in seen if c[0] == "snakemake" and "--rerun-incomplete" in c)
    assert unlock[-2:] == run[-2:] == ["--configfile", "extra.yaml"]
    assert seen.index(unlock) < seen.index(run)
    sbatch = next(c for c in seen if c[0] == "sbatch")
    assert sbatch[1:] == ["--parsable", "--dependency=afterany:500", str(tmp_path / "controller.sh")]
    assert ["scancel", "--signal=USR1", "21"] in cancels  # latest.pt at the next step boundary
    assert seen.index(sbatch) < seen.index(["scancel", "--signal=USR1", "21"])
    assert "next controller 4242" in out
    assert json.loads((tmp_path / "logs" / "controller" / "controller.json").read_text())["job"] == "4242"


def test_a_killed_controller_takes_its_snakemake_with_it(tmp_path, slurm):
    """SIGKILL on the controller (a cancelled job's end): its snakemake must not go on as an
    orphan that keeps submitting beside the next controller (SLURM's proctrack/linuxproc loses
    re-parented children; the test SLURM showed it)."""
    profile = saga_profile(tmp_path)
    command = [sys.executable, "-m", "vcloud.runtime.controller", "run", "--profile", str(profile)]
    command += ["--script", str(tmp_path / "controller.sh"), "--grace", "5"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=slurm["env"], stdout=subprocess.DEVNULL)
    started = Path(str(slurm["calls"]) + ".started")
    for _ in range(600):
        if started.exists() and started.read_text():
            break
        time.sleep(0.1)
    child = int(started.read_text())
    assert alive(child)  # snakemake (the stand-in) runs
    proc.kill()
    proc.wait(timeout=10)
    for _ in range(100):
        if not alive(child):
            break
        time.sleep(0.05)
    survived = alive(child)
    if survived:
        os.kill(child, signal.SIGKILL)  # leave no orphan behind
    assert not survived, "the killed controller's snakemake still runs"


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its new parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

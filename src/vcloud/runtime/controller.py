"""`vcloud submit`: the snakemake controller as a SLURM job of its own, so that a run outlives
the login session (a reboot of the login node, a closed laptop, a killed tmux).

On the login node, `vcloud submit --profile profiles/<site>`:
1. refuses while a controller of this working directory is queued or running;
2. runs the rules that need the network where the network is (era5_wind: `snakemake --until`),
   since compute nodes have none;
3. writes logs/controller/controller.sh and submits it to the site's CPU partition
   (cluster.placement.cpu) with a wall-time warning to the batch shell (`--signal=B:USR1@S`).

In the job, `python -m vcloud.runtime.controller run` (the script's one command):
1. cancels what is left of an earlier controller's jobs (a controller that was cancelled or
   died leaves its rule jobs behind: jobs of this user named `<prefix>_<run id>` whose working
   directory is this one), and clears snakemake's stale lock (`snakemake --unlock`);
2. runs snakemake (`--rerun-incomplete`: a training rule resumes from its latest.pt);
3. on the warning: submits the next controller (`--dependency=afterany:<this job>`), asks the
   run's jobs to stop at their next step boundary (SIGUSR1: latest.pt, exit 3), gives them the
   grace time, then stops snakemake (SIGINT: it cancels what is still queued) and exits.
   The next controller starts when this one has ended and carries on from step 1.
A controller that is cancelled or dies takes its snakemake with it (die_with_parent); the rule
jobs it leaves in the queue are the next controller's step 1.

Local rules (the report's) then run inside the controller's job and are billed as its CPU time;
the bill of the controller itself is printed before submission. Host-side only: no torch.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from vcloud.errors import ConfigError
from vcloud.io import atomic_write_text

JOB_NAME = "vcloud-controller"
SCRIPT = Path("logs") / "controller" / "controller.sh"
STATE = Path("logs") / "controller" / "controller.json"
NETWORK_RULES = ("era5_wind",)  # rules that need the network: they run on the login node


@dataclass(frozen=True)
class ControllerJob:
    """The controller's own SLURM request, from the site (cluster.placement.cpu)."""

    partition: str
    account: str
    runtime: int  # minutes
    threads: int = 2
    mem_mb: int = 4000
    qos: str | None = None
    signal_seconds: int = 900  # the grace for every training job to write latest.pt, and more

    def sbatch_options(self, workdir: Path) -> list[str]:
        options = [
            f"--job-name={JOB_NAME}",
            f"--partition={self.partition}",
            f"--account={self.account}",
            f"--time={self.runtime}",
            f"--cpus-per-task={self.threads}",
            f"--mem={self.mem_mb}M",
            f"--signal=B:USR1@{self.signal_seconds}",
            f"--chdir={workdir}",
            f"--output={workdir / 'logs' / 'controller' / '%j.log'}",
        ]
        if self.qos:
            options.append(f"--qos={self.qos}")
        return options


def controller_job(cluster, *, runtime: int | None = None) -> ControllerJob:
    """The controller's request on this site: its CPU partition for as long as it allows (at
    most 2 days: each resubmission waits in the queue again, a shorter job starts sooner)."""
    partition = cluster.placement.get("cpu") or "small"
    part = cluster.partitions.get(partition)
    if part is None:
        raise ConfigError(f"cluster.placement.cpu: {partition!r} is not a partition of {cluster.title}")
    limit = min(part.max_runtime, 2 * 24 * 60)
    minutes = runtime or limit
    if minutes > part.max_runtime:
        raise ConfigError(f"--runtime {minutes}: above the {partition} limit of {part.max_runtime} min")
    if minutes * 60 <= 2 * cluster.signal_seconds + 600:
        raise ConfigError(f"--runtime {minutes}: too short for the controller's warning and the jobs' grace")
    return ControllerJob(partition, cluster.account, minutes, signal_seconds=max(2 * cluster.signal_seconds, 300))


def script(
    job: ControllerJob, *, workdir: Path, profile: Path, snakemake_args: list[str], image_bin: Path | None = None
) -> str:
    """The batch script: options, then the controller in Python (it handles the warning). With
    `image_bin` (a site without host installs: runtime/image_run.py), its `python` runs in the
    image, and so does everything the controller starts."""
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {option}" for option in job.sbatch_options(workdir)]
    python = sys.executable if image_bin is None else "python"
    command = [python, "-m", "vcloud.runtime.controller", "run", "--profile", str(profile)]
    command += ["--script", str(workdir / SCRIPT), "--grace", str(job.signal_seconds - 120)]
    command += ["--", *snakemake_args]
    # exec: the batch shell becomes the controller, so SIGUSR1 (B:) reaches its handler.
    lines += ["set -eu", f"cd {shlex.quote(str(workdir))}"]
    if image_bin is not None:
        lines.append(f'export PATH={shlex.quote(str(image_bin))}:"$PATH"')
    lines += ["exec " + shlex.join(command), ""]
    return "\n".join(lines)


def controller_bill(job: ControllerJob, cluster) -> str:
    """What the controller's own job costs: it holds its cores while it waits for the rules
    (the local rules run in it too)."""
    from vcloud.runtime.billing import billing
    from vcloud.runtime.cluster import RuleResources

    res = RuleResources(
        rule="controller",
        runtime=job.runtime,
        mem_mb=job.mem_mb,
        threads=job.threads,
        partition=job.partition,
        gpus=0,
        nodes=1,
        cpus_per_gpu=1,
    )
    bill = billing(res, cluster.partitions[job.partition], cluster)
    return (
        f"controller bill: {bill.per_hour:g} {bill.unit} per hour [{bill.formula}], at most "
        f"{bill.per_hour * job.runtime / 60:.1f} {bill.unit} per {job.runtime} min job, for as long as the run lasts"
    )


# --- SLURM queries ----------------------------------------------------------------------------


def _run(command: list[str], *, check: bool = True) -> str:
    proc = subprocess.run(command, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ConfigError(
            f"{command[0]}: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]} ({shlex.join(command)})"
        )
    return proc.stdout


def user_name() -> str:
    """This user's name from the password database: $USER is not set everywhere a controller
    runs (a batch job started without it, cron), and `squeue --user ''` answers nothing."""
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def queued_jobs(workdir: Path) -> list[dict]:
    """This user's queued and running jobs whose working directory is `workdir`."""
    out = _run(["squeue", "--noheader", "--user", user_name(), "--format=%i|%j|%T|%Z"])
    here = os.path.realpath(workdir)
    jobs = []
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and os.path.realpath(parts[3]) == here:
            jobs.append({"id": parts[0], "name": parts[1], "state": parts[2]})
    return jobs


def leftovers(jobs: list[dict], *, prefix: str, own_job: str | None) -> list[dict]:
    """The rule jobs an earlier controller left behind: named `<prefix>_...`, not controllers."""
    return [j for j in jobs if j["name"].startswith(prefix + "_") and j["id"] != own_job and j["name"] != JOB_NAME]


def configfiles(snakemake_args: list[str]) -> list[str]:
    """The config files named after `--configfile` in snakemake's arguments (they replace the
    profile's, as they do for snakemake), or none."""
    files: list[str] = []
    taking = False
    for word in snakemake_args:
        if word in ("--configfile", "--configfiles"):
            taking, files = True, []
        elif word.startswith(("--configfile=", "--configfiles=")):
            taking, files = True, [word.split("=", 1)[1]]
        elif word.startswith("-"):
            taking = False
        elif taking:
            files.append(word)
    return files


def record_controller(workdir: Path, sbatch_out: str, script_path: Path, *, after: str | None = None) -> str:
    """logs/controller/controller.json: the run's current controller (sbatch --parsable's job id);
    returns the id."""
    job_id = sbatch_out.strip().split(";")[0]
    state = {"job": job_id, "script": str(script_path)} | ({"after": after} if after else {})
    atomic_write_text(workdir / STATE, json.dumps(state) + "\n")
    return job_id


# --- the login-node side -----------------------------------------------------------------------


def submit(*, profile: Path, workdir: Path, snakemake_args: list[str], runtime: int | None = None) -> list[str]:
    """Check, fetch what needs the network, write the script and submit the controller."""
    from vcloud.runtime.cluster import Cluster
    from vcloud.runtime.doctor import _read_profile
    from vcloud.runtime.profile import load_workflow_config

    settings = _read_profile(profile)
    files = configfiles(snakemake_args) or settings.get("configfiles", [])
    config = load_workflow_config(*[workdir / f for f in files])
    cluster = Cluster.from_config(config)
    if cluster is None:
        raise ConfigError(f"{profile}: its configfiles have no cluster section; `vcloud submit` is for clusters")
    if problem := cluster.account_problem():
        raise ConfigError(problem)
    running = [j for j in queued_jobs(workdir) if j["name"] == JOB_NAME]
    if running:
        ids = ", ".join(f"{j['id']} ({j['state'].lower()})" for j in running)
        raise ConfigError(f"a controller of {workdir} is already in the queue: job {ids}; `scancel` it first")
    job = controller_job(cluster, runtime=runtime)
    lines = [controller_bill(job, cluster)]
    if config["data"].get("wind_table") and not config["synthetic"]["enabled"]:
        until = ["snakemake", "--profile", str(profile), "--until", *NETWORK_RULES, *snakemake_args]
        lines.append(f"network rules here, on the login node: {shlex.join(until)}")
        if subprocess.run(until).returncode != 0:
            raise ConfigError(f"{shlex.join(until)} failed: the rules that need the network did not finish")
    image_bin = None
    if not cluster.host_installs:  # the controller's python from the image (runtime/image_run.py)
        from vcloud.runtime import image_run

        image_bin = (workdir / profile / image_run.BIN).resolve()
        if not (image_bin / image_run.SCRIPT).is_file():
            raise ConfigError(f"{image_bin / image_run.SCRIPT}: missing; run `vcloud profile --site {cluster.name}`")
    text = script(job, workdir=workdir, profile=profile, snakemake_args=snakemake_args, image_bin=image_bin)
    path = workdir / SCRIPT
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    out = _run(["sbatch", "--parsable", str(path)])
    job_id = record_controller(workdir, out, path)
    lines.append(f"controller: job {job_id} on {job.partition} for {job.runtime} min, resubmitting itself ({path})")
    return lines


# --- the job side -------------------------------------------------------------------------------


def die_with_parent() -> None:
    """In the child, before snakemake starts: the kernel kills it (SIGKILL) when the controller
    dies. A cancelled controller job must not leave its snakemake running: where SLURM tracks a
    job's processes by parentage (proctrack/linuxproc, pgid), a child whose parent died first is
    re-parented and escapes the job's SIGKILL, and would go on submitting beside the next
    controller. With proctrack/cgroup SLURM kills both anyway. Linux only (prctl); elsewhere a
    no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Controller:
    """snakemake as a child process, stopped cleanly at the wall-time warning."""

    def __init__(self, *, profile: Path, script_path: Path, grace: int, snakemake_args: list[str], prefix: str):
        self.profile, self.script_path, self.grace = profile, script_path, grace
        self.args, self.prefix = snakemake_args, prefix
        self.job_id = os.environ.get("SLURM_JOB_ID")
        self.child: subprocess.Popen | None = None
        self.warned = False

    def clean_up_earlier(self, workdir: Path) -> None:
        """Cancel an earlier controller's leftover jobs; clear snakemake's stale lock."""
        left = leftovers(queued_jobs(workdir), prefix=self.prefix, own_job=self.job_id)
        if left:
            print(f"controller: cancelling {len(left)} jobs an earlier controller left: {[j['id'] for j in left]}")
            _run(["scancel", *[j["id"] for j in left]], check=False)
            self._wait_gone(workdir, {j["id"] for j in left})
        subprocess.run(["snakemake", "--profile", str(self.profile), "--unlock", *self.args], check=False)

    def _wait_gone(self, workdir: Path, ids: set[str], timeout: float = 300) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and ids & {j["id"] for j in queued_jobs(workdir)}:
            time.sleep(5)

    def on_warning(self, signum, frame) -> None:  # noqa: ARG002 - a signal handler
        self.warned = True

    def stop(self, workdir: Path) -> None:
        """Next controller first (after this one), then the run's jobs to a step boundary, then
        snakemake."""
        dependency = f"--dependency=afterany:{self.job_id}" if self.job_id else "--begin=now"
        out = _run(["sbatch", "--parsable", dependency, str(self.script_path)], check=False)
        print(f"controller: wall time ends soon; next controller {out.strip() or '(not submitted)'}", flush=True)
        if out.strip():  # where `vcloud submit` wrote the first one's: the controller of this run now
            record_controller(workdir, out, self.script_path, after=self.job_id)
        ours = leftovers(queued_jobs(workdir), prefix=self.prefix, own_job=self.job_id)
        running = [j["id"] for j in ours if j["state"] == "RUNNING"]
        if running:  # training saves latest.pt at the next step boundary and exits 3
            _run(["scancel", "--signal=USR1", *running], check=False)
            end = time.monotonic() + self.grace
            while time.monotonic() < end and set(running) & {j["id"] for j in queued_jobs(workdir)}:
                time.sleep(5)
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGINT)  # snakemake cancels what is still queued
            try:
                self.child.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.child.kill()

    def run(self, workdir: Path) -> int:
        signal.signal(signal.SIGUSR1, self.on_warning)
        self.clean_up_earlier(workdir)
        command = ["snakemake", "--profile", str(self.profile), "--rerun-incomplete", *self.args]
        print(f"controller: {shlex.join(command)}", flush=True)
        self.child = subprocess.Popen(command, preexec_fn=die_with_parent)
        while self.child.poll() is None:
            if self.warned:
                self.stop(workdir)
                return 0  # the next controller carries on
            time.sleep(1)
        return self.child.returncode


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m vcloud.runtime.controller")
    parser.add_argument("action", choices=("run",))
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--grace", type=int, default=600, help="seconds the run's jobs get to save")
    parser.add_argument("--prefix", default="vcloud", help="the profile's slurm-jobname-prefix")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: snakemake's own arguments
    args = parser.parse_args(argv[:cut])
    args.snakemake_args = argv[cut + 1 :]
    controller = Controller(
        profile=args.profile,
        script_path=args.script,
        grace=args.grace,
        snakemake_args=args.snakemake_args,
        prefix=args.prefix,
    )
    return controller.run(Path.cwd())


if __name__ == "__main__":
    sys.exit(main())

"""The test SLURM shaped like each site (tests/slurm/cluster-up.sh --variant): every job of every
shipped site's run is one that its site's SLURM takes, as the executor plugin submits it.

* sigma2 (Saga, Betzy, Olivia): select/cons_tres, typed GPUs, Saga's billing weights with
  PriorityFlags=MAX_TRES, the devel QOS enforced;
* gres-only (Eagle): select/cons_res, so --gpus and --cpus-per-gpu are refused and GPUs are asked
  for as --gres=gpu:h100:N only;
* lumi: LUMI's partitions on a LUMI-sized node (LUMI's rounded slices stay a unit test).

The variants run as a second cluster, "vcloud-site", beside the default one (own slurmctld and
slurmd, the same slurmdbd): the other slurm tests and their jobs never see a switch, and this
module needs no worker of theirs. Each variant's node is declared bigger than the machine, so a
site's real requests are evaluated (`sbatch --test-only`, which SLURM answers without queueing)
and small jobs run (nothing is enforced). The tests of one variant sit together in this file: a
switch restarts the site cluster's slurmctld and slurmd (~8 s).
"""

from __future__ import annotations

import dataclasses
import fcntl
import math
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.slurm.sbatch_lines import REPO, SiteJob, job_of, site_config, site_jobs, step_script
from tests.system import unavailable
from vcloud.runtime.billing import billing
from vcloud.runtime.cluster import Cluster, RuleResources
from vcloud.runtime.site import load_site, site_names
from vcloud.runtime.site_checks import check_qos

pytestmark = [pytest.mark.slurm]
SCRIPT = REPO / "tests" / "slurm" / "cluster-up.sh"
SITE_CONF = "/etc/slurm-site/slurm.conf"  # the site cluster's clients (cluster-up.sh --variant)
# Held by this module while it uses the site cluster: two test sessions on one machine take turns
# instead of switching its variant under each other's feet.
SITE_LOCK = Path("/run/lock/vcloud-site-variants.lock")
SIGMA2_SITES = ("saga", "betzy", "olivia")
# What this SLURM (Debian 12's slurm-wlm 22.05) answers a job that asks for GPUs the cons_tres way
# on select/cons_res; --gpus-per-node passes (sbatch stores it as a per-node GRES), and job steps
# inside an allocation take every form.
NO_CONS_TRES = "Requested GRES option unsupported by configured SelectType plugin"
OVER_QOS_WALL = "QOSMaxWallDurationPerJobLimit"
OVER_PARTITION = "Requested time limit is invalid (missing or exceeds some limit)"


def site_env() -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": SITE_CONF}


def slurm(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    """A SLURM command against the site cluster."""
    return subprocess.run(argv, capture_output=True, text=True, env=site_env(), timeout=60, **kwargs)


class Variants:
    """Brings a variant up when a test needs another one than the one this module last used (the
    first use checks the site cluster: ~0.5 s when a former run left that variant up)."""

    def __init__(self):
        self.current = None
        self.seconds: dict[str, float] = {}

    def use(self, variant: str) -> None:
        if variant != self.current:
            self.seconds[variant] = up(variant)
            self.current = variant


def up(variant: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run(["bash", str(SCRIPT), "--variant", variant], capture_output=True, text=True, timeout=600)
    lines = (proc.stdout + proc.stderr).strip().splitlines() or ["(no output)"]
    if proc.returncode == 77:
        unavailable(f"no SLURM here: {lines[-1]}")
    assert proc.returncode == 0, "\n".join(lines[-30:])
    return time.perf_counter() - started


@pytest.fixture(scope="module")
def variants():
    """The site cluster, this session's alone while the module runs; it stays up after the module,
    as the default cluster does."""
    SITE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with SITE_LOCK.open("w") as lock:
        deadline = time.monotonic() + 900
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, f"another test session held {SITE_LOCK} for 15 min"
                time.sleep(1)
        switch = Variants()
        yield switch
    print("cluster-up.sh --variant, seconds:", {k: round(v, 1) for k, v in switch.seconds.items()})


def sbatch(
    argv, *, test_only: bool = False, script: str = "#!/bin/sh\ntrue\n", hold: bool = False
) -> subprocess.CompletedProcess:
    extra = ["--test-only"] * test_only + ["--hold"] * hold
    return slurm(*argv, *extra, input=script)


def job_id(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def show_job(job: str) -> dict[str, str]:
    out = slurm("scontrol", "show", "job", "-o", job, check=True).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def wait_for(jobs: list[str], states: tuple[str, ...], *, seconds: float = 60) -> dict[str, dict[str, str]]:
    deadline = time.monotonic() + seconds
    while True:
        shown = {job: show_job(job) for job in jobs}
        if all(info["JobState"] in states for info in shown.values()) or time.monotonic() > deadline:
            return shown
        time.sleep(0.3)


def cancel(jobs: list[str]) -> None:
    if jobs:
        slurm("scancel", *jobs)


def passes_test_only(job: SiteJob) -> None:
    """SLURM takes the job at its site's partition, holding the cores vcloud bills for."""
    proc = sbatch(job.sbatch, test_only=True)
    where = f"{job.site} {job.rule}: {' '.join(job.sbatch)}"
    assert proc.returncode == 0, f"{where}\n{proc.stderr}"
    assert f"using {job.res.cores} processors on nodes" in proc.stderr, f"{where}\n{proc.stderr}"
    assert proc.stderr.rstrip().endswith(f"in partition {job.res.partition}"), f"{where}\n{proc.stderr}"


def run_steps(jobs: list[SiteJob], tmp_path: Path) -> None:
    """Each GPU rule's own job step (launch_prefix's srun, a probe instead of the container) runs
    inside the allocation its sbatch line gets, as the jobstep plugin runs the rule's shell; one CPU
    more than vcloud asked for is refused: the allocation holds exactly the cores it bills."""
    shapes = {}
    for job in jobs:  # one per distinct request: the train and evaluate rules share theirs
        if job.step is not None:
            shape = dataclasses.replace(job.res, rule="", runtime=0, epoch_minutes=None)
            shapes.setdefault((job.site, job.step, shape), job)
    assert shapes, "no GPU rule"
    submitted = {}
    for job in shapes.values():
        cores = job.res.gpus * job.res.cpus_per_gpu
        assert f"--cpus-per-task={cores}" in job.step, job.step
        over = job.step.replace(f"--cpus-per-task={cores}", f"--cpus-per-task={cores + 1}")
        probe = "bash -c 'echo step gpus=${CUDA_VISIBLE_DEVICES-unset} cpus=$SLURM_CPUS_PER_TASK'"
        script = step_script(job.step, probe) + f"{over} true || echo over-refused\n"
        out = tmp_path / f"{job.site}-{job.rule}.out"
        argv = [*job.sbatch]
        argv[argv.index("--output") + 1] = str(out)
        submitted[job_id(sbatch(argv, script=script))] = (job, out, cores)
    try:
        ended = wait_for(list(submitted), ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"))
    finally:
        cancel(list(submitted))
    for jid, (job, out, cores) in submitted.items():
        log = out.read_text() if out.exists() else "(no output)"
        where = f"{job.site} {job.rule} (job {jid}, {ended[jid]['JobState']}): {job.step}\n{log}"
        assert ended[jid]["JobState"] == "COMPLETED", where
        seen = re.search(r"^step gpus=(\S+) cpus=(\d+)$", log, re.MULTILINE)
        assert seen, where
        assert len(seen[1].split(",")) == job.res.gpus and int(seen[2]) == cores, where
        assert "More processors requested than permitted" in log and "over-refused" in log, where


def scontrol_partition(name: str) -> dict[str, str]:
    out = slurm("scontrol", "show", "partition", "-o", name, check=True).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def minutes(limit: str) -> int:
    days, _, clock = limit.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return int(days or 0) * 24 * 60 + h * 60 + m


# --- sigma2: Saga, Betzy, Olivia -------------------------------------------------------------


def test_sigma2_partitions_carry_the_site_files_limits_and_billing_weights(variants):
    variants.use("sigma2")
    for site in SIGMA2_SITES:
        for name, part in load_site(site, REPO)["partitions"].items():
            shown = scontrol_partition(name)
            # never longer than the site's: a job passing here passes there
            assert minutes(shown["MaxTime"]) <= part["max_runtime"], (site, name, shown["MaxTime"])
    for site, names in (("saga", ("normal", "a100", "accel")), ("betzy", ("preproc",))):
        for name in names:
            weights = load_site(site, REPO)["partitions"][name]["billing_weights"]
            shown = dict(w.split("=") for w in scontrol_partition(name)["TRESBillingWeights"].split(","))
            assert float(shown["CPU"]) == weights["cpu"], (site, name, shown)
            assert float(shown["Mem"].removesuffix("G")) == weights["mem_gib"], (site, name, shown)
            assert float(shown.get("GRES/gpu", 0)) == weights["gpu"], (site, name, shown)


@pytest.mark.parametrize("site", SIGMA2_SITES)
def test_every_job_of_a_sigma2_site_passes_sbatch_test_only(variants, site, tmp_path):
    variants.use("sigma2")
    jobs = site_jobs(site, workdir=tmp_path)
    assert any(job.res.gpus for job in jobs)
    for job in jobs:
        passes_test_only(job)
    # --test-only does check the partition's limits (EnforcePartLimits=ALL, as on the sites)
    longest = max(jobs, key=lambda job: job.res.runtime)
    over = dataclasses.replace(longest.res, runtime=longest.cluster.partitions[longest.res.partition].max_runtime + 1)
    refused = sbatch(job_of(over, longest.cluster, workdir=tmp_path).sbatch, test_only=True)
    assert refused.returncode == 1 and OVER_PARTITION in refused.stderr, refused.stderr


def test_gpu_steps_of_the_sigma2_sites_run_inside_their_allocations(variants, tmp_path):
    variants.use("sigma2")
    run_steps([job for site in SIGMA2_SITES for job in site_jobs(site, workdir=tmp_path)], tmp_path)


def rehearsal_job(runtime: int, tmp_path: Path) -> tuple[RuleResources, Cluster, SiteJob]:
    """Saga's rehearsal request: its GPU rule on the rehearsal partition under the devel QOS."""
    config = site_config("saga")
    cluster = Cluster.from_config(config)
    res = RuleResources.from_config(config, "train_stage1")
    res = dataclasses.replace(
        res, partition=cluster.placement["rehearsal"], qos=cluster.placement["rehearsal_qos"], runtime=runtime
    )
    return res, cluster, job_of(res, cluster, workdir=tmp_path)


def test_the_devel_qos_refuses_a_3_hour_job_and_takes_a_1_hour_one_as_vcloud_doctor_says(variants, tmp_path):
    variants.use("sigma2")
    res, cluster, job = rehearsal_job(180, tmp_path)
    assert "--qos=devel" in job.sbatch
    assert check_qos(res, cluster, "resources.train_stage1")  # the doctor refuses it too
    for test_only in (True, False):
        refused = sbatch(job.sbatch, test_only=test_only, hold=not test_only)
        assert refused.returncode == 1 and OVER_QOS_WALL in refused.stderr, refused.stderr
    res, cluster, job = rehearsal_job(60, tmp_path)
    assert not check_qos(res, cluster, "resources.train_stage1")
    passes_test_only(job)
    held = job_id(sbatch(job.sbatch, hold=True))
    try:
        assert show_job(held)["QOS"] == "devel"
    finally:
        cancel([held])


def test_the_devel_qos_runs_two_jobs_of_a_user_at_once(variants, tmp_path):
    variants.use("sigma2")
    res, cluster, job = rehearsal_job(60, tmp_path)
    assert cluster.qos["devel"]["max_running"] == 2
    jobs = [job_id(sbatch(job.sbatch, script="#!/bin/sh\nsleep 120\n")) for _ in range(3)]
    try:
        deadline = time.monotonic() + 60
        wanted = [("PENDING", "QOSMaxJobsPerUserLimit"), ("RUNNING", "None"), ("RUNNING", "None")]
        while True:  # the waiting one's reason is set when the scheduler next looks at it
            seen = sorted((info["JobState"], info["Reason"]) for info in map(show_job, jobs))
            if seen == wanted or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert seen == wanted, seen
    finally:
        cancel(jobs)


def test_vcloud_weighted_max_bill_is_slurm_billing_on_saga(variants, tmp_path):
    """SLURM's billing TRES (TRESBillingWeights, PriorityFlags=MAX_TRES) of running jobs equals
    vcloud's weighted_max bill per hour. The jobs run: a pending job's TRES count its tasks' CPUs,
    not --cpus-per-gpu (1 GPU + 16 CPUs on a100 shows billing=8 until it starts, 16 after)."""
    variants.use("sigma2")
    config = site_config("saga")
    cluster = Cluster.from_config(config)
    gpu = RuleResources.from_config(config, "train_stage1")  # a100, 1 GPU, 6 CPUs, 60000 MB
    cpu = RuleResources.from_config(config, "prepare_roi")  # normal, 8 CPUs, 16384 MB
    shapes = {
        "1 GPU, 6 CPUs, 60000 MB on a100": (gpu, 8),
        "the same on accel": (gpu.with_overrides({"slurm_partition": "accel"}), 6),
        "1 GPU, 16 CPUs on a100": (gpu.with_overrides({"cpus_per_gpu": 16}), 16),
        "1 GPU, 384000 MB on a100": (gpu.with_overrides({"mem_mb": 384000}), 12),
        "2 CPUs, 256000 MB on a100": (cpu.with_overrides({"slurm_partition": "a100", "mem_mb": 256000}, threads=2), 8),
        "8 CPUs, 16384 MB on normal": (cpu, 8),
        # not a whole number: SLURM truncates (1 CPU, 8 GiB x 0.2577 = 2.06 -> 2)
        "index_archive on normal": (RuleResources.from_config(config, "index_archive"), 2.0616),
    }
    jobs = {}
    try:
        for name, (res, _) in shapes.items():
            jobs[name] = job_id(sbatch(job_of(res, cluster, workdir=tmp_path).sbatch, script="#!/bin/sh\nsleep 120\n"))
        shown = wait_for(list(jobs.values()), ("RUNNING",))
    finally:
        cancel(list(jobs.values()))
    for name, (res, expected) in shapes.items():
        info = shown[jobs[name]]
        assert info["JobState"] == "RUNNING", (name, info)
        tres = dict(item.split("=") for item in info["TRES"].split(","))
        bill = billing(res, cluster.partitions[res.partition], cluster).per_hour
        assert bill == expected, (name, bill)
        assert int(tres["billing"]) == math.floor(bill), (name, info["TRES"], bill)


# --- gres-only: Eagle ------------------------------------------------------------------------


def test_every_job_of_eagle_passes_sbatch_test_only_with_typed_gres(variants, tmp_path):
    variants.use("gres-only")
    jobs = site_jobs("eagle", workdir=tmp_path)
    gpu_jobs = [job for job in jobs if job.res.gpus]
    assert gpu_jobs and all("--gres=gpu:h100:1" in job.sbatch for job in gpu_jobs)
    for job in jobs:
        passes_test_only(job)


def test_a_site_without_cons_tres_refuses_the_gpus_form_and_takes_the_gres_form(variants, tmp_path):
    variants.use("gres-only")
    config = site_config("eagle")
    cluster = Cluster.from_config(config)
    res = RuleResources.from_config(config, "train_stage1")
    passes_test_only(job_of(res, cluster, workdir=tmp_path))
    # What vcloud would send with gpu_request: gpus (--gpus=1 --cpus-per-gpu=8)
    as_gpus = job_of(res, dataclasses.replace(cluster, gpu_request="gpus"), workdir=tmp_path)
    assert "--gpus=1" in as_gpus.sbatch and "--cpus-per-gpu=8" in as_gpus.sbatch
    for test_only in (True, False):
        refused = sbatch(as_gpus.sbatch, test_only=test_only, hold=not test_only)
        assert refused.returncode == 1 and NO_CONS_TRES in refused.stderr, refused.stderr
    # each cons_tres option alone is refused as well
    gres = [arg for arg in job_of(res, cluster, workdir=tmp_path).sbatch if not arg.startswith("--gres")]
    for option in ("--gpus=1", "--gpus=h100:1", "--gres=gpu:h100:1 --cpus-per-gpu=8"):
        refused = sbatch([*gres, *option.split()], test_only=True)
        assert refused.returncode == 1 and NO_CONS_TRES in refused.stderr, (option, refused.stderr)


def test_the_gpu_step_of_eagle_runs_inside_its_allocation(variants, tmp_path):
    variants.use("gres-only")
    run_steps(site_jobs("eagle", workdir=tmp_path), tmp_path)


# --- lumi ------------------------------------------------------------------------------------


def test_every_job_of_lumi_passes_sbatch_test_only(variants, tmp_path):
    variants.use("lumi")
    jobs = site_jobs("lumi", workdir=tmp_path)
    for job in jobs:
        passes_test_only(job)


def test_the_gpu_step_of_lumi_runs_inside_its_allocation(variants, tmp_path):
    variants.use("lumi")
    run_steps(site_jobs("lumi", workdir=tmp_path), tmp_path)


def test_every_shipped_site_is_tested_on_a_variant():
    """A new site file needs its variant (cluster-up.sh) and its tests here."""
    assert set(site_names(REPO)) == {*SIGMA2_SITES, "eagle", "lumi"}

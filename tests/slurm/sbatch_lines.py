"""The sbatch line that the SLURM executor plugin submits for each rule of a site's run, and the
job step that a self-launched rule starts inside its allocation: what tests/slurm/test_site_variants.py
hands to the site variants of the test cluster (tests/slurm/cluster-up.sh --variant).

The sbatch options come from the installed plugin's own functions (submit_string.get_submit_command,
utils.set_gres_string, apply_mem_fudge for array jobs), fed with what vcloud gives a rule:
workflow/rules/cluster.smk's resources (vcloud.runtime.slurm.slurm_resources), threads and the
site profile's executor settings (profiles/<site>/config.yaml: slurm-requeue, slurm-array-jobs).
So a change of the plugin's flags shows here as it would on the site. The step line is
launch_prefix's srun, its container command replaced by a probe, run in the environment the
jobstep plugin gives a rule's shell (SLURM_* stripped but the job's identity).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import yaml

from vcloud.runtime.cluster import Cluster, RuleResources
from vcloud.runtime.profile import load_workflow_config
from vcloud.runtime.site import load_site
from vcloud.runtime.slurm import launch_prefix, self_launched, slurm_resources

REPO = Path(__file__).resolve().parents[2]

# What the jobstep plugin (snakemake-executor-plugin-slurm-jobstep, run_job) keeps of SLURM_* for
# a rule's shell; it drops every other SLURM_*, SRUN_* and SBATCH_* variable.
JOBSTEP_KEEPS = (
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX",
    "SLURM_ARRAY_TASK_STEP",
    "SLURM_CLUSTER_NAME",
    "SLURM_SUBMIT_DIR",
    "SLURM_SUBMIT_HOST",
)


class _Resources(dict):
    """snakemake's job.resources as the plugin reads it: .get() and attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class _PluginJob:
    name: str
    resources: _Resources
    threads: int

    def is_group(self) -> bool:
        return False


@dataclass(frozen=True)
class SiteJob:
    """One rule's SLURM job on one site."""

    site: str
    rule: str
    res: RuleResources
    cluster: Cluster
    sbatch: tuple[str, ...]  # sbatch and its options, without the script

    @property
    def step(self) -> str | None:
        """The rule's own job step (launch_prefix) up to the container command, or None."""
        if not self_launched(self.res, self.cluster):
            return None
        line = launch_prefix(self.res, self.cluster)
        return line[: line.index(f" {self.cluster.runner} exec")]


def site_config(site: str, account: str | None = None) -> dict:
    """config/<site>.yaml with the site's example account (tests/unit/test_sites.py does the same)."""
    config = load_workflow_config(REPO / "config" / f"{site}.yaml")
    config["cluster"]["account"] = account or load_site(site, REPO)["account_example"]
    return config


def profile_settings(site: str) -> tuple[SimpleNamespace, set[str]]:
    """The executor settings of the site's profile that change the sbatch line, and the rules it
    submits as array jobs: the profile `vcloud profile --site <site>` writes, rendered here (only
    LUMI's is in git; the others are written by their users, with their account)."""
    from vcloud.runtime.profile import render, supports_array_jobs

    cluster = Cluster.from_config(site_config(site))
    profile = yaml.safe_load(render(cluster, source=f"config/{site}.yaml", array_jobs=supports_array_jobs()))
    settings = SimpleNamespace(
        requeue=bool(profile.get("slurm-requeue")),
        no_requeue=bool(profile.get("slurm-no-requeue")),
        qos=profile.get("slurm-qos"),
        reservation=profile.get("slurm-reservation"),
    )
    arrays = {rule.strip() for rule in str(profile.get("slurm-array-jobs") or "").split(",") if rule.strip()}
    return settings, arrays


def sbatch_line(
    rule: str,
    resources: dict,
    threads: int,
    *,
    settings: SimpleNamespace | None = None,
    array: bool = False,
    workdir: Path | str = "/tmp",
) -> tuple[str, ...]:
    """sbatch and the options the plugin gives a job with these resources (what run_job and,
    for `array`, run_array_jobs build), the script left out."""
    from snakemake_executor_plugin_slurm.submit_string import apply_mem_fudge, get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    job = _PluginJob(rule, _Resources(resources), threads)
    validate_slurm_extra(job)
    params = {
        "run_uuid": f"vcloud-{rule}",
        "slurm_logfile": f"{workdir}/%j.log",
        "comment_str": f"rule_{rule}",
        "account": f" -A {shlex.quote(str(resources['slurm_account']))}",
        "partition": f" -p {shlex.quote(str(resources['slurm_partition']))}",
        "workdir": str(workdir),
    }
    call = get_submit_command(job, params, settings=settings) + set_gres_string(job)
    if array:  # two tasks; the memory fudge for the payload of the tasks after the first
        call = apply_mem_fudge(call, "") + " --array=1-2"
    return tuple(shlex.split(call))


def site_jobs(site: str, *, workdir: Path | str = "/tmp", account: str | None = None) -> list[SiteJob]:
    """Every rule of config/<site>.yaml as the site would get it: resources placed as
    workflow/rules/cluster.smk places them, the plugin's sbatch line with the profile's settings."""
    config = site_config(site, account)
    cluster = Cluster.from_config(config)
    settings, arrays = profile_settings(site)
    jobs = []
    for rule in config["resources"]:
        res = cluster.place(RuleResources.from_config(config, rule), {})
        line = sbatch_line(
            rule,
            slurm_resources(res, cluster),
            res.threads,
            settings=settings,
            array=rule in arrays,
            workdir=workdir,
        )
        jobs.append(SiteJob(site, rule, res, cluster, line))
    return jobs


def job_of(res: RuleResources, cluster: Cluster, *, workdir: Path | str = "/tmp") -> SiteJob:
    """The job of one rule's resources (e.g. changed with with_overrides) without a profile."""
    line = sbatch_line(res.rule, slurm_resources(res, cluster), res.threads, workdir=workdir)
    return SiteJob(cluster.name, res.rule, res, cluster, line)


def step_script(step: str, probe: str) -> str:
    """A batch script that runs `step` + `probe` as a rule's shell runs it under the jobstep
    plugin: every SLURM_*, SRUN_* and SBATCH_* variable dropped but JOBSTEP_KEEPS, and SLURM_CONF,
    which points the test's second cluster's clients at it (a site's srun reads its default
    slurm.conf)."""
    keep = "|".join((*JOBSTEP_KEEPS, "SLURM_CONF"))
    return (
        "#!/bin/bash\n"
        "for v in $(compgen -e); do\n"
        f'    case $v in {keep}) ;; SLURM_* | SRUN_* | SBATCH_*) unset "$v" ;; esac\n'
        "done\n"
        f"{step} {probe}\n"
    )

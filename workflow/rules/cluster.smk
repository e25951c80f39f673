# SLURM and container wiring of every rule (resources, threads, image, launch prefix, retries)
# and the pre-flight checks of a cluster run; the logic is in vcloud.runtime (lumi, doctor)
# and vcloud.workflow. Resource entries are named like their rules.

import os

from vcloud import workflow as logic
from vcloud.errors import ConfigError
from vcloud.runtime.bill import rule_retries
from vcloud.runtime.cluster import Cluster, RuleResources
from vcloud.runtime.slurm import launch_prefix, slurm_resources, uses_container


def get_resources_json():
    """Each rule's resources as its jobs get them (--set-resources applied) and what LUMI
    bills for them per hour, as one JSON string for `vcloud accounting --resources`."""
    return logic.resources_json(get_resource_rules(), get_rule_resources, CLUSTER)


CLUSTER = Cluster.from_config(config)  # None: local run (no cluster section)
if CLUSTER is not None:
    # The local rules (era5_wind, the report rules) run `apptainer exec` where snakemake runs,
    # and snakemake applies the profile's precommand to remote jobs only: the same variables
    # (PATH of the squashfs environment, containlibs) go into this process's environment,
    # which local jobs inherit (remote jobs get them from the precommand as well).
    os.environ.update(CLUSTER.container_env())


def get_resources(rule_name):
    return config["resources"][rule_name]


def get_resource_rules():
    """Every rule with a resources entry (the entry's key is the rule's name)."""
    return list(config["resources"])


def get_resource_overrides(rule_name):
    """`--set-resources RULE:NAME=VALUE` of this rule (jobs receive the same arguments)."""
    found = workflow.resource_settings.overwrite_resources.get(rule_name) or {}
    return {name: getattr(value, "raw", value) for name, value in dict(found).items()}


def get_thread_override(rule_name):
    found = workflow.resource_settings.overwrite_threads.get(rule_name)
    return None if found is None else int(getattr(found, "raw", found))


def get_rule_resources(rule_name):
    """The rule's resources entry after --set-resources/--set-threads: the launch line, the
    doctor and the accounting all follow what the job is actually given."""
    res = RuleResources.from_config(config, rule_name)
    overrides = get_resource_overrides(rule_name)
    try:
        res = res.with_overrides(overrides, threads=get_thread_override(rule_name))
    except ConfigError as err:
        raise WorkflowError(str(err)) from None
    return res if CLUSTER is None else CLUSTER.place(res, overrides)


def get_threads(rule_name):
    return get_rule_resources(rule_name).threads


def get_slurm_resources(rule_name):
    """runtime and mem_mb; on a cluster also partition, account, GPUs, CPUs, nodes, and for
    GPU rules the wall-time warning (slurm_extra) and their own job step (mpi)."""
    return slurm_resources(get_rule_resources(rule_name), CLUSTER)


def get_container(rule_name):
    """The cluster's image, except for self-launched rules (they srun into it themselves)."""
    if uses_container(get_rule_resources(rule_name), CLUSTER):
        return CLUSTER.image
    return None


def get_launch_prefix(rule_name):
    """srun + singularity exec on a cluster (+ torchrun for several GCDs on one node)."""
    return launch_prefix(get_rule_resources(rule_name), CLUSTER)


def get_epoch_minutes():
    """Measured minutes per epoch of the stages that logged epochs already."""
    from vcloud.runtime.doctor import measured_epoch_minutes

    return measured_epoch_minutes(config)


EPOCH_MINUTES = get_epoch_minutes() if CLUSTER is not None else {}


def get_retries(rule_name):
    """On a cluster, resubmissions of a GPU job: enough jobs for the stage's epochs at the
    measured (else configured) epoch time, plus cluster.spare_retries. None elsewhere (the
    global --retries applies)."""
    if CLUSTER is None:
        return None
    if not workflow.is_main_process:
        # Inside the SLURM job: a rule's own retries would rerun the command in the same
        # allocation after the warning (measured: a second step, killed at the time limit).
        # Snakemake >= 9.14.1 does this for --retries; the rule directive needs it here.
        return 0
    try:  # the numbers the doctor's bill uses for the worst case; a grid's: the most epochs'
        return rule_retries(
            rule_name,
            get_rule_resources(rule_name),
            CLUSTER,
            [run.model_set for run in RUNS],
            EPOCH_MINUTES,
        )
    except ConfigError as err:
        raise WorkflowError(f"resources.{rule_name}: {err}") from None


def get_runtime_env_flags():
    return " ".join(
        f"--env {shlex.quote(f'{name}={value}')}"
        for name, value in config["runtime_env"].items()
    )


def get_precommand():
    """The profile's precommand; None while unknown (remote settings come after parsing)."""
    remote = workflow.remote_execution_settings
    return None if remote is None else (remote.precommand or "")


def get_cluster_report():
    """vcloud doctor's checks, with this run's own apptainer args and rule inputs."""
    from vcloud.runtime.doctor import preflight

    settings = workflow.deployment_settings
    inputs = {
        name: set(getattr(rules, name).input.keys()) for name in logic.train_rules()
    }
    found = preflight(
        config,
        MODEL_SET,
        apptainer_args=settings.apptainer_args,
        precommand=get_precommand(),
        train_inputs=inputs,
        memory=False,
        overrides={name: get_resource_overrides(name) for name in get_resource_rules()},
        epoch_minutes=EPOCH_MINUTES,
        cwd=Path.cwd(),
        repo=Path(VCLOUD_ROOT),
    )
    found.errors.extend(logic.deployment_problems(settings.deployment_method, CLUSTER))
    return found


def warn_cluster_problems():
    """At parse time (dry runs too): every failed check as a warning."""
    if CLUSTER is None or not workflow.is_main_process:
        return
    for line in get_cluster_report().errors:
        logger.warning(f"vcloud doctor: {line}")


def check_cluster():
    """At workflow start (onstart: real runs only): stop before anything is submitted."""
    if CLUSTER is None:
        return
    found = get_cluster_report()
    logger.info("\n".join(found.lines))
    if found.errors:
        raise WorkflowError(
            "vcloud doctor: "
            + "\nvcloud doctor: ".join(found.errors)
            + "\n(nothing was submitted)"
        )

"""SLURM requests and launch lines: a rule's resources on a cluster turned into the SLURM
executor plugin's resources, the wall-time warning and the command that starts its processes.

Host-side only (it runs where snakemake parses the Snakefile, on a login node): no torch,
no numpy. The bind list and the GPU-affine CPU masks come from the site's file
(config/sites/<site>.yaml, through vcloud.runtime.cluster.Cluster), and everything else (the
generated profile, the rule resources, the multi-node srun line, `vcloud doctor`) is derived
from it.

Launch paths, chosen by a rule's resources (`gpus` per node, `nodes`):
- no cluster section (laptop): the command as is, or `torchrun --standalone` for gpus > 1.
- a CPU rule on the cluster: snakemake's SLURM jobstep runs it with `srun -n1` and wraps it
  in `apptainer exec <binds> <image>` (the profile's apptainer-args).
- a GPU or multi-node rule on the cluster launches itself: it has an `mpi` resource and no
  container directive, so its shell runs in the batch step on the host and starts its own
  job step, `srun <geometry> singularity exec <binds> <image> ...`:
  - one node, one GCD: one task running the command;
  - one node, G GCDs: one task running `torchrun --standalone --nproc-per-node=G` once;
  - N nodes: one task per GCD (explicit geometry; the site's GPU-affine CPU masks where its
    file lists them, else SLURM places each task's cores), rank 0's host
    from SLURM tools (absent from the container) as SINGULARITYENV_MASTER_ADDR, ranks from
    SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (vcloud.train.distributed).
  Why its own step: SLURM's warning before the time limit (`--signal=USR1@S`, no `B:`) goes
  to every process of every job step but the batch step. Under the jobstep's `srun -n1`
  the step also holds snakemake itself, which USR1 kills (measured on the test cluster: step
  CANCELLED by signal 10 while the trainer was still writing); with its own step only the
  trainer's processes get the warning and snakemake waits in the batch step.
"""

from __future__ import annotations

import shlex

from vcloud.errors import ConfigError
from vcloud.runtime.cluster import Cluster, RuleResources


def signal_option(seconds: int) -> str:
    """sbatch option for SIGUSR1 `seconds` before the time limit, to every job step (no `B:`:
    the batch shell is snakemake's jobstep, the trainer runs in the rule's own step)."""
    return f"--signal=USR1@{seconds}"


def per_gcd_tasks(res: RuleResources, cluster: Cluster | None) -> bool:
    """One task per GCD (with the site's CPU masks, where it has them): several nodes, or a whole
    node of a whole-node partition (LUMI binds CPUs only on full-node allocations)."""
    if cluster is None or not res.gpus:
        return False
    part = cluster.partitions.get(res.partition)
    return res.multinode or (part is not None and part.full_nodes and res.gpus > 1)


def self_launched(res: RuleResources, cluster: Cluster | None) -> bool:
    """GPU and multi-node rules on a cluster start their own job step (see the module doc)."""
    return cluster is not None and (res.gpus > 0 or res.multinode)


def slurm_resources(res: RuleResources, cluster: Cluster | None) -> dict:
    """Keyword arguments for a rule's `resources:` (SLURM executor plugin names).

    Local runs ignore the slurm_* names; the account comes from the cluster section (without
    one, the plugin takes the user's default account). Never tasks_per_gpu or tasks on a GPU
    job: plugins before 2.7.1 turned that into --ntasks-per-gpu, one torchrun per GCD.
    """
    out: dict = {"runtime": res.runtime, "mem_mb": res.mem_mb, "slurm_partition": res.partition}
    if cluster is not None:
        out["slurm_account"] = cluster.account
    gres = cluster is not None and cluster.gpu_request == "gres"
    if res.gpus and gres:
        # --gres=gpu[:type]:N per node and plain CPUs: what a site without select/cons_tres
        # takes (--gpus and --cpus-per-gpu need it). The self-launched step needs >= 2 tasks
        # per node (below): one core each, so the job holds exactly gpus x cpus_per_gpu cores.
        out["gres"] = gres_string(res, cluster)
        out["cpus_per_task"] = 1
    elif res.gpus:
        out["gpu"] = res.gpus * res.nodes  # --gpus=N in total
        out["cpus_per_gpu"] = res.cpus_per_gpu
    else:
        out["cpus_per_task"] = res.threads
    if res.qos:
        out["qos"] = res.qos
    if res.multinode:
        out["nodes"] = res.nodes
    if self_launched(res, cluster):
        # The rule's shell runs in the batch step and calls srun itself (launch_prefix). The
        # plugin wants more than one task per node for an mpi job; one-task launches use
        # fewer tasks than the allocation allows, which SLURM permits.
        out["mpi"] = "srun"
        cores = res.gpus * res.cpus_per_gpu if res.gpus else res.threads
        out["tasks_per_node"] = max(cores if gres and res.gpus else _tasks_per_node(res, cluster), 2)
        out["slurm_extra"] = signal_option(cluster.signal_seconds)
    if cluster is not None:
        part = cluster.partitions.get(res.partition)
        if part is not None and part.max_running:
            out[part.job_resource] = 1
    return out


def _tasks_per_node(res: RuleResources, cluster: Cluster | None, tasks_per_node: int | None = None) -> int:
    if tasks_per_node:
        return tasks_per_node
    return res.gpus if per_gcd_tasks(res, cluster) else 1


def gres_string(res: RuleResources, cluster: Cluster) -> str:
    """gpu:N or gpu:<type>:N (GPUs per node) for --gres, typed where the site's partition is."""
    gpu = cluster.gpu_of(res.partition)
    kind = f"gpu:{gpu.gres_type}" if gpu is not None and gpu.gres_type else "gpu"
    return f"{kind}:{res.gpus}"


def gpu_option(res: RuleResources, cluster: Cluster) -> str:
    """The self-launched step's GPU request, in the form the site takes."""
    if cluster.gpu_request == "gres":
        return f"--gres={gres_string(res, cluster)}"
    return f"--gpus-per-node={res.gpus}"


def uses_container(res: RuleResources, cluster: Cluster | None) -> bool:
    """Snakemake wraps the rule in apptainer, except self-launched rules (they srun into it)."""
    return cluster is not None and not self_launched(res, cluster)


def torchrun(gpus: int) -> str:
    return f"torchrun --standalone --nnodes=1 --nproc-per-node={gpus} --no-python"


def launch_prefix(res: RuleResources, cluster: Cluster | None) -> str:
    """What goes before a rule's `vcloud ...` command to start one process per GPU."""
    if cluster is None:
        if res.multinode:
            raise ConfigError(
                f"resources.{res.rule}.nodes: {res.nodes} nodes need a cluster section (config/<site>.yaml)"
            )
        return torchrun(res.gpus) if res.gpus > 1 else ""
    if not self_launched(res, cluster):
        return ""
    return step_prefix(res, cluster)


def step_prefix(res: RuleResources, cluster: Cluster, *, tasks_per_node: int | None = None) -> str:
    """srun + singularity exec of a self-launched rule, run by the batch step on the host.

    The SLURM jobstep strips SLURM_* (but SLURM_JOB_ID) before it runs this line, so the
    node list comes from squeue, not $SLURM_NODELIST; every count is explicit for the same
    reason (a step inherits nothing from the allocation's options).
    """
    tasks = _tasks_per_node(res, cluster, tasks_per_node)
    geometry = [f"--nodes={res.nodes}", f"--ntasks-per-node={tasks}"]
    if res.gpus and (per_gcd_tasks(res, cluster) or tasks_per_node):
        geometry.append(gpu_option(res, cluster))
        if cluster.cpu_masks:  # the site's GPU-affine masks (LUMI-G: the 7 cores next to each GCD)
            masks = cluster.cpu_masks[:tasks]
            if len(masks) < tasks:
                raise ConfigError(
                    f"cluster.cpu_masks: {len(cluster.cpu_masks)} masks for {tasks} tasks per node ({res.rule})"
                )
            geometry.append(f"--cpu-bind=mask_cpu:{','.join(masks)}")
        else:  # a site file without masks: SLURM gives each task its GPU's share of the cores
            geometry.append(f"--cpus-per-task={res.cpus_per_gpu}")
    elif res.gpus:  # one task holding every GCD and core of the allocation
        geometry += [gpu_option(res, cluster), f"--cpus-per-task={res.gpus * res.cpus_per_gpu}"]
    else:
        geometry += [f"--cpus-per-task={res.threads}"]
    exports = [f"export {k}={shlex.quote(v)}" for k, v in cluster.container_env().items()]
    if res.multinode or tasks > 1:
        nodelist = '$(squeue -h -j "$SLURM_JOB_ID" -o %N)'
        exports += [
            f'export SINGULARITYENV_MASTER_ADDR="$(scontrol show hostnames "{nodelist}" | head -n1)"',
            f"export SINGULARITYENV_MASTER_PORT=$(({cluster.master_port_base} + SLURM_JOB_ID % 1000))",
            "export APPTAINERENV_MASTER_ADDR=$SINGULARITYENV_MASTER_ADDR",
            "export APPTAINERENV_MASTER_PORT=$SINGULARITYENV_MASTER_PORT",
        ]
    # --nv (NVIDIA): the host's driver libraries, on GPU steps only, never on CPU rules.
    nv = " --nv" if cluster.vendor == "nvidia" and res.gpus else ""
    image = shlex.quote(cluster.image_for(res.partition))
    run = f"srun {' '.join(geometry)} {cluster.runner} exec{nv} {cluster.apptainer_args()} {image}"
    if res.rehearse_warning and res.world_size == 1:
        # The dev-g rehearsal: SLURM's warning forced early, once per stage (runtime/launch.py).
        run += f" python3 -m vcloud.runtime.launch --warn-after {res.rehearse_warning}"
    if res.gpus > 1 and tasks == 1:
        # torchrun dies of SIGUSR1 (its agent handles TERM/INT/HUP/QUIT only) and takes the
        # ranks with it mid-save: it starts with USR1 ignored; each rank installs its handler.
        run += f" python3 -m vcloud.runtime.launch --ignore-usr1 {torchrun(res.gpus)}"
    return "; ".join([*exports, run])


def multinode_prefix(res: RuleResources, cluster: Cluster, *, tasks_per_node: int | None = None) -> str:
    """The multi-node launch line (one task per GCD); see step_prefix."""
    return step_prefix(res, cluster, tasks_per_node=tasks_per_node)

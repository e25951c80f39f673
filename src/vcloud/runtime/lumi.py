"""LUMI execution: the cluster section of the workflow config turned into SLURM resources,
container bind lists and launch commands.

Host-side only (it runs where snakemake parses the Snakefile, on a login node): no torch,
no numpy. The bind list and the GCD-affine CPU masks are defined once, in the `cluster`
section of config/lumi.yaml, and everything else (the generated profile, the rule
resources, the multi-node srun line, `vcloud doctor`) is derived from it.

Launch paths, chosen by a rule's resources (`gpus` per node, `nodes`):
- one process (gpus <= 1, one node): the rule's command as is; the SLURM jobstep runs it in
  `srun -n1 --gpus=N` and snakemake wraps it in `apptainer exec <binds> <image>`.
- one node, several GCDs: `torchrun --standalone --nproc-per-node=G --no-python <command>`
  inside the container (ranks from torchrun's RANK/WORLD_SIZE/LOCAL_RANK).
- several nodes: the rule has an `mpi` resource and no container directive, so its shell
  runs in the batch step on the host: it finds rank 0's host with SLURM tools (absent from
  the container), passes it in as SINGULARITYENV_MASTER_ADDR, and starts one task per GCD
  with `srun` (explicit geometry and CPU masks) and `singularity exec` with the same binds.
  Ranks come from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (vcloud.train.distributed).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from vcloud.errors import ConfigError

# CPU cores closest to each GCD of a LUMI-G node, in GCD order (seed 003, "Testing affinity"):
# GCD 0 sits next to cores 49-55, GCD 1 next to 57-63, GCD 2 next to 17-23, and so on. The
# first core of each group of 8 is reserved for the OS, hence 7 cores (0xfe) per GCD.
LUMI_CPU_MASKS = (
    "0xfe000000000000",
    "0xfe00000000000000",
    "0xfe0000",
    "0xfe000000",
    "0xfe",
    "0xfe00",
    "0xfe00000000",
    "0xfe0000000000",
)

# Placeholders that must not reach sbatch: the shipped config/lumi.yaml carries one.
_PLACEHOLDER = re.compile(r"X{3,}|CHANGE|<|>|your", re.IGNORECASE)
_ACCOUNT = re.compile(r"^project_\d{9}$")


@dataclass(frozen=True)
class Partition:
    name: str
    max_runtime: int  # minutes
    max_nodes: int
    gpus_per_node: int  # 0: a CPU partition
    full_nodes: bool  # whole nodes are allocated (and billed): ask for every GCD of them


@dataclass(frozen=True)
class Cluster:
    """The `cluster` section of the workflow config (config/lumi.yaml)."""

    name: str
    account: str
    image: str
    pylibs: str | None
    binds: tuple[str, ...]
    containlibs: tuple[str, ...]
    cpu_masks: tuple[str, ...]
    gcd_memory_gb: float
    gpu_hour_budget: float
    partitions: dict[str, Partition]
    jobs: int
    master_port_base: int

    @classmethod
    def from_config(cls, config: dict) -> Cluster | None:
        section = config.get("cluster")
        if not section:
            return None
        account = section["account"]
        partitions = {
            name: Partition(name=name, **values) for name, values in section["partitions"].items()
        }
        return cls(
            name=section["name"],
            account=account,
            image=_expand(section["image"], account),
            pylibs=_expand(section.get("pylibs"), account),
            binds=tuple(_expand(b, account) for b in section["binds"]),
            containlibs=tuple(section["containlibs"]),
            cpu_masks=tuple(section.get("cpu_masks") or LUMI_CPU_MASKS),
            gcd_memory_gb=float(section.get("gcd_memory_gb", 64)),
            gpu_hour_budget=float(section["gpu_hour_budget"]),
            partitions=partitions,
            jobs=int(section.get("jobs", 32)),
            master_port_base=int(section.get("master_port_base", 29500)),
        )

    # --- container -----------------------------------------------------------------------

    def apptainer_args(self) -> str:
        """Bind options for every container call: one -B per path, never --rocm."""
        return " ".join(f"-B {shlex.quote(path)}" for path in self.binds)

    def container_env(self) -> dict[str, str]:
        """Variables the host sets before `apptainer exec` (the profile's precommand)."""
        libs = ",".join(self.containlibs)
        env = {"SINGULARITY_CONTAINLIBS": libs, "APPTAINER_CONTAINLIBS": libs}
        if self.pylibs:  # extra packages in /projappl instead of a derived image (seed 001)
            for prefix in ("SINGULARITYENV", "APPTAINERENV"):
                env[f"{prefix}_PYTHONPATH"] = self.pylibs
                env[f"{prefix}_PREPEND_PATH"] = f"{self.pylibs}/bin"
        return env

    def precommand(self) -> str:
        return "; ".join(f"export {k}={shlex.quote(v)}" for k, v in self.container_env().items())

    def account_problem(self) -> str | None:
        """Why cluster.account cannot be submitted with, or None."""
        if _PLACEHOLDER.search(self.account):
            return (f"cluster.account: {self.account!r} is a placeholder; set your LUMI project "
                    "(e.g. project_465000123) in config/lumi.yaml")
        if not _ACCOUNT.match(self.account):
            return f"cluster.account: {self.account!r} is not a LUMI project (project_ and 9 digits)"
        return None


def _expand(text: str | None, account: str) -> str | None:
    return None if text is None else text.replace("{account}", account)


# --- resources and launch ----------------------------------------------------------------


@dataclass(frozen=True)
class RuleResources:
    """One entry of config `resources` (schema defaults filled)."""

    rule: str
    runtime: int
    mem_mb: int
    threads: int
    partition: str
    gpus: int
    nodes: int
    cpus_per_gpu: int

    @classmethod
    def from_config(cls, config: dict, key: str, rule: str | None = None) -> RuleResources:
        entry = config["resources"][key]
        return cls(rule=rule or key, runtime=entry["runtime"], mem_mb=entry["mem_mb"],
                   threads=entry["threads"], partition=entry.get("partition", "small"),
                   gpus=entry.get("gpus", 0), nodes=entry.get("nodes", 1),
                   cpus_per_gpu=entry.get("cpus_per_gpu", 7))

    @property
    def world_size(self) -> int:
        """Processes of a training run: one per GPU (GCD), at least one."""
        return max(self.gpus, 1) * self.nodes

    @property
    def multinode(self) -> bool:
        return self.nodes > 1

    def gpu_hours(self) -> float:
        """Billed GPU hours at the requested wall time: GCDs x hours (8 per LUMI-G node-hour)."""
        return self.gpus * self.nodes * self.runtime / 60


def slurm_resources(res: RuleResources, cluster: Cluster | None) -> dict:
    """Keyword arguments for a rule's `resources:` (SLURM executor plugin names).

    Local runs ignore the slurm_* names; the account comes from the cluster section (without
    one, the plugin takes the user's default account).
    """
    out: dict = {"runtime": res.runtime, "mem_mb": res.mem_mb, "slurm_partition": res.partition}
    if cluster is not None:
        out["slurm_account"] = cluster.account
    if res.gpus:
        out["gpu"] = res.gpus * res.nodes  # --gpus=N in total
        out["cpus_per_gpu"] = res.cpus_per_gpu
    else:
        out["cpus_per_task"] = res.threads
    if res.multinode:
        out["nodes"] = res.nodes
        # The rule's shell runs in the batch step and calls srun itself (multinode_prefix).
        out["mpi"] = "srun"
        out["tasks_per_node"] = max(res.gpus, 2)
    return out


def uses_container(res: RuleResources, cluster: Cluster | None) -> bool:
    """Snakemake wraps the rule in apptainer, except multi-node rules (they call srun first)."""
    return cluster is not None and not res.multinode


def launch_prefix(res: RuleResources, cluster: Cluster | None) -> str:
    """What goes before a rule's `vcloud ...` command to start one process per GPU."""
    if not res.multinode:
        if res.gpus <= 1:
            return ""
        return f"torchrun --standalone --nnodes=1 --nproc-per-node={res.gpus} --no-python"
    if cluster is None:
        raise ConfigError(f"resources.{res.rule}.nodes: {res.nodes} nodes need a cluster section "
                          "(config/lumi.yaml)")
    return multinode_prefix(res, cluster)


def multinode_prefix(res: RuleResources, cluster: Cluster, *, tasks_per_node: int | None = None) -> str:
    """srun + singularity exec for several nodes, run by the batch step on the host.

    One task per GCD (tasks_per_node: CPU-only runs, e.g. the tests' 2-task gloo job). The
    SLURM jobstep strips SLURM_* (but SLURM_JOB_ID) before it runs this line, so the node
    list comes from squeue, not $SLURM_NODELIST.
    """
    tasks = tasks_per_node or max(res.gpus, 1)
    geometry = [f"--nodes={res.nodes}", f"--ntasks-per-node={tasks}"]
    if res.gpus:
        masks = cluster.cpu_masks[:tasks]
        if len(masks) < tasks:
            raise ConfigError(f"cluster.cpu_masks: {len(cluster.cpu_masks)} masks for "
                              f"{tasks} tasks per node ({res.rule})")
        geometry += [f"--gpus-per-node={res.gpus}", f"--cpu-bind=mask_cpu:{','.join(masks)}"]
    else:
        geometry += [f"--cpus-per-task={res.threads}"]
    exports = [f"export {k}={shlex.quote(v)}" for k, v in cluster.container_env().items()]
    nodelist = '$(squeue -h -j "$SLURM_JOB_ID" -o %N)'
    exports += [
        f'export SINGULARITYENV_MASTER_ADDR="$(scontrol show hostnames "{nodelist}" | head -n1)"',
        f"export SINGULARITYENV_MASTER_PORT=$(({cluster.master_port_base} + SLURM_JOB_ID % 1000))",
        "export APPTAINERENV_MASTER_ADDR=$SINGULARITYENV_MASTER_ADDR",
        "export APPTAINERENV_MASTER_PORT=$SINGULARITYENV_MASTER_PORT",
    ]
    run = (f"srun {' '.join(geometry)} singularity exec {cluster.apptainer_args()} "
           f"{shlex.quote(cluster.image)}")
    return "; ".join([*exports, run])

"""LUMI execution: the cluster section of the workflow config turned into SLURM resources,
container bind lists and launch commands.

Host-side only (it runs where snakemake parses the Snakefile, on a login node): no torch,
no numpy. The bind list and the GCD-affine CPU masks are defined once, in the `cluster`
section of config/lumi.yaml, and everything else (the generated profile, the rule
resources, the multi-node srun line, `vcloud doctor`) is derived from it.

Launch paths, chosen by a rule's resources (`gpus` per node, `nodes`):
- no cluster section (laptop): the command as is, or `torchrun --standalone` for gpus > 1.
- a CPU rule on the cluster: snakemake's SLURM jobstep runs it with `srun -n1` and wraps it
  in `apptainer exec <binds> <image>` (the profile's apptainer-args).
- a GPU or multi-node rule on the cluster launches itself: it has an `mpi` resource and no
  container directive, so its shell runs in the batch step on the host and starts its own
  job step, `srun <geometry> singularity exec <binds> <image> ...`:
  - one node, one GCD: one task running the command;
  - one node, G GCDs: one task running `torchrun --standalone --nproc-per-node=G` once;
  - N nodes: one task per GCD (explicit geometry and GCD-affine CPU masks), rank 0's host
    from SLURM tools (absent from the container) as SINGULARITYENV_MASTER_ADDR, ranks from
    SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (vcloud.train.distributed).
  Why its own step: SLURM's warning before the time limit (`--signal=USR1@S`, no `B:`) goes
  to every process of every job step but the batch step. Under the jobstep's `srun -n1`
  the step also holds snakemake itself, which USR1 kills (measured on the test cluster: step
  CANCELLED by signal 10 while the trainer was still writing); with its own step only the
  trainer's processes get the warning and snakemake waits in the batch step.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field, replace

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
BILLING_SOURCE = "LUMI user guide, docs/runjobs/lumi_env/billing.md"
_PLACEHOLDER = re.compile(r"X{3,}|CHANGE|<|>|your", re.IGNORECASE)


@dataclass(frozen=True)
class GPU:
    """One GPU of a partition (one GCD on LUMI's MI250X)."""

    model: str
    memory_gb: float
    compute_capability: float | None  # CUDA's; None on AMD
    gres_type: str | None = None  # --gres=gpu:<type>:N where the site names types

    @property
    def has_bf16(self) -> bool:
        """Native bf16: AMD CDNA2+ (MI250X), CUDA compute capability >= 8.0 (Ampere). Not
        torch.cuda.is_bf16_supported(): it answers True on P100/V100 through emulation."""
        return self.compute_capability is None or self.compute_capability >= 8.0


@dataclass(frozen=True)
class Partition:
    name: str
    max_runtime: int  # minutes
    max_nodes: int
    gpus_per_node: int  # 0: a CPU partition
    full_nodes: bool  # whole nodes are allocated (and billed): ask for every GCD of them
    whole_nodes_on: str | None = None  # a job asking for a whole node goes there instead
    max_running: int | None = None  # a user's jobs running at once (dev-g: 1)
    max_submit: int | None = None  # a user's jobs queued or running at once (dev-g: 2); None: unknown
    arch: str = "x86_64"  # CPU architecture of its nodes: the image must be built for it
    min_gpus: int = 0  # GPUs a job must ask for at least (Olivia's accel: 1)
    cpus_per_node: int | None = None  # cores a job may use on one node (LUMI-G: 56)
    gpu: GPU | None = None  # None: a CPU partition
    billing_weights: dict | None = None  # weighted_max billing: {cpu, mem_gib, gpu} units per hour

    def __post_init__(self) -> None:
        if isinstance(self.gpu, dict):
            object.__setattr__(self, "gpu", GPU(**self.gpu))

    @property
    def job_resource(self) -> str:
        """The global snakemake resource that caps this partition's running jobs."""
        return re.sub(r"\W", "_", self.name) + "_jobs"


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
    gpu_hour_budget: float
    partitions: dict[str, Partition]
    jobs: int
    master_port_base: int
    signal_seconds: int = 300
    restart_minutes: float = 10.0
    spare_retries: int = 2
    env_image: str | None = None  # squashfs venv made by `vcloud image`, bound at /user-software
    title: str = "LUMI"  # the site's name as its users write it
    account_pattern: str = r"^project_\d{9}$"
    account_example: str = "project_465000123"
    vendor: str = "amd"  # amd: ROCm, RCCL; nvidia: CUDA, NCCL, apptainer --nv
    gpu_request: str = "gpus"  # gpus: --gpus/--gpus-per-node (cons_tres); gres: --gres=gpu[:type]:N
    runner: str = "singularity"  # the container command of self-launched steps
    images: dict = field(default_factory=dict)  # CPU architecture -> image (else `image`)
    placement: dict = field(default_factory=dict)  # cpu, gpu, rehearsal partitions; rehearsal_qos
    qos: dict = field(default_factory=dict)  # name -> {max_runtime, max_gpus, max_running, whole_nodes}
    billing_formula: str = "lumi"  # lumi | weighted_max | gpu_hours
    billing_unit: str = "GPU-h"
    billing_source: str = BILLING_SOURCE
    billing_verified: bool = True
    transport: str = "cxi"  # cxi | ib | unverified
    unverified: tuple[str, ...] = ()  # keys of the site file that are guesses
    quotas: dict = field(default_factory=dict, compare=False)
    home: str | None = None
    home_bytes: float | None = None
    host_installs: bool = True  # False: snakemake and vcloud run from the image (runtime/image_run.py)
    slurm_binds: tuple[str, ...] = ()  # the SLURM client, bound into the image where snakemake runs there
    max_submit: int | None = None  # a user's jobs queued or running at once on the whole site; None: unknown

    @classmethod
    def from_config(cls, config: dict) -> Cluster | None:
        section = config.get("cluster")
        if not section:
            return None
        account = section["account"]
        if section.get("pylibs") and section.get("env_image"):
            raise ConfigError("cluster: pylibs and env_image both set; keep one (env_image: `vcloud image`)")
        partitions = {name: Partition(name=name, **values) for name, values in section["partitions"].items()}
        billing = section.get("billing") or {}
        return cls(
            name=section["name"],
            account=account,
            image=_expand(section["image"], account),
            pylibs=_expand(section.get("pylibs"), account),
            binds=tuple(_expand(b, account) for b in section["binds"]),
            containlibs=tuple(section["containlibs"]),
            cpu_masks=tuple(section.get("cpu_masks") or LUMI_CPU_MASKS),
            gpu_hour_budget=float(section["gpu_hour_budget"]),
            partitions=partitions,
            jobs=int(section.get("jobs", 32)),
            master_port_base=int(section.get("master_port_base", 29500)),
            signal_seconds=int(section.get("signal_seconds", 300)),
            restart_minutes=float(section.get("restart_minutes", 10)),
            spare_retries=int(section.get("spare_retries", 2)),
            env_image=_expand(section.get("env_image"), account),
            title=section.get("title", section["name"]),
            account_pattern=section.get("account_pattern", r"^project_\d{9}$"),
            account_example=section.get("account_example", "project_465000123"),
            vendor=section.get("vendor", "amd"),
            gpu_request=section.get("gpu_request", "gpus"),
            runner=section.get("runner", "singularity"),
            images={arch: _expand(path, account) for arch, path in (section.get("images") or {}).items()},
            placement=dict(section.get("placement") or {}),
            qos=dict(section.get("qos") or {}),
            billing_formula=billing.get("formula", "lumi"),
            billing_unit=billing.get("unit", "GPU-h"),
            billing_source=billing.get("source") or BILLING_SOURCE,
            billing_verified=bool(billing.get("verified", True)),
            transport=section.get("transport", "cxi"),
            unverified=tuple(section.get("unverified") or ()),
            quotas=dict(section.get("quotas") or {}),
            home=section.get("home"),
            home_bytes=section.get("home_bytes"),
            host_installs=bool(section.get("host_installs", True)),
            slurm_binds=tuple(_expand(b, account) for b in section.get("slurm_binds") or ()),
            max_submit=section.get("max_submit"),
        )

    # --- container -----------------------------------------------------------------------

    def apptainer_args(self) -> str:
        """Bind options for every container call: one -B per path, never --rocm; the
        squashfs environment (`vcloud image`) mounted at /user-software."""
        binds = list(self.binds)
        if self.env_image:
            binds.append(f"{self.env_image}:/user-software:image-src=/")
        return " ".join(f"-B {shlex.quote(path)}" for path in binds)

    def container_env(self) -> dict[str, str]:
        """Variables the host sets before `apptainer exec` (the profile's precommand)."""
        libs = ",".join(self.containlibs)
        env = {"SINGULARITY_CONTAINLIBS": libs, "APPTAINER_CONTAINLIBS": libs} if libs else {}
        if self.env_image:  # the venv inside it comes first on PATH (LUMI AI guide, ch. 2)
            for prefix in ("SINGULARITYENV", "APPTAINERENV"):
                env[f"{prefix}_PREPEND_PATH"] = "/user-software/venv/bin"
        elif self.pylibs:  # extra packages in /projappl instead of a derived image (seed 001)
            for prefix in ("SINGULARITYENV", "APPTAINERENV"):
                env[f"{prefix}_PYTHONPATH"] = self.pylibs
                env[f"{prefix}_PREPEND_PATH"] = f"{self.pylibs}/bin"
        return env

    def precommand(self) -> str:
        return "; ".join(f"export {k}={shlex.quote(v)}" for k, v in self.container_env().items())

    def account_problem(self) -> str | None:
        """Why cluster.account cannot be submitted with, or None."""
        if _PLACEHOLDER.search(self.account):
            return (
                f"cluster.account: {self.account!r} is a placeholder; set your {self.title} project "
                f"(e.g. {self.account_example}) in config/{self.name}.yaml"
            )
        if not re.match(self.account_pattern, self.account):
            return (
                f"cluster.account: {self.account!r} is not a {self.title} project "
                f"(like {self.account_example}: {self.account_pattern})"
            )
        return None

    # --- the site's facts ------------------------------------------------------------------

    def image_for(self, partition: str | None) -> str:
        """The image built for the CPU architecture of `partition`'s nodes."""
        part = self.partitions.get(partition or "")
        return self.images.get(part.arch if part else "x86_64", self.image)

    def gpu_of(self, partition: str) -> GPU | None:
        part = self.partitions.get(partition)
        return None if part is None else part.gpu

    def global_resources(self) -> dict[str, int]:
        """`resources:` of the profile: one slot per job a capped partition may run at once."""
        return {part.job_resource: part.max_running for part in self.partitions.values() if part.max_running}

    def place(self, res: RuleResources, overrides: dict | None = None) -> RuleResources:
        """A job asking for every GCD of a node on a partial partition runs on its whole-node
        partition (small-g -> standard-g: the same price, CPU binding, no wait for an empty
        node), unless the partition was set on the command line (--set-resources). The wall
        time is capped at that partition's limit: snakemake resubmits from latest.pt."""
        part = self.partitions.get(res.partition)
        if (
            part is None
            or not part.whole_nodes_on
            or "slurm_partition" in (overrides or {})
            or not part.gpus_per_node
            or res.gpus != part.gpus_per_node
        ):
            return res
        target = self.partitions.get(part.whole_nodes_on)
        runtime = min(res.runtime, target.max_runtime) if target else res.runtime
        return replace(res, partition=part.whole_nodes_on, runtime=runtime)


def _expand(text: str | None, account: str) -> str | None:
    return None if text is None else text.replace("{account}", account)


# --- resources and launch ----------------------------------------------------------------


@dataclass(frozen=True)
class RuleResources:
    """One entry of config `resources` (schema defaults filled).

    mem_mb is per node. With `mem_mb_per_gpu` in the entry of a GPU rule it follows the GCDs:
    mem_mb_per_gpu x gpus per node (mem_mb is then ignored: config/lumi.yaml is an overlay
    and cannot remove the default's mem_mb), so raising `gpus` raises the host memory too.
    """

    rule: str
    runtime: int
    mem_mb: int
    threads: int
    partition: str
    gpus: int
    nodes: int
    cpus_per_gpu: int
    mem_mb_per_gpu: int | None = None
    epoch_minutes: float | None = None  # estimated time of one epoch (training rules)
    rehearse_warning: int | None = None  # seconds: a forced wall-time warning (the dev-g rehearsal)
    qos: str | None = None  # --qos (Sigma2's devel for rehearsals)

    @classmethod
    def from_config(cls, config: dict, key: str, rule: str | None = None) -> RuleResources:
        entry = config["resources"][key]
        where = f"resources.{key}"
        gpus, per_gpu = entry.get("gpus", 0), entry.get("mem_mb_per_gpu")
        if not gpus:
            per_gpu = None  # a CPU run of a GPU rule (e.g. gpus: 0 on the command line)
        if per_gpu is None and "mem_mb" not in entry:
            raise ConfigError(f"{where}: mem_mb is missing (mem_mb_per_gpu applies to GPU rules only)")
        return cls(
            rule=rule or key,
            runtime=entry["runtime"],
            mem_mb=per_gpu * gpus if per_gpu is not None else entry["mem_mb"],
            threads=entry["threads"],
            partition=entry.get("partition") or _default_partition(config, gpus),
            gpus=gpus,
            nodes=entry.get("nodes", 1),
            cpus_per_gpu=entry.get("cpus_per_gpu", 7),
            mem_mb_per_gpu=per_gpu,
            epoch_minutes=entry.get("epoch_minutes"),
            rehearse_warning=entry.get("rehearse_warning"),
            qos=entry.get("qos"),
        )

    @property
    def world_size(self) -> int:
        """Processes of a training run: one per GPU (GCD), at least one."""
        return max(self.gpus, 1) * self.nodes

    @property
    def multinode(self) -> bool:
        return self.nodes > 1

    @property
    def cores(self) -> int:
        """CPU cores the job holds on all its nodes (what LUMI bills on partial nodes)."""
        per_node = self.gpus * self.cpus_per_gpu if self.gpus else self.threads
        return per_node * self.nodes

    def with_overrides(self, overrides: dict | None, *, threads: int | None = None) -> RuleResources:
        """These resources after `snakemake --set-resources RULE:NAME=VALUE` (and --set-threads).

        Names vcloud derives the launch from follow through (gpu is GPUs in total, split over
        the nodes; memory follows the GCDs unless mem_mb is set too); names that would change
        the task geometry behind vcloud's back are refused with one line.
        """
        overrides = dict(overrides or {})
        where = f"--set-resources {self.rule}"
        for name in _GEOMETRY:
            if name in overrides:
                raise ConfigError(
                    f"{where}:{name}: vcloud sets the task geometry itself; change "
                    f"gpu, nodes or cpus_per_gpu (or resources.{self.rule}) instead"
                )
        for name in ("mem", "mem_gb", "mem_mib", "mem_mb_per_cpu", "runtime_min", "time"):
            if name in overrides:
                raise ConfigError(
                    f"{where}:{name}: not followed by vcloud's launch, doctor and "
                    "accounting; use mem_mb or runtime (minutes)"
                )
        nodes = _int_override(overrides, "nodes", self.nodes, where)
        gpus = self.gpus
        if "gpu" in overrides:
            total = _int_override(overrides, "gpu", self.gpus * self.nodes, where)
            if total % nodes:
                raise ConfigError(f"{where}:gpu={total}: not a multiple of the {nodes} nodes")
            gpus = total // nodes
        elif "nodes" in overrides:
            gpus = self.gpus  # per node: more nodes, same GCDs on each
        mem = self.mem_mb
        if "mem_mb" in overrides:
            mem = _int_override(overrides, "mem_mb", self.mem_mb, where)
        elif self.mem_mb_per_gpu is not None and gpus:
            mem = self.mem_mb_per_gpu * gpus
        partition = overrides.get("slurm_partition", self.partition)
        return replace(
            self,
            runtime=_int_override(overrides, "runtime", self.runtime, where),
            mem_mb=mem,
            threads=threads if threads is not None else _int_override(overrides, "cpus_per_task", self.threads, where),
            partition=str(partition),
            gpus=gpus,
            nodes=nodes,
            cpus_per_gpu=_int_override(overrides, "cpus_per_gpu", self.cpus_per_gpu, where),
        )


def _default_partition(config: dict, gpus: int) -> str:
    """A resources entry without a partition: the site's placement (LUMI's names without one)."""
    placement = (config.get("cluster") or {}).get("placement") or {}
    return placement.get("gpu" if gpus else "cpu") or ("small-g" if gpus else "small")


# Resource names of the plugin that set tasks or GPUs other than through `gpu`/`nodes`.
_GEOMETRY = (
    "tasks",
    "tasks_per_gpu",
    "tasks_per_node",
    "mpi",
    "gpus",
    "gres",
    "gpu_model",
    "nvidia_gpu",
    "mem_mb_per_gpu",
)


def _int_override(overrides: dict, name: str, default: int, where: str) -> int:
    if name not in overrides:
        return default
    value = overrides[name]
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}:{name}={value!r}: expected a whole number") from None
    if number < (0 if name == "gpu" else 1):
        raise ConfigError(f"{where}:{name}={value!r}: out of range")
    return number


# --- LUMI billing --------------------------------------------------------------------------
# LUMI user guide, "Billing policy" (docs/runjobs/lumi_env/billing.md): "A GPU-hour corresponds
# to the allocation of a full MI250x module (2 GCDs) for one hour." Whole-node GPU partitions
# (standard-g): 4 GPU-h per node-hour. Partial GPU partitions (small-g, dev-g): 0.5 x max(
# ceil(cores / 8), ceil(memory / 64 GB), GCDs) per hour. CPU partitions: core-hours, on partial
# nodes (small) max(cores, ceil(memory / 2 GB)), on whole nodes (standard) 128 per node-hour.
# Memory counts in SLURM's units (1 GB = 1024 MB), as requested with --mem.
_CORES_PER_GCD_SLICE = 8  # 64 cores / 8 GCDs of a LUMI-G node
_MEM_PER_GCD_SLICE_MB = 64 * 1024  # 512 GB / 8 GCDs
_MEM_PER_CORE_MB = 2 * 1024  # LUMI-C: 256 GB / 128 cores
_CORES_PER_CPU_NODE = 128


@dataclass(frozen=True)
class Billing:
    unit: str  # "GPU-h" or "core-h"
    per_hour: float  # billed units per wall hour
    formula: str  # how per_hour was found, with the job's numbers

    def hours(self, wall_hours: float) -> float:
        return self.per_hour * wall_hours


def billing(res: RuleResources, part: Partition, cluster: Cluster | None = None) -> Billing:
    """What the site bills per wall hour for a job of these resources on this partition: the
    partition's own formula where it has one (billing_weights: Sigma2's weighted maximum),
    else the site's (LUMI's slices without a cluster). An unverified formula says so."""
    formula = cluster.billing_formula if cluster is not None else "lumi"
    if part.billing_weights:
        formula = "weighted_max"
    if formula == "lumi":
        bill = lumi_billing(res, part)
    elif formula == "weighted_max":
        bill = weighted_max_billing(res, part, unit=cluster.billing_unit if cluster else "BU-h")
    else:  # gpu_hours: a GPU-hour quota (Olivia's accel); a CPU partition then in core-hours
        gpus = res.gpus * res.nodes
        bill = (
            Billing("GPU-h", float(gpus), f"{gpus} GPUs")
            if part.gpus_per_node
            else Billing("core-h", float(res.cores), f"{res.cores} cores")
        )
    if cluster is not None and not cluster.billing_verified:
        bill = replace(bill, formula=f"{bill.formula}; formula unverified: an estimate")
    return bill


def weighted_max_billing(res: RuleResources, part: Partition, *, unit: str) -> Billing:
    """Sigma2: units per hour = max(CPUs x cpu, memory GiB x mem_gib, GPUs x gpu), of what the
    job asks for (documentation.sigma2.no, jobs/projects_accounting)."""
    weights = part.billing_weights or {}
    cpus = res.cores
    mem_gib = res.mem_mb * res.nodes / 1024
    gpus = res.gpus * res.nodes
    terms = {
        "CPUs": cpus * weights.get("cpu", 1),
        "GiB": mem_gib * weights.get("mem_gib", 0),
        "GPUs": gpus * weights.get("gpu", 0),
    }
    shown = ", ".join(f"{value:g} for {name}" for name, value in terms.items())
    return Billing(unit, round(max(terms.values()), 6), f"max({shown})")


def lumi_billing(res: RuleResources, part: Partition) -> Billing:
    """What LUMI bills per wall hour for a job of these resources on this partition."""
    if part.gpus_per_node:
        if part.full_nodes:
            per_node = part.gpus_per_node / 2  # 2 GCDs per MI250X module
            return Billing("GPU-h", per_node * res.nodes, f"{per_node:g} x {res.nodes} nodes")
        gcds = res.gpus * res.nodes
        cores = math.ceil(res.cores / _CORES_PER_GCD_SLICE)
        mem = math.ceil(res.mem_mb * res.nodes / _MEM_PER_GCD_SLICE_MB)
        return Billing(
            "GPU-h", 0.5 * max(cores, mem, gcds), f"0.5 x max({cores} core slices, {mem} memory slices, {gcds} GCDs)"
        )
    if part.full_nodes:
        return Billing("core-h", _CORES_PER_CPU_NODE * res.nodes, f"{_CORES_PER_CPU_NODE} x {res.nodes} nodes")
    mem = math.ceil(res.mem_mb * res.nodes / _MEM_PER_CORE_MB)
    return Billing("core-h", max(res.cores, mem), f"max({res.cores} cores, {mem} x 2 GB)")


# --- wall-time warning and resubmission ----------------------------------------------------


def signal_option(seconds: int) -> str:
    """sbatch option for SIGUSR1 `seconds` before the time limit, to every job step (no `B:`:
    the batch shell is snakemake's jobstep, the trainer runs in the rule's own step)."""
    return f"--signal=USR1@{seconds}"


def retries_needed(
    *, epochs: int, epoch_minutes: float, runtime: int, signal_seconds: int, restart_minutes: float, spare: int
) -> int:
    """Resubmissions a training rule needs to finish `epochs` at `epoch_minutes` each.

    A job trains for its wall time less the warning (spent writing latest.pt) and the restart
    overhead (start-up, data, MIOpen); an interruption loses less than one step, since the
    trainer saves at the next step boundary. `spare` more cover node failures and preemption.
    """
    useful = runtime - signal_seconds / 60 - restart_minutes
    if useful <= 0:
        raise ConfigError(
            f"runtime {runtime} min leaves no training time after the "
            f"{signal_seconds} s warning and {restart_minutes} min restart"
        )
    jobs = math.ceil(epochs * epoch_minutes / useful)
    return max(jobs - 1, 0) + spare


def measured_epoch_minutes(metrics_lines: list[str]) -> float | None:
    """Median minutes per epoch of a stage's metrics.jsonl (wall_time between rows, else
    epoch_s), or None when nothing usable was logged yet."""
    import json

    rows = []
    for line in metrics_lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line of a killed write
        if isinstance(row, dict):
            rows.append(row)
    gaps = [
        b["wall_time"] - a["wall_time"]
        for a, b in zip(rows, rows[1:])
        if isinstance(a.get("wall_time"), (int, float))
        and isinstance(b.get("wall_time"), (int, float))
        and b.get("epoch", 0) == a.get("epoch", -2) + 1
    ]
    values = [g for g in gaps if g > 0] or [
        r["epoch_s"] for r in rows if isinstance(r.get("epoch_s"), (int, float)) and r["epoch_s"] > 0
    ]
    if not values:
        return None
    values.sort()
    return values[len(values) // 2] / 60


def per_gcd_tasks(res: RuleResources, cluster: Cluster | None) -> bool:
    """One task per GCD with GCD-affine CPU masks: several nodes, or a whole node of a
    whole-node partition (LUMI binds CPUs only on full-node allocations)."""
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
                f"resources.{res.rule}.nodes: {res.nodes} nodes need a cluster section (config/lumi.yaml)"
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
        masks = cluster.cpu_masks[:tasks]
        if len(masks) < tasks:
            raise ConfigError(
                f"cluster.cpu_masks: {len(cluster.cpu_masks)} masks for {tasks} tasks per node ({res.rule})"
            )
        geometry += [gpu_option(res, cluster), f"--cpu-bind=mask_cpu:{','.join(masks)}"]
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

"""The cluster model: the `cluster` section of the workflow config as typed values (a site's
facts from config/sites/<site>.yaml beneath the run's account and budget: vcloud.runtime.site),
and one rule's resources (its resources entry after `--set-resources`).

Every fact of a site comes from its site file; nothing here is any one site's. What the site
bills is vcloud.runtime.billing, the SLURM requests and launch lines vcloud.runtime.slurm.
Host-side only (it runs where snakemake parses the Snakefile, on a login node): no torch,
no numpy.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass, field, replace

from vcloud.errors import ConfigError

# Placeholders that must not reach sbatch: the shipped run files (config/<site>.yaml) carry one.
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
    """The `cluster` section of the workflow config: the site's facts (config/sites/<site>.yaml)
    beneath what the run's own section says (config/<site>.yaml: account, budget)."""

    name: str
    account: str
    image: str
    pylibs: str | None
    binds: tuple[str, ...]
    containlibs: tuple[str, ...]
    gpu_hour_budget: float
    partitions: dict[str, Partition]
    jobs: int
    master_port_base: int
    # The site's own facts, without a default: every site file says them (one site's value is
    # no other's default).
    title: str  # the site's name as its users write it (LUMI, Saga)
    account_pattern: str  # a real account of the site matches it
    account_example: str
    vendor: str  # amd: ROCm, RCCL; nvidia: CUDA, NCCL, apptainer --nv
    gpu_request: str  # gpus: --gpus/--gpus-per-node (cons_tres); gres: --gres=gpu[:type]:N
    runner: str  # the container command of self-launched steps: singularity | apptainer
    transport: str  # cxi | ib | unverified
    billing_formula: str  # lumi | weighted_max | gpu_hours (vcloud.runtime.billing)
    billing_unit: str  # GPU-h, core-h, BU-h, ...
    billing_source: str  # where the formula is documented
    billing_verified: bool = True
    billing_slices: dict = field(default_factory=dict)  # the lumi formula's slice sizes (billing.slices)
    cpu_masks: tuple[str, ...] = ()  # GPU-affine CPU masks, one per GPU of a node; none: SLURM places cores
    signal_seconds: int = 300
    restart_minutes: float = 10.0
    spare_retries: int = 2
    env_image: str | None = None  # squashfs venv made by `vcloud image`, bound at /user-software
    images: dict = field(default_factory=dict)  # CPU architecture -> image (else `image`)
    placement: dict = field(default_factory=dict)  # cpu, gpu, rehearsal partitions; rehearsal_qos
    qos: dict = field(default_factory=dict)  # name -> {max_runtime, max_gpus, max_running, whole_nodes}
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
        where = f"config/sites/{section.get('site') or section['name']}.yaml"
        formula = _fact(billing, "formula", where, "billing.")
        slices = dict(billing.get("slices") or {})
        if formula == "lumi" and not slices:
            raise ConfigError(f"cluster.billing.slices: the lumi formula needs the site's slice sizes ({where})")
        return cls(
            name=section["name"],
            account=account,
            image=_expand(section["image"], account),
            pylibs=_expand(section.get("pylibs"), account),
            binds=tuple(_expand(b, account) for b in section["binds"]),
            containlibs=tuple(section["containlibs"]),
            gpu_hour_budget=float(section["gpu_hour_budget"]),
            partitions=partitions,
            jobs=int(section.get("jobs", 32)),
            master_port_base=int(section.get("master_port_base", 29500)),
            title=_fact(section, "title", where),
            account_pattern=_fact(section, "account_pattern", where),
            account_example=_fact(section, "account_example", where),
            vendor=_fact(section, "vendor", where),
            gpu_request=_fact(section, "gpu_request", where),
            runner=_fact(section, "runner", where),
            transport=_fact(section, "transport", where),
            billing_formula=formula,
            billing_unit=_fact(billing, "unit", where, "billing."),
            billing_source=_fact(billing, "source", where, "billing."),
            billing_verified=bool(billing.get("verified", True)),
            billing_slices=slices,
            cpu_masks=tuple(section.get("cpu_masks") or ()),
            signal_seconds=int(section.get("signal_seconds", 300)),
            restart_minutes=float(section.get("restart_minutes", 10)),
            spare_retries=int(section.get("spare_retries", 2)),
            env_image=_expand(section.get("env_image"), account),
            images={arch: _expand(path, account) for arch, path in (section.get("images") or {}).items()},
            placement=dict(section.get("placement") or {}),
            qos=dict(section.get("qos") or {}),
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


def _fact(section: dict, key: str, where: str, prefix: str = "") -> str:
    """A fact every site file states (no site's value is another's default)."""
    value = section.get(key)
    if value is None or value == "":
        raise ConfigError(f"cluster.{prefix}{key}: missing; the site's file says it ({where})")
    return value


# --- a rule's resources ------------------------------------------------------------------


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


# --- wall-time warning and resubmission ----------------------------------------------------


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

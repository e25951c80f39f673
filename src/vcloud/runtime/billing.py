"""What a site bills per wall hour for a job of given resources on one of its partitions.

The site's file names its formula and unit (`billing:` of config/sites/<site>.yaml); the numbers
each formula takes are the site's too, in that file: a partition's `billing_weights` (Sigma2's
weighted maximum), the `billing.slices` of the lumi formula. Nothing here is any one site's.

- lumi: LUMI user guide, "Billing policy" (docs/runjobs/lumi_env/billing.md): "A GPU-hour
  corresponds to the allocation of a full MI250x module (2 GCDs) for one hour." Whole-node GPU
  partitions (standard-g): the node's GCDs / GCDs per GPU-hour, per node-hour. Partial GPU
  partitions (small-g, dev-g): max(ceil(cores / cores per GCD), ceil(memory / memory per GCD),
  GCDs) / GCDs per GPU-hour, per hour. CPU partitions: core-hours, on partial nodes (small)
  max(cores, ceil(memory / memory per core)), on whole nodes (standard) the node's cores per
  node-hour. Memory counts in SLURM's units (1 GB = 1024 MB), as requested with --mem.
- weighted_max: Sigma2, units per hour = max(CPUs x cpu, memory GiB x mem_gib, GPUs x gpu).
- gpu_hours: a GPU-hour quota (GPUs x hours; Olivia's accel); a CPU partition in core-hours.

Host-side only: no torch, no numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from vcloud.errors import ConfigError
from vcloud.runtime.cluster import Cluster, Partition, RuleResources

# The lumi formula's numbers, each named in the site file's billing.slices.
SLICE_KEYS = ("gcds_per_gpu_hour", "cores_per_gcd", "mem_mb_per_gcd", "mem_mb_per_core", "cores_per_cpu_node")


@dataclass(frozen=True)
class Billing:
    unit: str  # "GPU-h" or "core-h"
    per_hour: float  # billed units per wall hour
    formula: str  # how per_hour was found, with the job's numbers

    def hours(self, wall_hours: float) -> float:
        return self.per_hour * wall_hours


def billing(res: RuleResources, part: Partition, cluster: Cluster) -> Billing:
    """What the site bills per wall hour for a job of these resources on this partition: the
    partition's own formula where it has one (billing_weights: Sigma2's weighted maximum),
    else the site's. An unverified formula says so."""
    formula = "weighted_max" if part.billing_weights else cluster.billing_formula
    if formula == "lumi":
        bill = lumi_billing(res, part, cluster.billing_slices)
    elif formula == "weighted_max":
        bill = weighted_max_billing(res, part, unit=cluster.billing_unit)
    else:  # gpu_hours: a GPU-hour quota (Olivia's accel); a CPU partition then in core-hours
        gpus = res.gpus * res.nodes
        bill = (
            Billing("GPU-h", float(gpus), f"{gpus} GPUs")
            if part.gpus_per_node
            else Billing("core-h", float(res.cores), f"{res.cores} cores")
        )
    if not cluster.billing_verified:
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


def lumi_billing(res: RuleResources, part: Partition, slices: dict) -> Billing:
    """What LUMI's formula bills per wall hour for a job of these resources on this partition,
    with the site's slice sizes (billing.slices of its file)."""
    if missing := [key for key in SLICE_KEYS if key not in slices]:
        raise ConfigError(f"cluster.billing.slices: {', '.join(missing)} missing (the lumi formula's numbers)")
    gcds_per_unit = slices["gcds_per_gpu_hour"]
    if part.gpus_per_node:
        if part.full_nodes:
            per_node = part.gpus_per_node / gcds_per_unit
            return Billing("GPU-h", per_node * res.nodes, f"{per_node:g} x {res.nodes} nodes")
        gcds = res.gpus * res.nodes
        cores = math.ceil(res.cores / slices["cores_per_gcd"])
        mem = math.ceil(res.mem_mb * res.nodes / slices["mem_mb_per_gcd"])
        share = 1 / gcds_per_unit
        return Billing(
            "GPU-h",
            share * max(cores, mem, gcds),
            f"{share:g} x max({cores} core slices, {mem} memory slices, {gcds} GCDs)",
        )
    if part.full_nodes:
        node = slices["cores_per_cpu_node"]
        return Billing("core-h", node * res.nodes, f"{node} x {res.nodes} nodes")
    mem = math.ceil(res.mem_mb * res.nodes / slices["mem_mb_per_core"])
    return Billing("core-h", max(res.cores, mem), f"max({res.cores} cores, {mem} x {_gb(slices['mem_mb_per_core'])})")


def formula_text(cluster: Cluster) -> str:
    """The site's formula in words, with its source (the head of the doctor's bill)."""
    if cluster.billing_formula == "lumi":
        slices = cluster.billing_slices
        parts = cluster.partitions.values()
        partial = "/".join(p.name for p in parts if p.gpus_per_node and not p.full_nodes)
        whole = [p for p in parts if p.gpus_per_node and p.full_nodes]
        cpu = "/".join(p.name for p in parts if not p.gpus_per_node and not p.full_nodes)
        shown = [f"{1 / slices['gcds_per_gpu_hour']:g} per GCD-hour on {partial}"] if partial else []
        shown += [f"{p.gpus_per_node / slices['gcds_per_gpu_hour']:g} per node-hour on {p.name}" for p in whole]
        text = f"{cluster.billing_source}; GPU-h: {', '.join(shown)}"
        if cpu:
            text += f"; core-h on {cpu}: max(cores, memory / {_gb(slices['mem_mb_per_core'])})"
        return text
    verified = "" if cluster.billing_verified else "; formula unverified: an estimate"
    return f"{cluster.billing_source}: {cluster.billing_formula} in {cluster.billing_unit}{verified}"


def _gb(mb: float) -> str:
    """SLURM's megabytes as its gigabytes (1 GB = 1024 MB)."""
    return f"{mb / 1024:g} GB"

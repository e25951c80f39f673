"""The doctor's checks of a run against its site's facts (config/sites/<site>.yaml): QOS and
partition minimums, the image's CPU architecture, storage the site purges, caches under a small
$HOME, and the guesses the site file admits to. One line per problem, before submission.

Host-side only: no torch, no numpy.
"""

from __future__ import annotations

import os
from pathlib import Path

from vcloud.runtime.cluster import Cluster, RuleResources

# SIF global header (apptainer/singularity images): a 32-byte launch line, "SIF_MAGIC\0",
# a 3-byte version and the 3-byte architecture code of the primary partition.
_SIF_MAGIC = b"SIF_MAGIC"
_SIF_ARCH = {"02": "x86_64", "04": "aarch64"}
SMALL_HOME = 5 * 1024**3  # a $HOME under this cannot hold the image and torch caches
CACHE_VARIABLES = ("APPTAINER_CACHEDIR", "SINGULARITY_CACHEDIR", "TORCH_HOME", "XDG_CACHE_HOME")


def image_arch(path: str | Path) -> str | None:
    """The CPU architecture an image is built for: a SIF file's header, or the `arch` line of
    the test stand-in's text image; None when the file is absent or does not say."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return None
    if head[32:41] == _SIF_MAGIC:
        return _SIF_ARCH.get(head[45:47].decode("ascii", "replace"), "unknown")
    if head.startswith(b"stand-in image"):
        for line in head.decode("utf-8", "replace").splitlines():
            if line.startswith("arch "):
                return line.split(None, 1)[1].strip()
        return "x86_64"
    return None


def check_qos(res: RuleResources, cluster: Cluster, where: str) -> list[str]:
    """A rule's QOS exists on the site and its request keeps the QOS's limits; the partition's
    minimum GPUs (Olivia's accel: 1)."""
    found = []
    part = cluster.partitions.get(res.partition)
    if part is not None and part.min_gpus and res.gpus < part.min_gpus:
        found.append(f"{where}.gpus: {res.gpus}, but {part.name} takes jobs of at least {part.min_gpus} GPU")
    if not res.qos:
        return found
    qos = cluster.qos.get(res.qos)
    if qos is None:
        known = ", ".join(cluster.qos) or "none"
        return [*found, f"{where}.qos: {res.qos!r} is not a QOS of {cluster.title} (known: {known})"]
    if qos.get("max_runtime") and res.runtime > qos["max_runtime"]:
        found.append(f"{where}.runtime: {res.runtime} min is above the {res.qos} QOS limit of {qos['max_runtime']} min")
    if qos.get("max_gpus") and res.gpus * res.nodes > qos["max_gpus"]:
        found.append(
            f"{where}.gpus: {res.gpus * res.nodes} GPUs in all, above the {res.qos} QOS limit of {qos['max_gpus']}"
        )
    if qos.get("whole_nodes") and part is not None and res.gpus and res.gpus != part.gpus_per_node:
        found.append(
            f"{where}.gpus: the {res.qos} QOS of {cluster.title} allocates whole nodes; ask for all "
            f"{part.gpus_per_node} GPUs of a {part.name} node"
        )
    return found


def check_images(cluster: Cluster, partitions: list[str]) -> tuple[list[str], list[str]]:
    """(errors, warnings): each used partition's image is built for its nodes' CPU architecture."""
    errors, warnings = [], []
    for name in partitions:
        part = cluster.partitions.get(name)
        if part is None:
            continue
        image = cluster.image_for(name)
        arch = image_arch(image)
        key = f"cluster.images.{part.arch}" if part.arch in cluster.images else "cluster.image"
        if arch is None:
            warnings.append(
                f"{key}: {image} cannot be read here; its architecture ({part.arch} on {name}) is unchecked"
            )
        elif arch != part.arch:
            errors.append(
                f"{key}: {image} is built for {arch}, but {name}'s nodes are {part.arch}; give an "
                f"{part.arch} image (cluster.images.{part.arch} in the site file)"
            )
    return errors, warnings


def _real(path: str, workdir: Path) -> str:
    return os.path.realpath(os.path.join(os.path.realpath(workdir), os.path.expanduser(path)))


def _under(path: str, folder: str) -> bool:
    folder = folder.rstrip("/")
    return path == folder or path.startswith(folder + "/")


def check_purge(config: dict, cluster: Cluster, workdir: Path, run_hours: float) -> tuple[list[str], list[str]]:
    """(errors, warnings): results and checkpoints under an area the site purges are refused
    (a resumed stage would find its latest.pt deleted); data there is a warning that compares
    the purge age with the run's expected length."""
    errors, warnings = [], []
    areas = [
        (name, _real(str(q["path"]).replace("{account}", cluster.account), workdir), q["purge_days"])
        for name, q in cluster.quotas.items()
        if q.get("purge_days")
    ]
    results = {"paths.results": str(config["paths"]["results"])}
    data = {"paths.prepared": str(config["paths"]["prepared"])}
    if not config["synthetic"]["enabled"]:
        raw = config["data"]["raw"]
        raws = [raw] if isinstance(raw, str) else raw
        data.update({"data.raw" if len(raws) == 1 else f"data.raw[{i}]": str(r) for i, r in enumerate(raws)})
    for name, folder, days in areas:
        for key, path in results.items():
            if _under(_real(path, workdir), folder):
                errors.append(
                    f"{key}: {path} lies in {cluster.title}'s {name} area ({folder}), whose files are deleted "
                    f"after {days} days: checkpoints and results would go; keep them in a project area"
                )
        for key, path in data.items():
            if _under(_real(path, workdir), folder):
                days_needed = run_hours / 24
                verdict = "longer than" if days_needed > days else "within"
                warnings.append(
                    f"{key}: {path} lies in {cluster.title}'s {name} area, deleted after {days} days; the run is "
                    f"expected to take {days_needed:.1f} days ({verdict} that): keep a copy elsewhere"
                )
    return errors, warnings


def check_home_caches(cluster: Cluster, runtime_env: dict, environ=os.environ) -> list[str]:
    """Caches under $HOME where the site's home is small (Eagle: ~1 GB): the image cache of
    apptainer, torch's and the runtime environment's cache folders."""
    if not cluster.home_bytes or cluster.home_bytes >= SMALL_HOME:
        return []
    home = environ.get("HOME") or "~"
    size = f"{cluster.home_bytes / 1024**3:.0f} GB" if cluster.home_bytes >= 1024**3 else f"{cluster.home_bytes:.0f} B"
    found = []
    # Apptainer reads APPTAINER_CACHEDIR, and SINGULARITY_CACHEDIR where the first is unset.
    name = next((n for n in CACHE_VARIABLES[:2] if environ.get(n)), None)
    value = environ.get(name) if name else None
    if value is None or value.startswith("~") or _under(os.path.expanduser(value), home):
        shown = f"{name}={value}" if value else "APPTAINER_CACHEDIR unset (apptainer caches in ~/.apptainer)"
        found.append(f"{shown}: under $HOME, which holds {size} on {cluster.title}; set it under the project area")
    for name, value in runtime_env.items():
        if value.startswith(("~", "$HOME", "${HOME}")) or _under(value, home):
            found.append(
                f"runtime_env.{name}: {value} is under $HOME ({size} on {cluster.title}); use the project area"
            )
    return found


def unverified_lines(cluster: Cluster) -> list[str]:
    """The site file's guesses, named, and a billing formula the site has not confirmed."""
    found = []
    if cluster.unverified:
        found.append(
            f"site {cluster.title}: unverified in config/sites/{cluster.name}.yaml: {', '.join(cluster.unverified)}"
        )
    if not cluster.billing_verified:
        found.append(
            f"site {cluster.title}: billing formula unverified ({cluster.billing_source}): the bill is an estimate"
        )
    return found

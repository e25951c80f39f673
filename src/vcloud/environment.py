"""The process environment a training or evaluation run needs on its cluster, set by vcloud
itself; below every layer that starts torch (train, evaluation, apply), above none of them.

Rules pass the workflow config's `runtime_env` as `--env KEY=VALUE` options; `apply` sets
them before torch is imported (the HIP allocator reads PYTORCH_HIP_ALLOC_CONF once, at its
first allocation, and RCCL/NCCL read NCCL_*/FI_CXI_* at init). "{node}" and "{user}" in a value
expand to the SLURM node index and the user name, so that MIOpen's SQLite caches live on
node-local storage, one per node (seed 003: Lustre handles their locks badly).
"""

from __future__ import annotations

import getpass
import logging
import os
import shutil
import subprocess
from collections.abc import Iterable, MutableMapping

from vcloud.errors import ConfigError

log = logging.getLogger(__name__)

# Values that name a folder the process should find existing.
_FOLDERS = ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR")


def parse_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """["A=1", "B=x=y"] -> {"A": "1", "B": "x=y"}; ConfigError naming a malformed pair."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name or not name.replace("_", "").isalnum() or name[0].isdigit():
            raise ConfigError(f"--env {pair!r}: expected NAME=VALUE with NAME a variable name")
        out[name] = value
    return out


def expand(value: str, environ: MutableMapping[str, str]) -> str:
    node = environ.get("SLURM_NODEID") or "0"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry inside some containers
        user = environ.get("USER", "user")
    return value.replace("{node}", node).replace("{user}", user)


def apply(settings: dict[str, str], environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set every variable (expanded) and create the cache folders; returns what was set."""
    done = {name: expand(value, environ) for name, value in settings.items()}
    environ.update(done)
    for name in _FOLDERS:
        if name in done:
            os.makedirs(done[name], exist_ok=True)
    return done


def gpu_tool() -> str:
    """The vendor's state tool for the torch build: rocm-smi under ROCm, nvidia-smi under CUDA."""
    import torch

    return "rocm-smi" if getattr(torch.version, "hip", None) else "nvidia-smi"


def log_gpu_state(local_rank: int, tool: str | None = None) -> None:
    """Local rank 0 logs rocm-smi or nvidia-smi (seed 003's smoke test) when the tool is there."""
    if local_rank != 0:
        return
    name = tool or gpu_tool()
    path = shutil.which(name)
    if path is None:
        log.info("%s: not on PATH, GPU state not logged", name)
        return
    try:
        out = subprocess.run([path], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("%s: %s", name, err)
        return
    log.info("%s (exit %d):\n%s", name, out.returncode, (out.stdout + out.stderr).rstrip())


def check_bf16(bf16: bool, device: str, *, where: str, capability=None, name: str | None = None) -> None:
    """bf16 on a CUDA GPU below compute capability 8.0 (P100, V100) is refused at start, as the
    doctor refuses it before submission: torch.cuda.is_bf16_supported() says yes there, through
    emulation. ROCm (MI250X) and the CPU pass. `capability`/`name`: the device's, for tests."""
    if not bf16 or not str(device).startswith("cuda"):
        return
    import torch

    if getattr(torch.version, "hip", None):
        return
    major, minor = capability or torch.cuda.get_device_capability(device)
    if (major, minor) >= (8, 0):
        return
    gpu = name or torch.cuda.get_device_name(device)
    raise ConfigError(
        f"{where}: {gpu} (compute capability {major}.{minor}) has no bf16 (emulated only); set train.bf16: false "
        "in the model config, or run on a GPU of compute capability >= 8.0"
    )


def cpu_budget(environ: MutableMapping[str, str] = os.environ) -> int:
    """The cores this job may use: OMP_NUM_THREADS (snakemake sets it to the rule's threads),
    else the CPUs this process is bound to (SLURM's --cpus-per-task on a node)."""
    value = environ.get("OMP_NUM_THREADS", "").strip()
    if value:
        try:
            threads = int(value)
        except ValueError:
            raise ConfigError(f"OMP_NUM_THREADS={value!r} is not a whole number of threads") from None
        if threads >= 1:
            return threads
    return len(os.sched_getaffinity(0))


def step_threads(workers: int, environ: MutableMapping[str, str] = os.environ) -> int:
    """Torch intra-op threads of a CPU training step next to `workers` DataLoader processes.

    Each worker takes a core (torch gives workers one thread each), so the step gets the rest,
    at least one. Measured on 2 cores with 1 worker: the stage-2 epoch took 11.0 s with 2 step
    threads (3 busy threads on 2 cores) and 6.3 s with 1.
    """
    return max(1, cpu_budget(environ) - max(0, workers))

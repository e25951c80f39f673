"""Distributed set-up: who am I (rank, world, local rank), where is rank 0, and the process group.

Where the numbers come from, first match wins:

1. torchrun (or any launcher that exports RANK and WORLD_SIZE): RANK, WORLD_SIZE,
   LOCAL_RANK (else SLURM_LOCALID), MASTER_ADDR, MASTER_PORT. These win over SLURM_*:
   `srun torchrun ...` runs several ranks per SLURM task, and some job-step / container
   paths strip SLURM_* variables while the torchrun ones always reach the process.
2. SLURM with more than one task (`srun -n N`, N > 1): SLURM_PROCID, SLURM_NTASKS,
   SLURM_LOCALID. MASTER_ADDR from the environment when set (on LUMI the rule computes it
   outside the container with `scontrol show hostname $SLURM_NODELIST | head -n1`, as the
   container has no SLURM tools), else the first host of SLURM_STEP_NODELIST /
   SLURM_JOB_NODELIST / SLURM_NODELIST, expanded here by `expand_hostlist`. MASTER_PORT
   from the environment, else 29500 + SLURM_JOB_ID % 1000 (two jobs sharing a node do
   not collide unless their ids are 1000 apart).
3. Anything else (including a single-task SLURM job): one process, rank 0 of 1.

A missing or invalid value raises ConfigError naming the variable. Caveat: a process
started by the batch script itself rather than by srun still sees SLURM_NTASKS > 1 and
SLURM_PROCID=0; it would wait for ranks that never come until init times out.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import torch

from vcloud.errors import ConfigError

DEFAULT_PORT_BASE = 29500
VISIBLE_DEVICE_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: Literal["torchrun", "slurm", "single"]


SINGLE = DistEnv(
    rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=DEFAULT_PORT_BASE, source="single"
)


def detect(environ: Mapping[str, str] = os.environ) -> DistEnv:
    """Rank, world size, local rank and rank 0's address from the launcher's variables."""
    if "RANK" in environ or "WORLD_SIZE" in environ:
        return _from_torchrun(environ)
    if "SLURM_NTASKS" in environ and _int(environ, "SLURM_NTASKS", minimum=1) > 1:
        return _from_slurm(environ)
    return SINGLE


def _from_torchrun(environ: Mapping[str, str]) -> DistEnv:
    world = _int(environ, "WORLD_SIZE", minimum=1)
    rank = _int(environ, "RANK", minimum=0)
    if rank >= world:
        raise ConfigError(f"environment variable RANK: {rank} is not below WORLD_SIZE {world}")
    if "LOCAL_RANK" in environ:
        local_rank = _int(environ, "LOCAL_RANK", minimum=0)
    elif "SLURM_LOCALID" in environ:  # RANK/WORLD_SIZE exported from SLURM_* by a start script
        local_rank = _int(environ, "SLURM_LOCALID", minimum=0)
    elif world == 1:
        local_rank = 0
    else:
        raise ConfigError("environment variable LOCAL_RANK: not set (nor SLURM_LOCALID)")
    if world == 1:  # a launcher that ran one process: no rendezvous needed
        addr = environ.get("MASTER_ADDR", SINGLE.master_addr)
        port = _port(environ, "MASTER_PORT") if "MASTER_PORT" in environ else SINGLE.master_port
    else:
        addr = _str(environ, "MASTER_ADDR")
        port = _port(environ, "MASTER_PORT")
    return DistEnv(
        rank=rank, world_size=world, local_rank=local_rank, master_addr=addr, master_port=port, source="torchrun"
    )


def _from_slurm(environ: Mapping[str, str]) -> DistEnv:
    world = _int(environ, "SLURM_NTASKS", minimum=1)
    rank = _int(environ, "SLURM_PROCID", minimum=0)
    if rank >= world:
        raise ConfigError(f"environment variable SLURM_PROCID: {rank} is not below SLURM_NTASKS {world}")
    local_rank = _int(environ, "SLURM_LOCALID", minimum=0)
    if environ.get("MASTER_ADDR", "").strip():
        addr = environ["MASTER_ADDR"].strip()
    else:
        name = next(
            (n for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if environ.get(n)), None
        )
        if name is None:
            raise ConfigError(
                "environment variable MASTER_ADDR: not set, and no SLURM_JOB_NODELIST "
                "or SLURM_NODELIST to take the first host from"
            )
        try:
            addr = expand_hostlist(environ[name])[0]
        except ValueError as err:
            raise ConfigError(f"environment variable {name}: {err}") from None
    if "MASTER_PORT" in environ:
        port = _port(environ, "MASTER_PORT")
    else:
        job_name = "SLURM_JOB_ID" if "SLURM_JOB_ID" in environ else "SLURM_JOBID"
        if job_name not in environ:
            raise ConfigError(
                "environment variable SLURM_JOB_ID: not set (needed to derive MASTER_PORT; or set MASTER_PORT)"
            )
        port = DEFAULT_PORT_BASE + _int(environ, job_name, minimum=0) % 1000
    return DistEnv(
        rank=rank, world_size=world, local_rank=local_rank, master_addr=addr, master_port=port, source="slurm"
    )


def _str(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise ConfigError(f"environment variable {name}: not set")
    return value


def _int(environ: Mapping[str, str], name: str, *, minimum: int) -> int:
    text = _str(environ, name)
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"environment variable {name}: {text!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"environment variable {name}: {value} is below {minimum}")
    return value


def _port(environ: Mapping[str, str], name: str) -> int:
    port = _int(environ, name, minimum=1)
    if port > 65535:
        raise ConfigError(f"environment variable {name}: {port} is not a TCP port (1..65535)")
    return port


# --- SLURM hostlists --------------------------------------------------------------------------

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """Expand SLURM hostlist syntax, in order: "nid[005001-005003,005007],nid006000" ->
    ["nid005001", "nid005002", "nid005003", "nid005007", "nid006000"].

    A range keeps the zero padding of its lower bound ("[08-10]" -> 08, 09, 10); several
    bracket groups in one name expand as a product, the last group fastest
    ("r[1-2]n[1-2]" -> r1n1, r1n2, r2n1, r2n2). Raises ValueError on malformed text.
    """
    hosts: list[str] = []
    for item in _split_top_level(text.strip()):
        if not item:
            raise ValueError(f"empty host name in {text!r}")
        names = [""]
        for match in re.finditer(r"([^\[\]]*)(?:\[([^\[\]]*)\])?", item):
            literal, group = match.groups()
            names = [n + literal for n in names]
            if group is not None:
                names = [n + v for n in names for v in _expand_group(group, text)]
        hosts.extend(names)
    if not hosts:
        raise ValueError("empty host list")
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unmatched ']' in {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unmatched '[' in {text!r}")
    items.append(text[start:])
    return items if text else []


def _expand_group(group: str, text: str) -> list[str]:
    values = []
    for part in group.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise ValueError(f"bad range {part!r} in {text!r}")
        low, high = match.group(1), match.group(2)
        if high is None:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"range {part!r} runs backwards in {text!r}")
        width = len(low)
        values.extend(f"{n:0{width}d}" for n in range(int(low), int(high) + 1))
    return values


# --- process group ----------------------------------------------------------------------------


def init_process_group(env: DistEnv, *, device: str, timeout_s: float = 600) -> None:
    """Join the process group (NCCL/RCCL on "cuda", gloo on CPU); nothing to do for one process."""
    import torch.distributed as dist

    if env.world_size == 1 or (dist.is_available() and dist.is_initialized()):
        return
    os.environ["MASTER_ADDR"] = env.master_addr
    os.environ["MASTER_PORT"] = str(env.master_port)
    backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl":
        # Before init so NCCL binds this rank's GCD; the modulo covers both layouts on LUMI:
        # every GCD visible (index = local rank) or one per task (index 0).
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    dist.init_process_group(
        backend, init_method="env://", rank=env.rank, world_size=env.world_size, timeout=timedelta(seconds=timeout_s)
    )


def device_for(env: DistEnv) -> str:
    """ "cuda" whenever a GPU is visible (ROCm maps it), else "cpu"; the GCD is set at init."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def is_main(env: DistEnv) -> bool:
    """Rank 0: the only rank that logs and writes files."""
    return env.rank == 0


def _active() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    import torch.distributed as dist

    if not _active():
        return
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def destroy() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, device: str | torch.device | None = None) -> torch.Tensor:
    """Sum of `tensor` over all ranks, returned on the tensor's own device; the input is unchanged.

    The collective runs on `device` (default: the current GPU for NCCL/RCCL, the CPU for gloo).
    """
    import torch.distributed as dist

    if not _active():
        return tensor.clone()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    work = tensor.detach().to(device, copy=True)
    dist.all_reduce(work, op=dist.ReduceOp.SUM)
    return work.to(tensor.device)


def all_reduce_sum_fn(device: str | torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """all_reduce_sum bound to `device`: the `reduce_fn` of MetricAccumulator.compute."""
    return functools.partial(all_reduce_sum, device=device)


def all_reduce_mean(value: float, device: str | torch.device) -> float:
    """Mean of a Python number over all ranks (float64 on the wire); the value itself alone."""
    if not _active():
        return float(value)
    import torch.distributed as dist

    total = all_reduce_sum(torch.tensor([float(value)], dtype=torch.float64), device)
    return float(total.item()) / dist.get_world_size()


def any_rank(flag: bool, device: str | torch.device) -> bool:
    """True on every rank when `flag` is True on at least one (e.g. a StopRequest).

    Ranks must leave the training loop at the same step, or the others block in the next
    collective until the timeout; so a stop signal is agreed on before acting on it.
    """
    if not _active():
        return bool(flag)
    return all_reduce_sum(torch.tensor([1.0 if flag else 0.0]), device).item() > 0


# --- reporting --------------------------------------------------------------------------------


def cpu_affinity_mask() -> str:
    """This process's CPU affinity as a hex mask ("fe00" = cores 9-15), "n/a" where unknown."""
    if not hasattr(os, "sched_getaffinity"):  # macOS, Windows
        return "n/a"
    return format(sum(1 << cpu for cpu in os.sched_getaffinity(0)), "x")


def describe(env: DistEnv, device: str, *, environ: Mapping[str, str] = os.environ) -> str:
    """One log line: which rank runs where, which GPUs it sees, which cores it may use."""
    import socket

    visible = " ".join(f"{name}={environ.get(name, '-')}" for name in VISIBLE_DEVICE_VARS)
    where = device
    if device == "cuda" and torch.cuda.is_available():
        where = f"cuda:{torch.cuda.current_device()} of {torch.cuda.device_count()}"
        if getattr(torch.version, "hip", None):
            where += f" (hip {torch.version.hip})"
        elif torch.version.cuda:
            where += f" (cuda {torch.version.cuda})"
    return (
        f"rank {env.rank}/{env.world_size} local {env.local_rank} ({env.source}) on "
        f"{socket.gethostname()} master {env.master_addr}:{env.master_port} device {where} "
        f"{visible} cpu affinity {cpu_affinity_mask()}"
    )

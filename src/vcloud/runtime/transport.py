"""`vcloud rccl-check`: does RCCL reach the Slingshot network through the aws-ofi-rccl plugin?

A failed plugin load falls back to TCP sockets without a word, and multi-node collectives run
3-4x slower (seed 003). LUMI's PyTorch page says what the logs show when it works, with
`NCCL_DEBUG=INFO`: "NCCL INFO NET/OFI Using aws-ofi-rccl" and "Selected Provider is cxi". This
command joins the ranks of its job (torchrun or SLURM environment, as `vcloud train` does),
runs one all-reduce with RCCL's INFO log written to files, and on rank 0 fails (exit 2, one
line) unless every rank's log shows both lines. The dev-g rehearsal runs it on 8 GCDs.

Without a GPU (CPU torch, gloo) there is no RCCL log: the check fails, as it must.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from vcloud.errors import BadInputError
from vcloud.io import atomic_write_text

PLUGIN = re.compile(r"NET/OFI Using aws-ofi-[rn]ccl")
PROVIDER = re.compile(r"Selected [Pp]rovider is cxi")
# NCCL's own choice of network, one line per communicator: "NCCL INFO Using network IB" (or the
# older "Using internal Network IB"), "... Socket" when it fell back to TCP, "... AWS Libfabric"
# or "... OFI" through the aws-ofi-nccl plugin; "NET/IB : Using [0]mlx5_0:1/IB" names the HCAs.
NETWORK = re.compile(r"Using (?:internal )?[Nn]etwork (\w[\w ]*)")
IB_DEVICE = re.compile(r"NET/IB ?: Using \[\d+\]")
SOCKETS = "Socket"


def transport_problems(logs: dict[str, str], expect: str = "cxi") -> list[str]:
    """One line per rank log (name -> text) that shows another transport than `expect`: cxi
    (the aws-ofi plugin and the cxi provider), ib (NCCL's own InfiniBand), or unverified (any
    network but TCP sockets). A silent fall-back to sockets fails on every site."""
    if not logs:
        return ["no RCCL log at all (NCCL_DEBUG=INFO wrote nothing: no GPU, or not RCCL)"]
    problems = []
    for name, text in sorted(logs.items()):
        networks = {match.strip() for match in NETWORK.findall(text)}
        if expect == "cxi":
            missing = [
                what for what, pattern in (("aws-ofi-rccl", PLUGIN), ("cxi", PROVIDER)) if not pattern.search(text)
            ]
            if missing:
                problems.append(f"{name}: no {' and no '.join(missing)} line")
        elif SOCKETS in networks:
            problems.append(f"{name}: NCCL fell back to TCP sockets (Using network Socket), not {expect}")
        elif expect == "ib" and not ("IB" in networks or IB_DEVICE.search(text)):
            problems.append(f"{name}: no InfiniBand line (Using network IB)")
        elif expect != "ib" and not networks:
            problems.append(f"{name}: no line naming NCCL's network (Using network ...)")
    return problems


def evidence(logs: dict[str, str], limit: int = 4) -> list[str]:
    lines = [
        line.strip()
        for text in logs.values()
        for line in text.splitlines()
        if PLUGIN.search(line) or PROVIDER.search(line)
    ]
    return lines[:limit]


def run_check(*, log_dir: Path, out: Path, expect: str = "cxi") -> dict:
    """All-reduce once with RCCL's INFO log in log_dir; rank 0 writes `out` and judges."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    # Before torch initialises RCCL: its log, per host and process, in files we can read.
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    os.environ["NCCL_DEBUG_FILE"] = str(log_dir / "rccl.%h.%p.log")

    import torch

    from vcloud.train import distributed

    env = distributed.detect()
    device = distributed.device_for(env)
    distributed.init_process_group(env, device=device)
    try:
        value = distributed.all_reduce_sum(torch.ones(1, device=device), device)
        if round(float(value)) != env.world_size:
            raise BadInputError(f"rccl-check: all-reduce gave {float(value)} on {env.world_size} ranks")
        distributed.barrier()
    finally:
        distributed.destroy()
    report = {
        "world_size": env.world_size,
        "device": device,
        "devices_visible": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "hip": getattr(torch.version, "hip", None),
        "cuda": None if getattr(torch.version, "hip", None) else torch.version.cuda,
    }
    if not distributed.is_main(env):
        return report
    logs = {path.name: path.read_text(errors="replace") for path in sorted(log_dir.glob("rccl.*.log"))}
    problems = transport_problems(logs, expect=expect)
    report.update(ok=not problems, problems=problems, evidence=evidence(logs), logs=sorted(logs))
    # A failed check leaves its report beside the output, never as the output (taken as done).
    target = Path(out) if not problems else Path(out).with_name(Path(out).name + ".failed")
    atomic_write_text(target, json.dumps(report, indent=2) + "\n")
    if problems:
        if expect == "cxi":
            what = "RCCL did not use the aws-ofi-rccl plugin over cxi"
            fix = "check cluster.binds (/opt/cray) and cluster.containlibs (libcxi)"
        else:
            what = f"NCCL did not use {'InfiniBand' if expect == 'ib' else 'a fast network'}"
            fix = "the image needs libibverbs for InfiniBand, and NCCL_IB_DISABLE must not be set"
        raise BadInputError(
            f"rccl-check: {what} ({problems[0]}; {len(problems)} rank logs in {log_dir}): multi-node "
            f"collectives would fall back to TCP sockets; {fix}"
        )
    return report

"""Where a stage-1 (CFDT) training step spends its time on the device: torch.profiler over a
few steps at the configuration's shapes, as bench_gpu.py times them.

    python bench/profile_stage1.py [--config config/models/full.yaml] [--steps 3] [--warmup 2]
                                   [--size 256] [--dates 16]   # smaller shapes for a CPU smoke run

Prints one JSON object: the wall time of a step, the device's busy time in it (the sum of its
kernels: a step far longer than that is bound by the host launching kernels, not by the GPU),
kernels per step, the operators that take the most device time, and the same step with
`grad_checkpoint` the other way round (`without_grad_checkpoint` where the config checkpoints, as
tiny_models.yaml does; `with_grad_checkpoint` where it does not, as config/models/full.yaml):
time and peak memory, what the recomputation costs and saves.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).parent))
from bench_gpu import raw_batch, started, sync, timed_steps, with_wind  # noqa: E402
from common import emit  # noqa: E402
from vcloud.config import load_model_config  # noqa: E402
from vcloud.data.samples import finish_batch  # noqa: E402
from vcloud.models.cfdt import CFDT  # noqa: E402
from vcloud.train import optim  # noqa: E402
from vcloud.train.stages import cfdt_draft  # noqa: E402


def device_time(event) -> float:
    """Self device time of a profiler row in microseconds (the name changed across torch versions)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def profiled(cfg, *, device: str, size: int, dates: int, steps: int, warmup: int) -> dict:
    generator = torch.Generator(device=device).manual_seed(0)
    model = with_wind(cfg, CFDT(cfg.stage1.model), size).to(device)
    params = list(model.parameters())
    optimizer = optim.build_optimizer(params, cfg.stage1.train)
    b = cfg.stage1.train.batch_size
    autocast = torch.autocast(
        "cuda" if device == "cuda" else "cpu", dtype=torch.bfloat16, enabled=cfg.stage1.train.bf16
    )

    def step() -> None:
        batch = finish_batch(raw_batch(b, dates, size, device, generator))
        with autocast:
            loss = F.l1_loss(cfdt_draft(model, batch), batch["target"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.stage1.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, cfg.stage1.train.grad_clip)
        optimizer.step()

    for _ in range(warmup):
        step()
    sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync(device)
        wall = (time.perf_counter() - start) / steps
    rows = prof.key_averages()
    kernels = [e for e in prof.events() if device == "cuda" and e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels) / 1e6 / steps
    top = sorted(rows, key=device_time if device == "cuda" else (lambda e: e.self_cpu_time_total), reverse=True)
    return {
        "batch": b,
        "step_wall_s": round(wall, 4),
        "device_busy_s_per_step": round(busy, 4) if device == "cuda" else None,
        "kernels_per_step": len(kernels) // steps if device == "cuda" else None,
        "top_ops": [
            {
                "op": e.key,
                "calls_per_step": e.count // steps,
                "self_device_ms_per_step": round(device_time(e) / 1e3 / steps, 2),
                "self_cpu_ms_per_step": round(e.self_cpu_time_total / 1e3 / steps, 2),
            }
            for e in top[:20]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("config/models/full.yaml"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--dates", type=int, help="input dates (default: data.input_dates)")
    args = parser.parse_args()
    cfg = load_model_config(args.config)
    dates = args.dates or cfg.data.input_dates
    cfg = dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, input_dates=dates, crop=None if args.size == 256 else args.size)
    )
    device, result = started(args.config, size=args.size, dates=dates)
    result["profiled"] = profiled(cfg, device=device, size=args.size, dates=dates, steps=args.steps, warmup=args.warmup)
    # The same step with checkpointing the other way round: the recomputation's cost and saving.
    model_cfg = cfg.stage1.model
    flipped = not model_cfg.optimisations.grad_checkpoint
    other = dataclasses.replace(
        model_cfg, optimisations=dataclasses.replace(model_cfg.optimisations, grad_checkpoint=flipped)
    )
    cfg_other = dataclasses.replace(cfg, stage1=dataclasses.replace(cfg.stage1, model=other))
    generator = torch.Generator(device=device).manual_seed(0)
    model = with_wind(cfg_other, CFDT(other), args.size).to(device)
    b = cfg.stage1.train.batch_size
    result["with_grad_checkpoint" if flipped else "without_grad_checkpoint"] = timed_steps(
        model,
        lambda m, x: F.l1_loss(cfdt_draft(m, x), x["target"]),
        list(model.parameters()),
        cfg.stage1.train,
        lambda: raw_batch(b, dates, args.size, device, generator),
        device=device,
        steps=args.steps,
        warmup=args.warmup,
    )
    emit(result)


if __name__ == "__main__":
    main()

"""What the S1 validity channel costs a stage-1 training step: the CFDT with x's 17 channels
(13 S2, 2 S1, S1 validity, cloud probability) against the same CFDT with 16 (no validity channel,
as before issue #27), same weights otherwise, same batch, forward + backward + AdamW step.

    python bench/bench_s1_mask.py [--config config/models/small.yaml] [--batch 4] [--dates 4]
                                  [--size 32] [--steps 20] [--device cpu]

The two variants alternate step by step, in turns first (after warm-up), so a busy machine slows
both alike; prints one JSON object with the median step time of each and their ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vcloud.config import load_model_config
from vcloud.constants import OUTPUT_CHANNELS, SAMPLE_CHANNELS
from vcloud.models import cfdt as cfdt_module
from vcloud.models.cfdt import CFDT

ROOT = Path(__file__).resolve().parents[1]


def step_time(model, optimizer, x, days, target_index, truth, device) -> float:
    # The 16-channel x of before has its cloud probability one channel earlier (no validity channel).
    cfdt_module.CLOUD_CHANNEL = x.shape[2] - 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    loss = F.l1_loss(model(x, days, target_index), truth)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "config/models/small.yaml")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dates", type=int, default=4)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    cfg = load_model_config(args.config).stage1.model
    cfg = dataclasses.replace(cfg, wind_scan=False)  # the scan orders are the same either way
    variants = {}
    for name, channels in (
        ("without_validity_channel", SAMPLE_CHANNELS - 1),
        ("with_validity_channel", SAMPLE_CHANNELS),
    ):
        torch.manual_seed(0)
        model = CFDT(cfg, in_channels=channels).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        g = torch.Generator().manual_seed(0)
        x = torch.rand(args.batch, args.dates, channels, args.size, args.size, generator=g).to(device)
        days = torch.linspace(-60.0, 60.0, args.dates).expand(args.batch, -1).contiguous().to(device)
        target_index = torch.zeros(args.batch, dtype=torch.long, device=device)
        truth = torch.rand(args.batch, OUTPUT_CHANNELS, args.size, args.size, generator=g).to(device)
        variants[name] = (model, optimizer, x, days, target_index, truth)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for step in range(args.steps + 3):
        order = list(variants.items())
        for name, (model, optimizer, *batch) in order if step % 2 else order[::-1]:  # neither always first
            seconds = step_time(model, optimizer, *batch, device)
            if step >= 3:  # warm-up
                times[name].append(seconds)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        json.dumps(
            {
                "config": str(args.config),
                "batch": args.batch,
                "dates": args.dates,
                "size": args.size,
                "steps": args.steps,
                "device": str(device),
                "threads": torch.get_num_threads(),
                "median_step_s": {k: round(v, 4) for k, v in medians.items()},
                "ratio": round(medians["with_validity_channel"] / medians["without_validity_channel"], 4),
                "date": time.strftime("%Y-%m-%d"),
                "machine": platform.machine(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

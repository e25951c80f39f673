"""Quality and speed of the four stages on the test split, next to the two baselines.

    snakemake --cores all            # trains the default (synthetic, small) pipeline first
    python bench/bench_stages.py [--results results] [--config config/models/small.yaml]

Quality: PSNR/SSIM/SAM/MAE/RMSE on fixed, seeded synthetic clouds (thin, thick, opaque) on
the clear dates of the test split, for the least-cloudy-date and temporal-median-mosaic
baselines, the stage-1 draft, the stage-2 refinement and the stage-3 student; stage 0 is an
autoencoder and is scored on reconstructing the clear target. Speed: samples/s and the
fraction of step time spent waiting for data, from each stage's metrics.jsonl (last epoch).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from vcloud.config import load_model_config
from vcloud.data.samples import CloudySamples
from vcloud.models.autoencoder import Autoencoder
from vcloud.models.cfdt import CFDT
from vcloud.train.baselines import least_cloudy, median_mosaic
from vcloud.train.metrics import MetricAccumulator, compute_all
from vcloud.train.stages import EVAL_KINDS, build_pipeline, load_frozen

TEST_SEED = 2024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--config", type=Path, default=Path("config/models/small.yaml"))
    parser.add_argument("--samples", type=int, default=48)
    args = parser.parse_args()
    cfg = load_model_config(args.config)
    ckpt = {n: args.results / f"stage{n}/best.pt" for n in range(4)}
    torch.manual_seed(0)
    samples = CloudySamples(
        args.results / "prepared/test.zarr", dates=cfg.data.input_dates, length=args.samples,
        seed=TEST_SEED, clear_max_cover=cfg.data.clear_max_cover, kinds=EVAL_KINDS,
    )  # fmt: skip
    autoencoder = load_frozen(Autoencoder(cfg.stage0.model), ckpt[0], stage=0)
    pipeline = build_pipeline(cfg, stage0_ckpt=ckpt[0], stage1_ckpt=ckpt[1])
    pipeline.load_state_dict(torch.load(ckpt[2], weights_only=True)["model"])
    pipeline.eval()
    student = load_frozen(CFDT(cfg.stage1.model), ckpt[3], stage=3)
    methods = {
        "least_cloudy_date": lambda b: least_cloudy(b["x"], b["target_index"]),
        "median_mosaic": lambda b: median_mosaic(b["x"], b["target_index"]),
        "stage1_draft": lambda b: pipeline.cfdt(b["x"], b["days"], b["target_index"]).clamp(0, 1),
        "stage2_refined": lambda b: pipeline.sample(b, steps=cfg.stage2.model.sample_steps, seed=TEST_SEED),
        "stage3_student": lambda b: student(b["x"], b["days"], b["target_index"]).clamp(0, 1),
        "stage0_reconstruction_of_clear_target": lambda b: autoencoder(b["target"]).clamp(0, 1),
    }
    results: dict[str, dict] = {}
    with torch.no_grad():
        for name, method in methods.items():
            acc = MetricAccumulator()
            start = time.perf_counter()
            for batch in DataLoader(samples, batch_size=8):
                acc.update(compute_all(method(batch).float(), batch["target"]))
            results[name] = {k: round(v, 3) for k, v in acc.compute().items()}
            results[name]["samples_per_s"] = round(len(samples) / (time.perf_counter() - start), 1)
    training = {}
    for n in range(4):
        last = json.loads((args.results / f"stage{n}/metrics.jsonl").read_text().splitlines()[-1])
        training[f"stage{n}"] = {
            "train_samples_per_s": round(last["samples_per_s"], 2),
            "data_wait_fraction": round(last["data_wait_fraction"], 4),
            "epoch_s": round(last["epoch_s"], 1),
        }
    print(json.dumps({"benchmark": "stages", "test_samples": len(samples), "config": str(args.config),
                      "quality": results, "training": training, "date": time.strftime("%Y-%m-%d")},
                     indent=2))  # fmt: skip


if __name__ == "__main__":
    main()

"""Quality and speed of the four stages on the test split, next to the two baselines.

    snakemake --cores all            # trains the default (synthetic, small) pipeline first
    python bench/bench_stages.py [--results results] [--config config/models/small.yaml]
                                 [--stage0 PATH ... --stage3 PATH] [--store PATH] [--wind-cache PATH]

Quality: PSNR/SSIM/SAM/MAE/RMSE on fixed, seeded synthetic clouds (thin, thick, opaque) on
the clear dates of the test split, for the least-cloudy-date and temporal-median-mosaic
baselines, the stage-1 draft, the stage-2 refinement and the stage-3 self-trained refinement; stage 0 is an
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
from vcloud.evaluation.baselines import least_cloudy, median_mosaic
from vcloud.evaluation.metrics import MetricAccumulator, compute_all
from vcloud.evaluation.predict import build_predictor
from vcloud.registry import STAGES
from vcloud.train.stages import EVAL_KINDS
from vcloud.wind.stage_orders import load_wind_orders

TEST_SEED = 2024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--config", type=Path, default=Path("config/models/small.yaml"))
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--store", type=Path, help="test store (default: RESULTS/prepared/test.zarr)")
    for stage in STAGES:
        parser.add_argument(f"--{stage.name}", type=Path, help=f"best.pt (default: RESULTS/{stage.folder}/best.pt)")
    parser.add_argument("--wind-cache", type=Path, help="scan orders (default: RESULTS/wind/scan_orders.npz)")
    args = parser.parse_args()
    cfg = load_model_config(args.config)
    # Explicit paths win; the defaults are the default run's layout (the folders train_stage<n> write).
    ckpt = {s.number: getattr(args, s.name) or args.results / s.folder / "best.pt" for s in STAGES}
    store = args.store or args.results / "prepared/test.zarr"
    wind = load_wind_orders(
        cfg,
        store=store,
        wind_cache=args.wind_cache or args.results / "wind/scan_orders.npz",
        world_size=1,
        command="bench_stages.py",
    )
    torch.manual_seed(0)
    samples = CloudySamples(
        store,
        dates=cfg.data.input_dates,
        length=args.samples,
        seed=TEST_SEED,
        clear_max_cover=cfg.data.clear_target_max_cover,
        kinds=EVAL_KINDS,
    )
    methods = {
        "least_cloudy_date": lambda b: least_cloudy(b["x"], b["target_index"]),
        "median_mosaic": lambda b: median_mosaic(b["x"], b["target_index"]),
    }
    for stage in sorted(STAGES, key=lambda s: (s.number == 0, s.number)):  # stage 0 last, as before
        predict = build_predictor(stage.number, cfg, ckpt, wind if stage.reads_wind else None)
        # What each stage's prediction is called: <name>_<registry label> (stage0_reconstruction_of_...).
        name = f"{stage.name}_{stage.label.replace(' ', '_').replace('-', '_')}" if stage.label else stage.name
        methods[name] = lambda b, predict=predict: predict(b).clamp(0, 1)
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
    for stage in STAGES:
        last = json.loads((ckpt[stage.number].parent / "metrics.jsonl").read_text().splitlines()[-1])
        training[stage.name] = {
            "train_samples_per_s": round(last["samples_per_s"], 2),
            "data_wait_fraction": round(last["data_wait_fraction"], 4),
            "epoch_s": round(last["epoch_s"], 1),
        }
    print(
        json.dumps(
            {
                "benchmark": "stages",
                "test_samples": len(samples),
                "config": str(args.config),
                "quality": results,
                "training": training,
                "date": time.strftime("%Y-%m-%d"),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

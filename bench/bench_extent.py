"""A scene of any extent: seconds per square kilometre to prepare it and to predict one date of it,
and predict against a floor measured in the same run: the model's forward alone over the same
patches, in the same batches, from tensors already in memory.

A synthetic scene (smooth fields, 13 bands, 10 m pixels on EPSG:32633; a cloud on the target date)
written by rasterio as a user's plain folder, cut by `vcloud prepare` into overlapping patches and
blended back by `vcloud predict` into one COG (docs/predict.md). Models of --config with fresh
weights (speed does not depend on training), the wind scan off. Prints one JSON object.

    python bench/bench_extent.py [--height 1000 --width 700 --size 256] [--stage 1] [--device cuda]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import emit, fresh_models  # noqa: E402

DATES = ("20190301", "20190311", "20190321")
TARGET = "2019-03-11"
PIXEL_M = 10.0


def write_scene(root: Path, height: int, width: int) -> None:
    """root/S2/T33_<date>.tif (13 bands uint16, a cloud on the middle date), root/S1/S1_<date>.tif."""
    import numpy as np
    import rasterio
    from rasterio.transform import from_origin

    (root / "S2").mkdir(parents=True, exist_ok=True)
    (root / "S1").mkdir(exist_ok=True)
    common = {
        "driver": "GTiff",
        "height": height,
        "width": width,
        "crs": "EPSG:32633",
        "transform": from_origin(500000.0, 5000000.0, PIXEL_M, PIXEL_M),
        "tiled": True,
        "compress": "deflate",
    }
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = 1500 + 500 * np.sin(yy / 37.0) + 400 * np.cos(xx / 23.0)
    for i, date in enumerate(DATES):
        s2 = np.stack([base * (0.8 + 0.03 * b) + 50 * i for b in range(13)]).astype(np.uint16)
        if i == 1:
            s2[:, (yy - height / 2) ** 2 + (xx - width / 2) ** 2 < (min(height, width) / 3) ** 2] = 6000
        with rasterio.open(root / "S2" / f"T33_{date}.tif", "w", count=13, dtype="uint16", **common) as dst:
            dst.write(s2)
        with rasterio.open(root / "S1" / f"S1_{date}.tif", "w", count=2, dtype="float32", **common) as dst:
            dst.write(np.stack([np.full_like(base, -10.0), np.full_like(base, -17.0)]))


def forward_floor(store: Path, config: Path, checkpoints: dict, *, stage: int, batch_size: int, device: str) -> float:
    """Seconds of the model's forward alone over the patches predict makes, in its batches."""
    import torch

    from vcloud.apply.plan import batches, plan_jobs, read_batch, roi_names
    from vcloud.config import load_model_config
    from vcloud.data.shards import ShardReader
    from vcloud.evaluation.predict import build_predictor

    cfg = load_model_config(config)
    reader = ShardReader(store)
    jobs = plan_jobs(reader, rois=roi_names(reader), input_dates=cfg.data.input_dates, min_cover=0.0, dates=[TARGET])
    predictor = build_predictor(stage, cfg, {n: checkpoints[n] for n in range(1, stage + 1)}, None)
    dev = torch.device(device)
    predictor.model.to(dev)
    inputs = [
        {k: v.to(dev) for k, v in read_batch(reader, group).tensors.items()} for group in batches(jobs, batch_size)
    ]
    start = time.perf_counter()
    with torch.no_grad():
        for tensors in inputs:
            if hasattr(predictor, "draws"):
                predictor.draws(tensors, cfg.stage2.model.ensemble).float().mean(0).cpu()
            else:
                predictor(tensors).float().cpu()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--height", type=int, default=1000)
    parser.add_argument("--width", type=int, default=700)
    parser.add_argument("--size", type=int, default=256, help="patch side (the model's)")
    parser.add_argument("--overlap", type=int, default=None, help="default: prepare's (size/8, 16..size/2)")
    parser.add_argument("--config", type=Path, default=Path(__file__).parents[1] / "config/models/small.yaml")
    parser.add_argument("--stage", type=int, default=1, choices=(1, 2))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/vcloud-bench"))
    args = parser.parse_args()

    import torch

    from vcloud.apply.run import predict
    from vcloud.data.layout import RoiId
    from vcloud.data.prepare import prepare_roi
    from vcloud.data.shards import ShardReader

    work = args.workdir / f"extent_{args.height}x{args.width}_{args.size}_{args.overlap}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    write_scene(work / "scene", args.height, args.width)
    config, checkpoints = fresh_models(args.config, work)
    store = work / "scene.zarr"
    start = time.perf_counter()
    prepare_roi(
        raw=work / "scene", roi=RoiId("ROIs9000", 1), out=store, times=len(DATES), size=args.size, overlap=args.overlap
    )
    prepare_s = time.perf_counter() - start
    patches = len(ShardReader(store))

    timings: dict = {}
    start = time.perf_counter()
    predict(
        store=store,
        out=work / "out",
        stage=args.stage,
        checkpoints={n: checkpoints[n] for n in range(1, args.stage + 1)},
        config_path=config,
        dates=[TARGET],
        batch_size=args.batch_size,
        device=args.device,
        timings=timings,
    )
    predict_s = time.perf_counter() - start
    floor_s = forward_floor(
        store, config, checkpoints, stage=args.stage, batch_size=args.batch_size, device=args.device
    )
    km2 = args.height * args.width * PIXEL_M**2 / 1e6
    emit(
        {
            "benchmark": "extent",
            "config": str(args.config),
            "stage": args.stage,
            "device": args.device,
            "threads": torch.get_num_threads(),
            "scene_px": [args.height, args.width],
            "km2": round(km2, 3),
            "patch": args.size,
            "patches": patches,
            "batch_size": args.batch_size,
            "prepare_s": round(prepare_s, 2),
            "prepare_s_per_km2": round(prepare_s / km2, 3),
            "predict_s": round(predict_s, 2),
            "predict_s_per_km2": round(predict_s / km2, 3),
            "forward_floor_s": round(floor_s, 2),
            "predict_over_floor": round(predict_s / floor_s, 2),
            "share": {name: round(timings[name], 2) for name in ("read", "model", "write")},
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
    )


if __name__ == "__main__":
    main()

"""Does scanning by wind help? Stage 1 trained with the same budget, wind scanning on and off.

Both variants share everything but `stage1.model.wind_scan` (same data, epochs, steps, seeds);
each is scored by the pipeline's own evaluation (`vcloud.evaluation.evaluate.evaluate`, fixed
protocol on the test split). Prints one JSON object: PSNR per cloud class of the target-date
input for both variants, with standard errors, and the paired difference (on - off) per class
with its standard error (samples are the unit; each sample's difference is averaged over seeds).

    python bench/bench_wind_effect.py --workdir DIR [--config config/models/small.yaml] [--seeds 0 1]

DIR must hold results/prepared/{train,val,test}.zarr; when it does not, they are made there
first with `snakemake results/prepared/{train,val,test}.zarr` (the embedded default config,
or --configfile FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
SPLITS = ("train", "val", "test")
CLASSES = ("thin", "thick", "opaque")


def ensure_splits(workdir: Path, configfile: Path | None) -> dict[str, Path]:
    stores = {split: workdir / "results" / "prepared" / f"{split}.zarr" for split in SPLITS}
    if not all(path.is_dir() for path in stores.values()):
        extra = ["--configfile", str(configfile)] if configfile else []
        subprocess.run(
            [
                sys.executable,
                "-m",
                "snakemake",
                "-s",
                str(ROOT / "Snakefile"),
                "--cores",
                "all",
                "-d",
                str(workdir),
                *extra,
                *(str(p.relative_to(workdir)) for p in stores.values()),
            ],
            cwd=workdir,
            check=True,
            capture_output=True,
            text=True,
        )
    return stores


def variant_config(base: Path, out: Path, *, wind_scan: bool, seed: int) -> Path:
    data = yaml.safe_load(base.read_text())
    data["stage1"]["model"]["wind_scan"] = wind_scan
    data["stage1"]["train"]["seed"] = seed
    # stage 1 alone, from a plain start: what differs is the wind scan (no stage-0 checkpoint here)
    data["stage1"]["init_from_stage0"] = False
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(data))
    return out


def class_stats(psnr: np.ndarray, classes: np.ndarray) -> dict:
    stats = {}
    for name in (*CLASSES, "all"):
        values = psnr if name == "all" else psnr[classes == name]
        if values.size:
            se = float(values.std(ddof=1) / np.sqrt(values.size)) if values.size > 1 else None
            stats[name] = {
                "psnr": round(float(values.mean()), 3),
                "se": None if se is None else round(se, 3),
                "n": int(values.size),
            }
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=ROOT / "config/models/small.yaml", help="model config")
    parser.add_argument("--configfile", type=Path, help="workflow config for making the split stores")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    from vcloud.config import load_model_config
    from vcloud.data.reader import StoreReader
    from vcloud.evaluation.evaluate import evaluate
    from vcloud.train.run import run_training
    from vcloud.wind.scan_orders import write_cache

    torch.set_num_threads(args.threads)
    workdir = args.workdir.resolve()
    stores = ensure_splits(workdir, args.configfile)
    bench = workdir / "bench_wind_effect"
    model = load_model_config(args.config).stage1.model
    _, _, height, width = StoreReader(stores["test"]).shape
    scale = 2 ** (len(model.widths) - 1)
    cache = bench / "scan_orders.npz"
    write_cache(cache, grid_h=height // scale, grid_w=width // scale, sectors=model.wind_sectors)

    psnr: dict[str, list[np.ndarray]] = {"on": [], "off": []}
    baseline, classes, train_s = None, None, {"on": [], "off": []}
    for seed in args.seeds:
        for name, wind_scan in (("on", True), ("off", False)):
            folder = bench / f"{name}_seed{seed}"
            config = variant_config(args.config, folder / "model.yaml", wind_scan=wind_scan, seed=seed)
            start = time.perf_counter()
            run_training(
                stage=1,
                config_path=config,
                train=stores["train"],
                val=stores["val"],
                out=folder / "stage1",
                wind_cache=cache if wind_scan else None,
                progress=False,
            )
            train_s[name].append(time.perf_counter() - start)
            report = evaluate(
                stage=1,
                store=stores["test"],
                out=folder / "eval.json",
                checkpoints={1: folder / "stage1" / "best.pt"},
                config_path=config,
                wind_cache=cache if wind_scan else None,
            )
            fixed = report["protocols"]["fixed"]
            psnr[name].append(np.asarray(fixed["model"]["per_sample"]["psnr"], dtype=np.float64))
            classes = np.asarray(fixed["cloud_class"])
            baseline = np.asarray(fixed["least_cloudy_date"]["per_sample"]["psnr"], dtype=np.float64)

    on, off = np.stack(psnr["on"]), np.stack(psnr["off"])  # (seeds, samples)
    diff = (on - off).mean(axis=0)  # per sample, averaged over seeds
    wind_known = None
    test = StoreReader(stores["test"])
    if getattr(test, "wind", None) is not None:
        wind_known = float(np.isfinite(np.asarray(test.wind)).all(axis=-1).mean())
    result = {
        "model_config": str(args.config),
        "seeds": args.seeds,
        "samples": int(on.shape[1]),
        "test_images_with_wind": wind_known,
        "psnr_wind_on": class_stats(on.mean(axis=0), classes),
        "psnr_wind_off": class_stats(off.mean(axis=0), classes),
        "psnr_on_minus_off": class_stats(diff, classes),
        "per_seed_mean_on_minus_off": [round(float(d), 3) for d in (on - off).mean(axis=1)],
        "least_cloudy_baseline": class_stats(baseline, classes),
        "stage1_train_s": {k: [round(v, 1) for v in vals] for k, vals in train_s.items()},
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "torch": torch.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""`vcloud predict` speed: outputs (location-dates) per second, and the share of the time spent
reading the store, in the model, and writing the COGs and the manifest.

One synthetic ROI (bench/common.py) prepared once, stage-1 and stage-2 models of --config with
fresh weights (speed does not depend on training; the refiner's output head gets small random
weights, else the untrained refiner's all-zero head skips its passes), the wind scan off (no
cache to build). Prints one JSON object.

    python bench/bench_predict.py [--patches 4 --times 30 --size 256] [--device cuda] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import ROI, add_tree_arguments, emit, fresh_models, make_raw  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_tree_arguments(parser)
    parser.add_argument("--config", type=Path, default=Path(__file__).parents[1] / "config/models/small.yaml")
    parser.add_argument("--stage", type=int, default=2, choices=(1, 2))
    parser.add_argument("--draws", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--min-cover", type=float, default=0.05)
    args = parser.parse_args()
    emit(
        measure_predict(
            workdir=args.workdir,
            patches=args.patches,
            times=args.times,
            size=args.size,
            config_path=args.config,
            stage=args.stage,
            draws=args.draws,
            batch_size=args.batch_size,
            device=args.device,
            min_cover=args.min_cover,
        )
    )


def measure_predict(
    *,
    workdir: Path,
    patches: int,
    times: int,
    size: int,
    config_path: Path,
    stage: int,
    draws: int | None,
    batch_size: int,
    device: str,
    min_cover: float,
) -> dict:
    """`vcloud predict`'s own code (apply.run.predict) on the synthetic ROI: the figures above."""
    import torch

    from vcloud.apply.run import predict
    from vcloud.data.prepare import prepare_roi

    work = workdir / f"predict_{patches}x{times}x{size}"
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store.zarr"
    if not store.is_dir():
        raw = make_raw(workdir, patches=patches, times=times, size=size)
        prepare_roi(raw=raw, roi=ROI, out=store, times=times, size=size)
    config, checkpoints = fresh_models(config_path, work)

    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    timings: dict = {}
    start = time.perf_counter()
    predict(
        store=store,
        out=out,
        stage=stage,
        checkpoints={n: checkpoints[n] for n in range(1, stage + 1)},
        config_path=config,
        draws=draws,
        batch_size=batch_size,
        device=device,
        min_cover=min_cover,
        timings=timings,
    )
    wall = time.perf_counter() - start
    outputs = timings["outputs"]
    loop = timings["read"] + timings["model"] + timings["write"]
    return {
        "benchmark": "predict",
        "config": str(config_path),
        "stage": stage,
        "device": device,
        "threads": torch.get_num_threads(),
        "patch": size,
        "dates": times,
        "locations": patches,
        "batch_size": batch_size,
        "draws": draws,
        "outputs": outputs,
        "wall_s": round(wall, 2),
        "outputs_per_s": round(outputs / wall, 3),
        "km2_per_s": round(outputs * (size * 10 / 1000) ** 2 / wall, 3),  # 10 m pixels
        "share": {name: round(timings[name] / loop, 3) for name in ("read", "model", "write")},
        "setup_s": round(wall - loop, 2),
    }


if __name__ == "__main__":
    main()

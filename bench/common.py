"""Shared set-up for the data benchmarks: one synthetic ROI at full patch size, prepared once."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from vcloud.data.layout import RoiId

ROI = RoiId("ROIs1158", 119)


def add_tree_arguments(parser) -> None:
    """The synthetic ROI both data benchmarks use: size of the tree and where it lives."""
    parser.add_argument("--patches", type=int, default=4)
    parser.add_argument("--times", type=int, default=30)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/vcloud-bench"))


def make_raw(workdir: Path, *, patches: int, times: int, size: int) -> Path:
    from vcloud.data.synthetic import write_raw_tree

    raw = workdir / f"raw_{patches}x{times}x{size}"
    if not (raw / ROI.rois).is_dir():
        write_raw_tree(raw, rois=[ROI], patches=patches, times=times, size=size, seed=0)
    return raw


def raw_files(raw: Path) -> list[Path]:
    return sorted((raw / ROI.rois / str(ROI.roi)).glob("S[12]/*/*.tif"))


def machine() -> dict:
    import os

    return {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()}


def emit(result: dict) -> None:
    result["date"] = time.strftime("%Y-%m-%d")
    result.update(machine())
    print(json.dumps(result, indent=2))


def fresh_models(config: Path, work: Path) -> tuple[Path, dict]:
    """The config without the wind scan, and stage-1/2 checkpoints of fresh weights."""
    import torch
    import yaml

    from vcloud.config import load_model_config
    from vcloud.models.build import build_cfdt, build_refiner
    from vcloud.train.checkpoint import checkpoint_meta, save_checkpoint

    models = yaml.safe_load(config.read_text())
    models["stage1"]["model"]["wind_scan"] = False
    path = work / "models.yaml"
    path.write_text(yaml.safe_dump(models))
    cfg = load_model_config(path)
    torch.manual_seed(0)
    checkpoints = {1: work / "stage1.pt", 2: work / "stage2.pt"}
    save_checkpoint(
        checkpoints[1], {**checkpoint_meta(stage=1, config_hash="b"), "model": build_cfdt(cfg).state_dict()}
    )
    refiner = build_refiner(cfg)
    with torch.no_grad():
        refiner.head[-1].weight.normal_(0.0, 0.05)  # an all-zero head would skip the refiner's passes
    save_checkpoint(checkpoints[2], {**checkpoint_meta(stage=2, config_hash="b"), "model": refiner.state_dict()})
    return path, checkpoints

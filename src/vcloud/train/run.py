"""`vcloud train --stage N`: parse -> build -> train -> close (in finally)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from vcloud.config import config_hash, load_model_config, stage_config_dict
from vcloud.errors import ConfigError
from vcloud.runtime.env import log_gpu_state
from vcloud.train import distributed

log = logging.getLogger(__name__)

def load_wind_orders(cfg, *, stage: int, train: Path, wind_cache: Path | None, world_size: int):
    """The wind cache for a wind-scanning CFDT, checked against the data's whole-patch token grid
    (training crops scan in the orders restricted to their window: models/wind_scan.py)."""
    model = cfg.stage1.model
    if stage == 0 or not model.wind_scan:
        return None
    from vcloud.data.reader import StoreReader
    from vcloud.wind.cache import get_scan_orders

    if wind_cache is None and not (model.wind_allow_recompute and world_size == 1):
        raise ConfigError(f"vcloud train --stage {stage}: stage1.model.wind_scan is on; pass --wind-cache FILE")
    _, _, height, width = StoreReader(train).shape
    scale = 2 ** (len(model.widths) - 1)  # the CFDT's coarsest level
    return get_scan_orders(
        wind_cache or Path("<no --wind-cache>"), grid_h=height // scale, grid_w=width // scale,
        sectors=model.wind_sectors, world_size=world_size, allow_recompute=model.wind_allow_recompute,
    )  # fmt: skip


def run_training(
    *,
    stage: int,
    config_path: Path,
    train: Path,
    val: Path,
    out: Path,
    resume_dir: Path | None = None,
    checkpoints: dict[int, Path] | None = None,
    wind_cache: Path | None = None,
    progress: bool = True,
) -> dict:
    from vcloud.train import stages
    from vcloud.train.trainer import Trainer

    cfg = load_model_config(config_path)
    checkpoints = checkpoints or {}
    needed = {2: (0, 1), 3: (0, 1, 2)}.get(stage, ())
    missing = [f"--stage{n}" for n in needed if n not in checkpoints]
    if missing:
        raise ConfigError(f"vcloud train --stage {stage} needs {' and '.join(missing)} CHECKPOINT")
    env = distributed.detect()
    # Before any collective: every rank reads the same file, or every rank fails here alone
    # (never a recompute under DDP - that is what deadlocked 16 to 400 GPUs on LUMI).
    wind = load_wind_orders(cfg, stage=stage, train=train, wind_cache=wind_cache, world_size=env.world_size)
    device = distributed.device_for(env)
    distributed.init_process_group(env, device=device)
    try:
        log.info(distributed.describe(env, device))
        log_gpu_state(env.local_rank)
        stage_cfg = getattr(cfg, f"stage{stage}")
        torch.manual_seed(stage_cfg.train.seed)  # identical initial weights on every rank
        kwargs = {"train": train, "val": val}
        if stage >= 1:
            kwargs["wind"] = wind
        if stage >= 2:
            kwargs.update(stage0_ckpt=checkpoints[0], stage1_ckpt=checkpoints[1])
        if stage == 3:
            kwargs.update(stage2_ckpt=checkpoints[2], device=device)
        task = getattr(stages, f"stage{stage}")(cfg, **kwargs)
        picked = stage_config_dict(cfg, stage)
        trainer = Trainer(
            task,
            train_cfg=stage_cfg.train,
            data_cfg=cfg.data,
            out_dir=out,
            resume_dir=resume_dir,
            config_hash=config_hash(picked),
            config={"model_set": cfg.name, "source": str(config_path), **picked},
            env=env,
            device=device,
            progress=progress,
        )
        return trainer.fit()
    finally:
        distributed.destroy()

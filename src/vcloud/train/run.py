"""`vcloud train --stage N`: parse -> build -> train -> close (in finally)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from vcloud.config import config_hash, load_model_config, stage_config_dict
from vcloud.errors import ConfigError
from vcloud.train import distributed

log = logging.getLogger(__name__)

def run_training(
    *,
    stage: int,
    config_path: Path,
    train: Path,
    val: Path,
    out: Path,
    resume_dir: Path | None = None,
    checkpoints: dict[int, Path] | None = None,
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
    device = distributed.device_for(env)
    distributed.init_process_group(env, device=device)
    try:
        log.info(distributed.describe(env, device))
        stage_cfg = getattr(cfg, f"stage{stage}")
        torch.manual_seed(stage_cfg.train.seed)  # identical initial weights on every rank
        kwargs = {"train": train, "val": val}
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

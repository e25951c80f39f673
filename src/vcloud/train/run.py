"""`vcloud train --stage N`: parse -> build -> train -> close (in finally).

The resume key (train/checkpoint.py resume_key) is made here: the stage hash (data, own
settings, upstream identities, transitively) and the digests of the upstream best.pt given
as --stage<n>, so a latest.pt trained against other upstream weights is never resumed.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from vcloud.bands import model_bands
from vcloud.config import config_hash, load_model_config, stage_config_dict
from vcloud.data.store import check_bands
from vcloud.environment import check_bf16, cpu_budget, log_gpu_state, step_threads
from vcloud.registry import get_stage
from vcloud.train import distributed
from vcloud.wind.stage_orders import load_wind_orders

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
    wind_cache: Path | None = None,
    progress: bool = True,
    fresh: bool = False,
) -> dict:
    """fresh: set an existing latest.pt aside (renamed, kept) and train from the start."""
    from vcloud.train import checkpoint as ckpt
    from vcloud.train.trainer import Trainer

    spec = get_stage(stage)
    cfg = load_model_config(config_path)
    for store in (train, val):  # before anything is built: one line naming store and both band lists
        check_bands(store, model_bands(cfg), model=f"the model of {config_path}")
    upstream = spec.upstream_checkpoints(checkpoints or {}, cfg)
    upstream_weights = {n: ckpt.weights_digest(path) for n, path in upstream.items()}
    env = distributed.detect()
    # Before any collective: every rank reads the same file, or every rank fails here alone
    # (never a recompute under DDP - that is what deadlocked 16 to 400 GPUs on LUMI).
    wind = None
    if spec.reads_wind:
        wind = load_wind_orders(
            cfg, store=train, wind_cache=wind_cache, world_size=env.world_size, command=f"vcloud train --stage {stage}"
        )
    device = distributed.device_for(env)
    train_threads = None
    if device == "cpu":
        # Every core of the job outside the training loop (setup, pseudo-labels, validation); in the
        # loop the step leaves its DataLoader workers their cores instead of oversubscribing them.
        torch.set_num_threads(cpu_budget())
        train_threads = step_threads(cfg.data.num_workers)
    distributed.init_process_group(env, device=device)
    try:
        log.info(
            "%s; torch threads %d (training steps %s)",
            distributed.describe(env, device),
            torch.get_num_threads(),
            train_threads or "the same",
        )
        log_gpu_state(env.local_rank)
        stage_cfg = getattr(cfg, spec.name)
        check_bf16(stage_cfg.train.bf16, device, where=f"{config_path}: {spec.name}.train.bf16")
        torch.manual_seed(stage_cfg.train.seed)  # identical initial weights on every rank
        task = spec.build(cfg, train=train, val=val, checkpoints=upstream, wind=wind, device=device)
        picked = stage_config_dict(cfg, stage)
        stage_hash = config_hash(picked)
        trainer = Trainer(
            task,
            train_cfg=stage_cfg.train,
            data_cfg=cfg.data,
            out_dir=out,
            resume_dir=resume_dir,
            config_hash=stage_hash,
            resume_key=ckpt.resume_key(stage_hash, upstream_weights),
            fresh=fresh,
            config={
                "model_set": cfg.name,
                "source": str(config_path),
                **picked,
                "upstream_weights": {f"stage{n}": digest for n, digest in upstream_weights.items()},
            },
            env=env,
            device=device,
            progress=progress,
            step_threads=train_threads,
        )
        return trainer.fit()
    finally:
        distributed.destroy()

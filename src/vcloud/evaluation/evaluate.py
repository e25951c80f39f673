"""`vcloud evaluate`: a stage's metrics on a prepared store, next to two baselines.

Per protocol (evaluation/protocols.py: fixed and reference): PSNR, SSIM, SAM, MAE, RMSE per
sample and averaged, also per cloud class of the target-date input, for the stage and for the
least-cloudy-date and median-mosaic baselines on the same samples (evaluation/scoring.py).
Stage 0 (the autoencoder) is scored on reconstructing the ground truth. The checkpoints are
explicit paths (`--stage<n>`), those registry.Stage.predictor_needs names.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from vcloud.config import load_model_config
from vcloud.evaluation.predict import build_predictor
from vcloud.evaluation.protocols import EVAL_SEED, ReferenceSamples, fixed_samples
from vcloud.evaluation.scoring import score, table
from vcloud.io import atomic_write_json
from vcloud.registry import get_stage, require_checkpoints
from vcloud.wind.stage_orders import load_wind_orders

log = logging.getLogger(__name__)


def evaluate(*, stage: int, store: Path, out: Path, checkpoints: dict[int, Path], config_path: Path,
             wind_cache: Path | None = None, samples: int | None = None) -> dict:  # fmt: skip
    command = f"vcloud evaluate --stage {stage}"
    needed = require_checkpoints(get_stage(stage).predictor_needs, checkpoints, command=command)
    cfg = load_model_config(config_path)
    torch.manual_seed(EVAL_SEED)
    wind = None
    if get_stage(stage).reads_wind:
        wind = load_wind_orders(cfg, store=store, wind_cache=wind_cache, world_size=1, command=command)
    predict = build_predictor(stage, cfg, needed, wind)
    report = {
        "stage": stage,
        "store": str(store),
        "config": str(config_path),
        "protocols": {
            "fixed": score(fixed_samples(store, cfg, samples=samples), predict),
            "reference": score(ReferenceSamples(store, dates=cfg.data.input_dates), predict),
        },
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, report, indent=1)
    log.info("stage %d evaluation on %s:\n%s", stage, store, table(report))
    return report

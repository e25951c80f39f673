"""Predictors: a finished stage's checkpoints -> a function batch -> (B, 13, H, W) S2 image.

Each predictor carries its torch module as `.model` (built on the CPU; `predict.model.to(device)`
moves it, wind orders included) and, where it samples, `.draws(batch, n)` (vcloud predict).

Each takes (cfg, checkpoints, wind) with `checkpoints` = {stage number: best.pt path}, exactly
the stages registry.Stage.predictor_needs names (the paths come from the caller's arguments,
never from a results-folder convention). A checkpoint of another stage is refused with one line.
"""

from __future__ import annotations

from pathlib import Path

from vcloud.config import ModelSetConfig
from vcloud.evaluation.protocols import EVAL_SEED
from vcloud.models.build import build_autoencoder, build_cfdt
from vcloud.pipeline import build_draft_under_refiner, build_pipeline, draft_prediction, install_wind_orders
from vcloud.registry import get_stage
from vcloud.weights import load_frozen, load_stage_weights


def autoencoder(cfg: ModelSetConfig, checkpoints: dict[int, Path], wind):
    """Stage 0: the autoencoder's reconstruction of the ground truth."""
    ((stage, path),) = checkpoints.items()
    model = load_frozen(build_autoencoder(cfg), path, stage=stage)
    predict = lambda batch: model(batch["target"])
    predict.model = model
    return predict


def draft(cfg: ModelSetConfig, checkpoints: dict[int, Path], wind):
    """Stage 1: the CFDT's draft of the target date, its seen pixels kept (pipeline.keep_seen)."""
    ((stage, path),) = checkpoints.items()
    cfdt = install_wind_orders(load_frozen(build_cfdt(cfg), path, stage=stage), wind)
    predict = lambda batch: draft_prediction(cfdt, batch, cfg.data.keep_seen_max_prob)
    predict.model = cfdt
    return predict


def refined(cfg: ModelSetConfig, checkpoints: dict[int, Path], wind):
    """Stage 2: the stage-1 draft plus the mean of `stage2.model.ensemble` few-step DDIM
    samples of its pixel residual from the stage-2 refiner, all drawn from EVAL_SEED."""
    (refiner_stage,) = sorted(set(checkpoints) - {1})  # 2, or a later stage that fine-tunes the refiner
    pipeline = build_pipeline(cfg, stage1_ckpt=checkpoints[1], wind=wind)
    pipeline.load_state_dict(load_stage_weights(checkpoints[refiner_stage], stage=refiner_stage))
    return _sampled(pipeline, cfg)


def redrafted(cfg: ModelSetConfig, checkpoints: dict[int, Path], wind):
    """Stage 3: its own draft model (the CFDT fine-tuned on natural pairs and pseudo-labels)
    refined by the stage-2 refiner, as `refined` (the same sampler, seed and ensemble)."""
    pipeline = build_draft_under_refiner(
        cfg, draft_ckpt=checkpoints[3], draft_stage=3, stage2_ckpt=checkpoints[2], wind=wind
    )
    return _sampled(pipeline, cfg)


def _sampled(pipeline, cfg: ModelSetConfig):
    """batch -> the mean of `stage2.model.ensemble` few-step DDIM samples of `pipeline`, from EVAL_SEED.

    For vcloud predict: `draws` samples whose mean is the prediction (with draws =
    stage2.model.ensemble: exactly `predict`'s), their spread the uncertainty. Predictors without
    it are deterministic."""
    pipeline.eval()
    steps = cfg.stage2.model.sample_steps
    predict = lambda batch: pipeline.sample(batch, steps=steps, seed=EVAL_SEED)
    predict.model = pipeline
    predict.draws = lambda batch, draws: pipeline.draws(batch, steps=steps, seed=EVAL_SEED, ensemble=draws)
    return predict


def build_predictor(stage: int, cfg: ModelSetConfig, checkpoints: dict[int, Path], wind):
    """Stage `stage`'s predictor from {stage number: best.pt} (the registry says which it uses)."""
    return get_stage(stage).make_predictor(cfg, checkpoints, wind)

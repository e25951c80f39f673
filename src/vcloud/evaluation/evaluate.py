"""`vcloud evaluate`: a stage's metrics on a prepared store, next to three baselines.

Per protocol (evaluation/protocols.py: fixed and reference; evaluation/uncrtaints.py: the
published one, set in the model config's `evaluation.uncrtaints`): PSNR, SSIM, SAM, MAE, RMSE
per sample and averaged, also per cloud class of the target-date input, for the stage and for
the least-cloudy-date, median-mosaic and nearest-clear-date baselines on the same samples, and
the paired differences stage - baseline with their standard errors (evaluation/scoring.py).
Each protocol's `protocol` entry names its setup (T, region; for uncrtaints the coverage window,
the pairing file or "computed", and how often the target is among the inputs).
Stage 0 (the autoencoder) is scored on reconstructing the ground truth. The checkpoints are
explicit paths (`--stage<n>`), those registry.Stage.predictor_needs names.

The fixed protocol's s2cloudless detection on the clouded targets is read from the file of
`vcloud fixed-protocol` when one is given (`--fixed-protocol`, evaluation/fixed_protocol.py; the
workflow makes it once for every stage), else done here; the numbers are the same.

With `without_s1` (vcloud evaluate --without-s1) every date of every sample has its S1 removed,
marked missing exactly as in a store without S1 (data/samples.WithoutS1): what a user without S1
gets; the report says so (`without_s1`).

A store on which protocol uncrtaints has no sample (fewer dates than T, no location of the
region) is still evaluated: that protocol is reported as not run, with the reason. A bad
pairing file stops the evaluation with one line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from vcloud.bands import model_bands
from vcloud.config import ModelSetConfig, load_model_config
from vcloud.data.samples import WithoutS1
from vcloud.data.shards import ShardReader
from vcloud.data.store import check_bands
from vcloud.errors import BadInputError
from vcloud.evaluation.predict import build_predictor
from vcloud.evaluation.protocols import EVAL_SEED, fixed_samples, reference_samples
from vcloud.evaluation.scoring import score, table
from vcloud.evaluation.series_baselines import WithSeries
from vcloud.evaluation.uncrtaints import UncrtaintsSamples
from vcloud.io import atomic_write_json
from vcloud.pipeline import EVAL_KINDS
from vcloud.registry import get_stage, require_checkpoints
from vcloud.wind.stage_orders import load_wind_orders

log = logging.getLogger(__name__)


def evaluate(
    *,
    stage: int,
    store: Path,
    out: Path,
    checkpoints: dict[int, Path],
    config_path: Path,
    wind_cache: Path | None = None,
    samples: int | None = None,
    uncrtaints_pairs: Path | None = None,
    fixed_protocol: Path | None = None,
    without_s1: bool = False,
) -> dict:
    """Score stage `stage` on every protocol; `uncrtaints_pairs` overrides evaluation.uncrtaints.pairs;
    `fixed_protocol`: the detection of `vcloud fixed-protocol` for this store and config;
    `without_s1`: S1 removed from every date of every sample."""
    command = f"vcloud evaluate --stage {stage}"
    needed = require_checkpoints(get_stage(stage).predictor_needs, checkpoints, command=command)
    cfg = load_model_config(config_path)
    torch.manual_seed(EVAL_SEED)
    reader = ShardReader(store)  # opened once, handed to every protocol
    check_bands(store, model_bands(cfg), model=f"the model of {config_path}", have=reader.s2_bands)
    wind = None
    if get_stage(stage).reads_wind:
        wind = load_wind_orders(cfg, store=reader, wind_cache=wind_cache, world_size=1, command=command)
    uncrtaints = uncrtaints_samples(reader, cfg, pairs=uncrtaints_pairs)  # a bad pairing file fails first
    fixed_set = fixed_samples(reader, cfg, samples=samples, detected=fixed_protocol)  # and a bad detection file
    predict = build_predictor(stage, cfg, needed, wind)
    threshold = {"nearest_clear_max_cover": cfg.evaluation.nearest_clear_max_cover}
    series = {"window_days": cfg.evaluation.series_window_days, "clear_max_cover": threshold["nearest_clear_max_cover"]}

    def samples_of(dataset, *, ours: bool = False):
        """The protocol's samples as scored: S1 removed (--without-s1), the series baselines on ours."""
        dataset = WithSeries(dataset, **series) if ours else dataset  # S2 and cloud only: S1 plays no part
        return WithoutS1(dataset) if without_s1 else dataset

    dates = cfg.data.input_dates
    context = {"context": cfg.data.context.sampler_kwargs(), "series_window_days": series["window_days"]}
    fixed = {
        "protocol": "fixed",
        "dates": dates,
        "region": "all",
        "cloud_kinds": list(EVAL_KINDS),
        "clear_max_cover": cfg.data.clear_target_max_cover,
        "seed": EVAL_SEED,
        **context,
    }
    reference = reference_samples(reader, cfg)
    protocols = {
        "fixed": {"protocol": fixed, **score(samples_of(fixed_set, ours=True), predict, **threshold)},
        "reference": {
            "protocol": {
                "protocol": "reference",
                "dates": dates,
                "region": "all",
                "truths_per_location": "all" if reference.every_clear_date else cfg.evaluation.reference_truths,
                **context,
            },
            **score(samples_of(reference, ours=True), predict, **threshold),
        },
    }
    if isinstance(uncrtaints, UncrtaintsSamples):
        protocols["uncrtaints"] = {
            "protocol": uncrtaints.describe(),
            **score(samples_of(uncrtaints), predict, **threshold),
        }
    else:  # this store has no sample of the protocol: said, not fatal
        protocols["uncrtaints"] = {
            "protocol": uncrtaints_setup(cfg, pairs=uncrtaints_pairs),
            "samples": 0,
            "unavailable": uncrtaints,
        }
    report = {
        "stage": stage,
        "store": str(store),
        "config": str(config_path),
        "without_s1": without_s1,
        "protocols": protocols,
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, report, indent=1)
    log.info("stage %d evaluation on %s%s:\n%s", stage, store, " without S1" if without_s1 else "", table(report))
    return report


def uncrtaints_setup(cfg: ModelSetConfig, *, pairs: Path | None = None) -> dict:
    """The protocol's settings as the report names them (pairs: the file, or "computed")."""
    setup = cfg.evaluation.uncrtaints
    path = pairs if pairs is not None else setup.pairs
    return {
        "protocol": "uncrtaints",
        "dates": setup.dates,
        "region": setup.region,
        "min_cov": setup.min_cov,
        "max_cov": setup.max_cov,
        "pairs": "computed" if path is None else str(path),
    }


def uncrtaints_samples(store, cfg: ModelSetConfig, *, pairs: Path | None = None) -> UncrtaintsSamples | str:
    """The protocol's samples on `store` (a path or the open reader), or why the store has none (a
    bad pairing file raises)."""
    setup = cfg.evaluation.uncrtaints
    path = pairs if pairs is not None else setup.pairs
    try:
        return UncrtaintsSamples(
            store,
            dates=setup.dates,
            region=setup.region,
            min_cov=setup.min_cov,
            max_cov=setup.max_cov,
            pairs=None if path is None else Path(path),
        )
    except BadInputError as err:
        if path is not None:
            raise
        log.warning("protocol uncrtaints not run on %s: %s", store, err)
        return str(err)

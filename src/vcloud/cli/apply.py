"""The commands that apply a trained model: predict, the bundle it can read, the viewer."""

from __future__ import annotations

import argparse
from pathlib import Path

from vcloud.cli._common import (
    FIXED_PROTOCOL_HELP,
    add_bundle_flag,
    add_checkpoint_flags,
    add_env_flag,
    checkpoints,
    model_of,
    start_unresumable,
)
from vcloud.registry import STAGE_NUMBERS


def add_predict(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="reconstruct cloudy dates of a prepared store as Cloud-Optimized GeoTIFFs")
    p.add_argument(
        "--stage",
        type=int,
        choices=(1, 2, 3),
        help="the stage whose predictor is used (required unless --bundle; default: the bundle's)",
    )
    p.add_argument("--store", type=Path, required=True, help="any prepared store: a split or one ROI's")
    p.add_argument(
        "--out", type=Path, required=True, help="folder: GeoTIFFs, mosaics/, manifest.json (docs/predict.md)"
    )
    add_checkpoint_flags(p, STAGE_NUMBERS, "the ones the stage's predictor needs")
    p.add_argument("--config", type=Path, help="config/models/*.yaml the stages used (required unless --bundle)")
    p.add_argument("--wind-cache", type=Path, help="wind-scanner cache (when stage1.model.wind_scan)")
    add_bundle_flag(p)
    p.add_argument("--dates", nargs="+", metavar="YYYY-MM-DD", help="dates to reconstruct (default: the cloudy ones)")
    p.add_argument("--min-cover", type=float, default=0.05, help="default dates: cloud cover above this (0.05)")
    p.add_argument(
        "--draws",
        type=int,
        help="stages 2-3: diffusion draws averaged (default: stage2.model.ensemble); "
        ">= 2 also writes their per-pixel spread",
    )
    p.add_argument("--batch-size", type=int, default=8, help="images per model call (8)")
    p.add_argument("--device", help="torch device (default: cuda when there is one, else cpu)")
    p.add_argument(
        "--clear-pixels",
        choices=("observed", "model"),
        default="observed",
        help="pixels the cloud mask calls clear: the observed reflectance (default) or the model's",
    )
    add_env_flag(p)
    p.set_defaults(func=run_predict)


def run_predict(args: argparse.Namespace) -> None:
    import shlex

    start_unresumable(args)
    from vcloud.apply.run import predict

    with model_of(args, "vcloud predict") as model:
        predict(
            store=args.store,
            out=args.out,
            stage=model.stage,
            checkpoints=model.checkpoints,
            config_path=model.config,
            wind_cache=model.wind_cache,
            dates=args.dates,
            min_cover=args.min_cover,
            draws=args.draws,
            batch_size=args.batch_size,
            device=args.device,
            clear_pixels=args.clear_pixels,
            command=shlex.join(["vcloud", *args.argv]),
            bundle=model.bundle,
        )


def add_bundle(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bundle", help="pack a trained model (weights, config, wind cache, model card) into one tar")
    p.add_argument(
        "--stage",
        type=int,
        choices=STAGE_NUMBERS,
        action="append",
        required=True,
        help="a stage to predict with; its predictor's checkpoints are packed (repeatable)",
    )
    add_checkpoint_flags(p, STAGE_NUMBERS, "the ones the stages' predictors need")
    p.add_argument("--config", type=Path, required=True, help="config/models/*.yaml the stages used")
    p.add_argument("--wind-cache", type=Path, help="wind-scanner cache (packed when stage1.model.wind_scan)")
    p.add_argument(
        "--train-store",
        type=Path,
        required=True,
        help="the training split store: the card's patch size, normalisation and training data",
    )
    p.add_argument(
        "--eval",
        type=Path,
        nargs="+",
        metavar="REPORT",
        help="results/eval/stage<n>.json of bundled stages: their figures go into the card",
    )
    p.add_argument("--out", type=Path, required=True, help="FILE.tar to write (atomically)")
    p.set_defaults(func=run_bundle)


def run_bundle(args: argparse.Namespace) -> None:
    import shlex

    from vcloud.apply.bundle import write_bundle

    manifest = write_bundle(
        out=args.out,
        stages=sorted(set(args.stage)),
        checkpoints=checkpoints(args),
        config_path=args.config,
        train_store=args.train_store,
        wind_cache=args.wind_cache,
        eval_reports=args.eval or [],
        command=shlex.join(["vcloud", *args.argv]),
    )
    print(f"{args.out}: {len(manifest['members']) + 1} members, each with its SHA-256 in vcloud-bundle.json")


def add_export_viewer(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-viewer", help="quicklooks of test samples and an offline index.html")
    p.add_argument("--store", type=Path, required=True, help="prepared store (e.g. the test split)")
    add_checkpoint_flags(p, STAGE_NUMBERS, "the shown stages 1-3 read every stage's")
    p.add_argument("--config", type=Path, help="config/models/*.yaml the stages used (required unless --bundle)")
    add_bundle_flag(p)
    p.add_argument("--out", type=Path, required=True, help="viewer folder: index.html, images/, thumbnails.png")
    p.add_argument("--samples", type=int, default=12, help="samples to show (of the evaluation's fixed protocol)")
    p.add_argument("--seed", type=int, default=0, help="which samples are shown")
    p.add_argument("--wind-cache", type=Path, help="wind-scanner cache (when stage1.model.wind_scan)")
    p.add_argument("--fixed-protocol", type=Path, metavar="PATH", help=FIXED_PROTOCOL_HELP)
    p.add_argument(
        "--comparison",
        type=Path,
        metavar="PATH",
        help="a research run's results/compare.json (vcloud compare): its tables go on the page",
    )
    p.add_argument(
        "--run",
        nargs=2,
        metavar=("EXPERIMENT", "SEED"),
        help="with --comparison: the run the checkpoints are of, named on the page (SEED - without a seeds list)",
    )
    p.set_defaults(func=run_export_viewer)


def run_export_viewer(args: argparse.Namespace) -> None:
    from vcloud.export.viewer import export_viewer

    with model_of(args, "vcloud export-viewer", needs_stage=False) as model:
        export_viewer(
            store=args.store,
            checkpoints=model.checkpoints,
            config_path=model.config,
            out=args.out,
            samples=args.samples,
            seed=args.seed,
            wind_cache=model.wind_cache,
            fixed_protocol=args.fixed_protocol,
            comparison=args.comparison,
            run=args.run,
        )

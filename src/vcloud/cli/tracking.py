"""The tracking command: every run's configs, curves and scores into one MLflow SQLite database."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_export_mlflow(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export-mlflow",
        help="every run's resolved config, per-epoch metrics and scores into one MLflow SQLite database "
        "(needs the mlflow extra)",
    )
    p.add_argument("--db", type=Path, required=True, help="the SQLite database to create or bring up to date")
    p.add_argument("--results", required=True, help="the results folder (paths.results) the run folders are in")
    p.add_argument(
        "--run",
        nargs=4,
        action="append",
        required=True,
        metavar=("EXPERIMENT", "SEED", "FOLDER", "MODEL_CONFIG"),
        help="one run, in the workflow's order (experiments, then seeds): its results folder "
        "(results/<experiment>/seed<k>, or results for a single run) and resolved model config "
        "(FOLDER/model.yaml; a single run's config.model_config); SEED '-' for the model config's own; repeatable",
    )
    p.set_defaults(func=run_export_mlflow)


def run_export_mlflow(args: argparse.Namespace) -> None:
    from vcloud.errors import BadInputError
    from vcloud.export.mlflow_db import export_mlflow
    from vcloud.export.tracking import RunSpec

    specs = []
    for experiment, seed, folder, config in args.run:
        if seed != "-" and not seed.isdigit():
            raise BadInputError(
                f"--run {experiment} {seed} {folder} {config}: SEED must be a non-negative integer or '-'"
            )
        specs.append(RunSpec(experiment, None if seed == "-" else int(seed), folder, config))
    counts = export_mlflow(specs, results=args.results, db=args.db)
    written = ", ".join(f"{counts[k]} {k}" for k in ("experiments", "runs", "params", "metrics") if counts.get(k))
    print(f"{args.db}: {len(specs)} runs exported; {written or 'nothing new'} written")

"""The report commands: training curves, evaluation tables and the run's accounting."""

from __future__ import annotations

import argparse
from pathlib import Path

from vcloud.registry import STAGES


def add_plot_curves(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot-curves", help="training curves (loss, val PSNR, samples/s) of stages as PNG")
    p.add_argument("--out", type=Path, nargs="+", required=True, help="one PNG per metrics file, in order")
    p.add_argument("--metrics", type=Path, nargs="+", required=True, help="a stage's metrics.jsonl each")
    p.set_defaults(func=run_plot_curves)


def run_plot_curves(args: argparse.Namespace) -> None:
    from vcloud.errors import ConfigError
    from vcloud.export.report import plot_curves

    if len(args.out) != len(args.metrics):
        raise ConfigError(f"vcloud plot-curves: {len(args.metrics)} --metrics files but {len(args.out)} --out PNGs")
    labels = {stage.name: f"{stage.name} ({stage.label})" for stage in STAGES}  # curves/stage<n>.png
    for metrics, out in zip(args.metrics, args.out):
        plot_curves(metrics, out, title=f"{labels.get(out.stem, out.stem)} training curves")


def add_report_tables(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report-tables", help="evaluation reports of the stages as one HTML page")
    p.add_argument("--out", type=Path, required=True, help="FILE.html to write")
    p.add_argument("--markdown", type=Path, help="also write the tables as Markdown (FILE.md)")
    p.add_argument("reports", type=Path, nargs="+", help="results/eval/stage<n>.json")
    p.set_defaults(func=run_report_tables)


def run_report_tables(args: argparse.Namespace) -> None:
    from vcloud.export.report import evaluation_tables

    evaluation_tables(args.reports, args.out, markdown=args.markdown)


def add_accounting(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("accounting", help="wall, CPU and GPU hours per rule and stage from benchmark files")
    p.add_argument("--benchmarks", type=Path, required=True, help="benchmarks folder (<rule>/*.tsv)")
    p.add_argument("--resources", required=True, help="JSON object: the workflow config's resources section")
    p.add_argument("--tsv", type=Path, required=True, help="FILE.tsv to write")
    p.add_argument("--html", type=Path, required=True, help="FILE.html to write")
    p.set_defaults(func=run_accounting)


def run_accounting(args: argparse.Namespace) -> None:
    import json

    from vcloud.errors import BadInputError
    from vcloud.export.report import accounting

    try:
        resources = json.loads(args.resources)
    except ValueError as err:
        raise BadInputError(f"--resources: not a JSON object ({err})") from err
    if not isinstance(resources, dict):
        raise BadInputError("--resources: not a JSON object of rule -> resources")
    accounting(args.benchmarks, resources, tsv=args.tsv, page=args.html)

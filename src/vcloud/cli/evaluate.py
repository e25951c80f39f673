"""The evaluation commands: a stage's metrics on a prepared store, and the stages compared."""

from __future__ import annotations

import argparse
from pathlib import Path

from vcloud.cli._common import (
    FIXED_PROTOCOL_HELP,
    add_bundle_flag,
    add_checkpoint_flags,
    add_env_flag,
    model_of,
    start_unresumable,
)
from vcloud.registry import STAGE_NUMBERS


def add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="a stage's metrics on a prepared store, next to baselines")
    p.add_argument("--stage", type=int, choices=STAGE_NUMBERS, help="required unless --bundle (default: its stage)")
    p.add_argument("--store", type=Path, required=True, help="any prepared store (e.g. the test split)")
    p.add_argument("--out", type=Path, required=True, help="FILE.json to write")
    add_checkpoint_flags(p, STAGE_NUMBERS, "the ones the stage's predictor needs")
    p.add_argument("--config", type=Path, help="config/models/*.yaml the stages used (required unless --bundle)")
    add_bundle_flag(p)
    p.add_argument("--wind-cache", type=Path, help="wind-scanner cache (when stage1.model.wind_scan)")
    p.add_argument("--samples", type=int, help="fixed-protocol samples (default: one per clear date)")
    p.add_argument(
        "--uncrtaints-pairs",
        type=Path,
        metavar="PATH",
        help="protocol uncrtaints: the released pairing file (generic_{T}_test_all_s2cloudless_mask.npy) or its "
        "JSON conversion; overrides evaluation.uncrtaints.pairs of --config",
    )
    p.add_argument("--fixed-protocol", type=Path, metavar="PATH", help=FIXED_PROTOCOL_HELP)
    p.add_argument(
        "--without-s1",
        action="store_true",
        help="remove S1 from every date of every sample, marked missing as in a store without S1: what a user "
        "without S1 gets (docs/evaluation.md)",
    )
    add_env_flag(p)
    p.set_defaults(func=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> None:
    start_unresumable(args)
    from vcloud.evaluation.evaluate import evaluate  # looked up here: tests replace it

    with model_of(args, "vcloud evaluate") as model:
        evaluate(
            stage=model.stage,
            store=args.store,
            out=args.out,
            checkpoints=model.checkpoints,
            config_path=model.config,
            wind_cache=model.wind_cache,
            samples=args.samples,
            uncrtaints_pairs=args.uncrtaints_pairs,
            fixed_protocol=args.fixed_protocol,
            without_s1=args.without_s1,
        )


def add_compare_stages(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare-stages", help="each stage against the one before it, per protocol (paired PSNR)")
    p.add_argument("--out", type=Path, required=True, help="FILE.json to write (results/eval/stages.json)")
    p.add_argument("--markdown", type=Path, help="also write the table as Markdown (FILE.md)")
    p.add_argument("reports", type=Path, nargs="+", help="results/eval/stage<n>.json of the same store")
    p.set_defaults(func=run_compare_stages)


def run_compare_stages(args: argparse.Namespace) -> None:
    from vcloud.evaluation.compare import markdown, write_comparison
    from vcloud.registry import VIEWER_STAGES

    comparison = write_comparison(args.reports, args.out, stages=VIEWER_STAGES, markdown_out=args.markdown)
    print(markdown(comparison), end="")


def add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="research runs: each experiment against a baseline over seeds, per stage and protocol"
    )
    p.add_argument("--out", type=Path, required=True, help="FILE.json to write (results/compare.json)")
    p.add_argument("--markdown", type=Path, help="also write the tables as Markdown (results/compare.md)")
    p.add_argument("--baseline", required=True, help="the experiment the others are paired with")
    p.add_argument(
        "--report",
        nargs=3,
        action="append",
        required=True,
        metavar=("EXPERIMENT", "SEED", "REPORT"),
        help="one run's evaluation report on test (results/<experiment>/seed<k>/eval/stage<n>.json, or the "
        "run's it shares); SEED '-' for a run on the model config's own seeds; repeatable",
    )
    p.add_argument(
        "--val-report",
        nargs=3,
        action="append",
        default=[],
        metavar=("EXPERIMENT", "SEED", "REPORT"),
        help="the same on val (eval/stage<n>.val.json): given, the table says designs are chosen on val; repeatable",
    )
    p.set_defaults(func=run_compare)


def run_compare(args: argparse.Namespace) -> None:
    from vcloud.errors import BadInputError
    from vcloud.evaluation.compare import runs_markdown, write_run_comparison

    def runs(flag: str, given: list) -> list:
        found = []
        for experiment, seed, path in given:
            if seed != "-" and not seed.isdigit():
                raise BadInputError(f"{flag} {experiment} {seed} {path}: SEED must be a non-negative integer or '-'")
            found.append((experiment, None if seed == "-" else int(seed), Path(path)))
        return found

    comparison = write_run_comparison(
        runs("--report", args.report),
        args.out,
        baseline=args.baseline,
        val_reports=runs("--val-report", args.val_report),
        markdown_out=args.markdown,
    )
    print(runs_markdown(comparison), end="")

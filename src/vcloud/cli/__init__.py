"""The `vcloud` command line: one subcommand per pipeline step; rules call nothing else.

Every command exits 0 on success. A VcloudError becomes one line on stderr naming the file
or key and what is wrong, and exit status 2; the command leaves no partial output behind.

One module per family of commands (data, train, evaluate, apply, cluster, site, report, tracking): each command
is an `add_<command>(sub)` that declares its arguments, beside the `run_<command>(args)` that
runs it; _common holds the flags several commands share. The run functions import what they
use, so `vcloud --help` imports no torch.
"""

from __future__ import annotations

import argparse
import logging
import sys

from vcloud import __version__
from vcloud.cli import apply, cluster, data, evaluate, report, site, tracking, train
from vcloud.errors import EXIT_REQUEUE, StopRequested, VcloudError

# The order `vcloud --help` lists them in: the pipeline's, then the cluster's and the report's.
COMMANDS = (
    data.add_synth,
    data.add_index,
    data.add_prepare,
    data.add_assemble,
    data.add_verify,
    data.add_era5_wind,
    data.add_wind_cache,
    train.add_run_config,
    train.add_train,
    evaluate.add_evaluate,
    data.add_uncrtaints_convert,
    apply.add_predict,
    apply.add_bundle,
    train.add_memory,
    cluster.add_lumi_profile,
    site.add_profile,
    site.add_sites,
    site.add_submit,
    cluster.add_image,
    cluster.add_rccl_check,
    cluster.add_rehearsal_summary,
    cluster.add_doctor,
    apply.add_export_viewer,
    data.add_fixed_protocol,
    report.add_plot_curves,
    report.add_report_tables,
    evaluate.add_compare_stages,
    evaluate.add_compare,
    tracking.add_export_mlflow,
    report.add_accounting,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vcloud", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"vcloud {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as given: manifests record it
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        args.func(args)
    except StopRequested as err:
        print(f"vcloud {args.command}: stopped: {err}", file=sys.stderr)
        return EXIT_REQUEUE
    except VcloudError as err:
        print(f"vcloud {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0

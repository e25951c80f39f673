"""Flags and helpers that several commands share: --env, --stage<n>, --bundle and the model
they select, and the wall-time warning of the commands that cannot resume."""

from __future__ import annotations

import argparse
from pathlib import Path

from vcloud.registry import STAGE_NUMBERS

FIXED_PROTOCOL_HELP = (
    "protocol fixed: the detection `vcloud fixed-protocol` made for this store and config, read instead of "
    "running s2cloudless on every clouded target (default: detect here)"
)


def add_env_flag(p: argparse.ArgumentParser) -> None:
    """--env NAME=VALUE (repeatable) of the commands that start torch: train, evaluate."""
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set before torch starts ({node}, {user} expand); repeatable",
    )


def apply_env(args: argparse.Namespace) -> None:
    """--env KEY=VALUE pairs (the workflow's runtime_env), set before torch is imported."""
    from vcloud import environment as env

    env.apply(env.parse_pairs(args.env))


def add_checkpoint_flags(p: argparse.ArgumentParser, stages, purpose: str) -> None:
    for n in stages:
        p.add_argument(f"--stage{n}", type=Path, help=f"stage {n} best.pt ({purpose})")


def checkpoints(args: argparse.Namespace) -> dict[int, Path]:
    """{n: path} of the --stage<n> flags given."""
    return {n: path for n in STAGE_NUMBERS if (path := getattr(args, f"stage{n}", None)) is not None}


def add_bundle_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bundle",
        type=Path,
        metavar="FILE.tar",
        help="a `vcloud bundle` file: its config, checkpoints and wind cache instead of --config, --stage<n> and "
        "--wind-cache; refused in one line when it is damaged or does not fit --store (docs/predict.md)",
    )


def model_of(args: argparse.Namespace, command: str, *, needs_stage: bool = True):
    """--bundle, or --config/--stage<n>/--wind-cache: apply.bundle.model_inputs (a `with` block)."""
    from vcloud.apply.bundle import model_inputs

    return model_inputs(
        bundle=args.bundle,
        store=args.store,
        stage=getattr(args, "stage", None),
        config=args.config,
        checkpoints=checkpoints(args),
        wind_cache=args.wind_cache,
        command=command,
        needs_stage=needs_stage,
    )


def _warned(signum, frame) -> None:
    import os

    # Only a write: nothing else is safe inside a signal handler.
    os.write(
        2,
        b"vcloud evaluate: SIGUSR1 (the wall time ends soon); evaluation cannot resume, "
        b"so it carries on and a timeout is resubmitted by snakemake\n",
    )


def start_unresumable(args: argparse.Namespace) -> None:
    """Evaluate and predict: the GPU rules' wall-time warning (sbatch --signal=USR1@S) would
    kill them by default, S seconds before they had to stop; they keep going (predict's
    resubmitted job resumes from its manifest). Then the runtime environment, before torch."""
    import signal

    signal.signal(signal.SIGUSR1, _warned)
    apply_env(args)

"""The training commands: one stage, and the memory estimate of a stage's training."""

from __future__ import annotations

import argparse
from pathlib import Path

from vcloud.cli._common import add_checkpoint_flags, add_env_flag, apply_env, checkpoints
from vcloud.registry import STAGE_NUMBERS, STAGES


def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one stage (resumes from latest.pt when interrupted)")
    p.add_argument("--stage", type=int, choices=STAGE_NUMBERS, required=True)
    p.add_argument("--config", type=Path, required=True, help="config/models/*.yaml")
    p.add_argument("--train", type=Path, required=True, help="prepared train store")
    p.add_argument("--val", type=Path, required=True, help="prepared val store")
    p.add_argument("--out", type=Path, required=True, help="stage folder: best.pt, latest.pt, metrics.jsonl")
    p.add_argument("--resume-dir", type=Path, help="folder of latest.pt (default: --out)")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="train from the start: set latest.pt aside as latest.<id>.pt (kept) instead of resuming (docs/resume.md)",
    )
    built_on = sorted({n for s in STAGES for n in (*s.upstream, s.init_from) if n is not None})
    add_checkpoint_flags(p, built_on, "stages that build on it")
    p.add_argument("--wind-cache", type=Path, help="wind-scanner cache (when stage1.model.wind_scan)")
    add_env_flag(p)
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> None:
    apply_env(args)
    from vcloud.train.run import run_training

    run_training(
        stage=args.stage,
        config_path=args.config,
        train=args.train,
        val=args.val,
        out=args.out,
        resume_dir=args.resume_dir,
        checkpoints=checkpoints(args),
        wind_cache=args.wind_cache,
        fresh=args.fresh,
    )


def add_run_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run-config", help="a research run's model config: a model config with an experiment's and a seed's changes"
    )
    p.add_argument("--config", type=Path, required=True, help="config/models/*.yaml the changes apply to")
    p.add_argument(
        "--changes",
        required=True,
        metavar="JSON",
        help='model-config keys to change, as a JSON mapping ({"data": {"s1_dropout": 0}}); a key the config lacks is refused',
    )
    p.add_argument("--out", type=Path, required=True, help="the resolved model config (YAML)")
    p.set_defaults(func=run_run_config)


def run_run_config(args: argparse.Namespace) -> None:
    import json

    from vcloud.config.experiments import write_run_config
    from vcloud.errors import ConfigError

    try:
        changes = json.loads(args.changes)
    except json.JSONDecodeError as err:
        raise ConfigError(f"--changes: not JSON ({err})") from None
    write_run_config(args.config, changes, args.out)


def add_memory(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("memory", help="memory estimate per component of a stage's training (default: stage 1)")
    p.add_argument("--config", type=Path, required=True, help="config/models/*.yaml")
    p.add_argument(
        "--stage",
        type=int,
        choices=STAGE_NUMBERS,
        default=1,
        help="the stage whose training is estimated (default 1: the CFDT, each optimisation on and off)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.set_defaults(func=run_memory)


def run_memory(args: argparse.Namespace) -> None:
    from vcloud.runtime.stage_memory import main as memory_main

    print(memory_main(args.config, args.json, stage=args.stage))

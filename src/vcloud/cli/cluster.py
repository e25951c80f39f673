"""The cluster commands: the LUMI profile and environment image, the transport check, the
rehearsal's summary and the doctor's pre-flight checks."""

from __future__ import annotations

import argparse
from pathlib import Path

from vcloud.cli._common import add_env_flag, apply_env
from vcloud.errors import VcloudError

REPO = Path(__file__).resolve().parents[3]  # src/vcloud/cli/cluster.py -> the checkout


def add_lumi_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lumi-profile", help="generate profiles/lumi from the cluster section of config/lumi.yaml")
    p.add_argument(
        "--config", type=Path, default=Path("config/lumi.yaml"), help="workflow config with a cluster section"
    )
    p.add_argument("--out", type=Path, default=Path("profiles/lumi/config.yaml"))
    p.add_argument("--check", action="store_true", help="fail when the profile differs, write nothing")
    p.set_defaults(func=run_lumi_profile)


def run_lumi_profile(args: argparse.Namespace) -> None:
    from vcloud.runtime.profile import write_profile

    print(write_profile(args.config, args.out, check=args.check))


def add_image(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("image", help="build the squashfs venv of every rule inside the CSC image (works on LUMI)")
    p.add_argument(
        "--config", type=Path, default=Path("config/lumi.yaml"), help="workflow config with a cluster section"
    )
    p.add_argument("--out", type=Path, help="FILE.sqsh (default: cluster.env_image)")
    p.add_argument("--runner", default="singularity", help="container runtime (singularity or apptainer)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.set_defaults(func=run_image)


def run_image(args: argparse.Namespace) -> None:
    from vcloud.runtime import image
    from vcloud.runtime.cluster import Cluster
    from vcloud.runtime.profile import load_workflow_config

    cluster = Cluster.from_config(load_workflow_config(args.config))
    if cluster is None:
        raise VcloudError(f"{args.config}: no cluster section")
    out = args.out or cluster.env_image
    if out is None:
        raise VcloudError(f"{args.config}: cluster.env_image is null; give --out FILE.sqsh")
    if args.out is None and (problem := cluster.account_problem()):
        raise VcloudError(problem)  # cluster.env_image is under the project's /projappl
    for line in image.build(
        base=cluster.image,
        repo=REPO,
        out=Path(out),
        runner=args.runner,
        dry_run=args.dry_run,
        controller=not cluster.host_installs,  # snakemake runs from the image: it carries it
    ):
        print(line)
    if not args.dry_run:
        print(f"{out}: written ({image.version_stamp(Path('.'))}); bound by every rule at /user-software")


def add_rccl_check(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rccl-check", help="one all-reduce; fail unless RCCL logs aws-ofi-rccl over cxi")
    p.add_argument("--log-dir", type=Path, required=True, help="folder for RCCL's INFO log, one file per rank")
    p.add_argument(
        "--expect",
        choices=("cxi", "ib", "unverified"),
        default="cxi",
        help="the site's transport (cluster.transport): cxi (aws-ofi over Slingshot, default), ib (NCCL's "
        "InfiniBand) or unverified (any network but TCP sockets)",
    )
    p.add_argument("--out", type=Path, required=True, help="report (JSON); written only when the check passes")
    add_env_flag(p)
    p.set_defaults(func=run_rccl_check)


def run_rccl_check(args: argparse.Namespace) -> None:
    from vcloud.runtime import transport

    apply_env(args)
    report = transport.run_check(log_dir=args.log_dir, out=args.out, expect=args.expect)
    if report.get("ok"):
        print(f"{args.out}: the collectives used {args.expect} on {report['world_size']} ranks")


def add_rehearsal_summary(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rehearsal-summary", help="the dev-g rehearsal's closing summary (pass or fail)")
    p.add_argument("--results", type=Path, required=True, help="the rehearsal's results folder")
    p.add_argument("--logs", type=Path, default=Path("logs"), help="the rules' logs folder")
    p.add_argument("--config", type=Path, required=True, help="the rehearsal's model config")
    p.add_argument("--full-config", type=Path, help="the real run's model config (its epoch sizes)")
    p.add_argument("--train-store", type=Path, help="the real training split store (its locations per epoch)")
    p.add_argument("--transport", type=Path, help="rccl-check's report (absent: the transport check did not run)")
    p.add_argument("--miopen-cache", help="MIOPEN_USER_DB_PATH of the runtime environment")
    p.add_argument("--experiment", help="a grid's rehearsal: the experiment of the one run it tried")
    p.add_argument("--seed", type=int, help="a grid's rehearsal: that run's seed")
    p.add_argument("--out", type=Path, required=True, help="summary JSON, written only when the rehearsal passed")
    p.set_defaults(func=run_rehearsal_summary)


def run_rehearsal_summary(args: argparse.Namespace) -> None:
    from vcloud.runtime import rehearsal
    from vcloud.runtime.image import MOUNT, STAMP

    stamp = None
    stamp_file = Path(MOUNT) / STAMP  # the environment image, read inside the container
    if stamp_file.is_file():
        stamp = stamp_file.read_text().strip()
    locations = 0
    if args.train_store is not None:
        from vcloud.data.store import open_store

        locations = int(open_store(args.train_store).sizes["location"])
    estimate = None
    try:
        from vcloud.config import load_model_config
        from vcloud.models.memory import estimate as memory_estimate

        estimate = round(memory_estimate(load_model_config(args.config))["cfdt_gb_configured"], 1)
    except ImportError:  # no torch where this runs
        pass
    summary = rehearsal.summarize(
        results=args.results,
        logs=args.logs,
        stamp=stamp,
        miopen_cache=args.miopen_cache,
        transport=args.transport,
        full_samples_per_epoch=rehearsal.full_epoch_samples(args.config, args.full_config, max(locations, 1)),
        train_locations=max(locations, 1),
        stage1_estimate_gb=estimate,
        run={"experiment": args.experiment, "seed": args.seed} if args.experiment else None,
    )
    print("\n".join(rehearsal.lines(summary)))
    if not summary["passed"]:  # beside the output, for the doctor: never taken as done
        rehearsal.write(summary, args.out.with_name(args.out.name + ".failed"))
        raise VcloudError(f"rehearsal: failed: {'; '.join(summary['problems'])}")
    rehearsal.write(summary, args.out)


def add_doctor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="pre-flight checks of a cluster run (one line per problem)")
    p.add_argument("--profile", type=Path, default=Path("profiles/lumi"), help="snakemake profile folder")
    p.add_argument("--config", type=Path, help="workflow config (default: the profile's configfiles)")
    p.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> None:
    from vcloud.runtime.doctor import run

    report = run(args.profile, args.config)
    print(report.text())
    if report.errors:
        raise VcloudError(f"{len(report.errors)} check(s) failed")
    print("doctor: all checks passed")

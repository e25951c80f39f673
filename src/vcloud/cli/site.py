"""The site commands: the shipped sites and what they offer, and a site's snakemake profile."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="write profiles/<site> (and ./<site>) from config/<site>.yaml and config/sites/<site>.yaml"
    )
    p.add_argument("--site", required=True, help="a site of config/sites/ (`vcloud sites` lists them)")
    p.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: here)")
    p.add_argument("--check", action="store_true", help="fail when the profile differs, write nothing")
    p.set_defaults(func=run_profile)


def run_profile(args: argparse.Namespace) -> None:
    from vcloud.runtime.profile import write_site_profile

    for line in write_site_profile(args.site, args.root, check=args.check):
        print(line)


def add_sites(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sites", help="the shipped sites: GPU partitions, GPUs, billing, what is unverified")
    p.add_argument("--root", type=Path, default=Path("."), help="the repository root (default: here)")
    p.set_defaults(func=run_sites)


def run_sites(args: argparse.Namespace) -> None:
    from vcloud.runtime.site import load_site, site_names

    for name in site_names(args.root):
        facts = load_site(name, args.root)
        gpus = [
            f"{part} ({values['gpus_per_node']} x {values['gpu']['model']}, {values['gpu']['memory_gb']:g} GB, "
            f"{values.get('arch', 'x86_64')})"
            for part, values in facts["partitions"].items()
            if values.get("gpu")
        ]
        billing = facts.get("billing") or {}
        guesses = f"; unverified: {', '.join(facts['unverified'])}" if facts.get("unverified") else ""
        print(
            f"{name}: {facts.get('title', name)}, {facts.get('vendor', 'amd')}, GPUs as "
            f"--{'gres' if facts.get('gpu_request') == 'gres' else 'gpus'}; {'; '.join(gpus)}; billed "
            f"{billing.get('formula', 'lumi')} in {billing.get('unit', 'GPU-h')}{guesses}"
        )


def add_submit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "submit", help="run the snakemake controller as a SLURM job that resubmits itself (outlives the login node)"
    )
    p.add_argument("--profile", type=Path, required=True, help="the site's profile folder (profiles/<site>)")
    p.add_argument(
        "--runtime",
        type=int,
        help="the controller job's wall time in minutes (default: its partition's, at most 2 days)",
    )
    p.add_argument(
        "snakemake_args", nargs=argparse.REMAINDER, help="after --: more snakemake arguments (targets, --configfile)"
    )
    p.set_defaults(func=run_submit)


def run_submit(args: argparse.Namespace) -> None:
    from vcloud.runtime.controller import submit

    extra = args.snakemake_args[1:] if args.snakemake_args[:1] == ["--"] else args.snakemake_args
    for line in submit(profile=args.profile, workdir=Path.cwd(), snakemake_args=extra, runtime=args.runtime):
        print(line)

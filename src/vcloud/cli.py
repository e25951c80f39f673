"""The `vcloud` command line: one subcommand per pipeline step; rules call nothing else.

Every command exits 0 on success. A VcloudError becomes one line on stderr naming the file
or key and what is wrong, and exit status 2; the command leaves no partial output behind.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from vcloud import __version__
from vcloud.errors import EXIT_REQUEUE, StopRequested, VcloudError
from vcloud.registry import STAGE_NUMBERS, STAGES

FIXED_PROTOCOL_HELP = (
    "protocol fixed: the detection `vcloud fixed-protocol` made for this store and config, read instead of "
    "running s2cloudless on every clouded target (default: detect here)"
)


def _cmd_synth(args: argparse.Namespace) -> None:
    from vcloud.data.layout import parse_roi
    from vcloud.data.synthetic import default_rois, write_raw_tree

    rois = [parse_roi(text) for text in args.roi] if args.roi else default_rois(args.rois)
    write_raw_tree(
        args.out,
        rois=rois,
        patches=args.patches,
        times=args.times,
        size=args.size,
        seed=args.seed,
        archives=args.archives,
    )


def _cmd_index(args: argparse.Namespace) -> None:
    from vcloud.data.archive import build_index, ensure_index, read_index, write_index

    for archive in args.archives:
        if args.check:
            index = read_index(archive, index_dir=args.index_dir)
        elif args.rebuild:
            index = build_index(archive, index_dir=args.index_dir)
            write_index(index)
        else:
            index = ensure_index(archive, index_dir=args.index_dir)
        print(f"{archive}: {len(index.rois)} ROIs, {index.members} members, {index.data_bytes / 1e9:.3f} GB of images")


def _cmd_prepare(args: argparse.Namespace) -> None:
    from vcloud.constants import N_TIMES
    from vcloud.data.clouds import CloudThresholds
    from vcloud.data.folder import folder_times
    from vcloud.data.layout import parse_roi
    from vcloud.data.prepare import prepare_roi

    times = args.times or folder_times(args.raw) or N_TIMES  # a plain folder: its dates
    prepare_roi(
        raw=args.raw,
        roi=parse_roi(args.roi),
        out=args.out,
        on_bad_image=args.on_bad_image,
        times=times,
        size=args.size,
        thresholds=CloudThresholds(
            clear_max_cover=args.clear_max_cover,
            thick_min_prob=args.thick_min_prob,
            opaque_min_cover=args.opaque_min_cover,
        ),
        wind_table=args.wind,
        workers=args.threads,
        index_dir=args.index_dir,
    )


def _cmd_assemble(args: argparse.Namespace) -> None:
    from vcloud.data.store import assemble

    assemble(args.stores, args.out)


def _cmd_verify(args: argparse.Namespace) -> None:
    from vcloud.data.shards import DamagedStoreError, verify

    problems = verify(args.store)
    for line in problems:
        print(line)
    if problems:
        raise DamagedStoreError(f"{args.store}: {len(problems)} damaged (listed above); prepare the ROI again")
    print(f"{args.store}: every chunk reads back and matches its checksum")


def _cmd_wind_cache(args: argparse.Namespace) -> None:
    from vcloud.wind.scan_orders import write_cache

    write_cache(
        args.out,
        grid_h=args.grid_h,
        grid_w=args.grid_w,
        sectors=args.sectors,
    )


def _cmd_era5_wind(args: argparse.Namespace) -> None:
    import json

    from vcloud.data.era5 import fetch, wind_needs
    from vcloud.data.layout import parse_roi

    needs = [
        wind_needs(args.raw, parse_roi(text), times=args.times, size=args.size, index_dir=args.index_dir)
        for text in args.roi
    ]
    print(json.dumps(fetch(args.source, needs, args.out, workers=args.workers)))


def _apply_env(args: argparse.Namespace) -> None:
    """--env KEY=VALUE pairs (the workflow's runtime_env), set before torch is imported."""
    from vcloud.runtime import env

    env.apply(env.parse_pairs(args.env))


def _checkpoints(args: argparse.Namespace) -> dict[int, Path]:
    """{n: path} of the --stage<n> flags given."""
    return {n: path for n in STAGE_NUMBERS if (path := getattr(args, f"stage{n}", None)) is not None}


def _add_env_flag(p) -> None:
    """--env NAME=VALUE (repeatable) of the commands that start torch: train, evaluate."""
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set before torch starts ({node}, {user} expand); repeatable",
    )


def _add_checkpoint_flags(p: argparse.ArgumentParser, stages, purpose: str) -> None:
    for n in stages:
        p.add_argument(f"--stage{n}", type=Path, help=f"stage {n} best.pt ({purpose})")


def _cmd_train(args: argparse.Namespace) -> None:
    _apply_env(args)
    from vcloud.train.run import run_training

    run_training(
        stage=args.stage,
        config_path=args.config,
        train=args.train,
        val=args.val,
        out=args.out,
        resume_dir=args.resume_dir,
        checkpoints=_checkpoints(args),
        wind_cache=args.wind_cache,
        fresh=args.fresh,
    )


def _warned(signum, frame) -> None:
    import os

    # Only a write: nothing else is safe inside a signal handler.
    os.write(
        2,
        b"vcloud evaluate: SIGUSR1 (the wall time ends soon); evaluation cannot resume, "
        b"so it carries on and a timeout is resubmitted by snakemake\n",
    )


def _start_unresumable(args: argparse.Namespace) -> None:
    """Evaluate and predict: the GPU rules' wall-time warning (sbatch --signal=USR1@S) would
    kill them by default, S seconds before they had to stop; they keep going (predict's
    resubmitted job resumes from its manifest). Then the runtime environment, before torch."""
    import signal

    signal.signal(signal.SIGUSR1, _warned)
    _apply_env(args)


def _model(args: argparse.Namespace, command: str, *, needs_stage: bool = True):
    """--bundle, or --config/--stage<n>/--wind-cache: apply.bundle.model_inputs (a `with` block)."""
    from vcloud.apply.bundle import model_inputs

    return model_inputs(
        bundle=args.bundle, store=args.store, stage=getattr(args, "stage", None), config=args.config,
        checkpoints=_checkpoints(args), wind_cache=args.wind_cache, command=command, needs_stage=needs_stage,
    )  # fmt: skip


def _add_bundle_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bundle",
        type=Path,
        metavar="FILE.tar",
        help="a `vcloud bundle` file: its config, checkpoints and wind cache instead of --config, --stage<n> and "
        "--wind-cache; refused in one line when it is damaged or does not fit --store (docs/predict.md)",
    )


def _cmd_evaluate(args: argparse.Namespace) -> None:
    _start_unresumable(args)
    from vcloud.evaluation.evaluate import evaluate

    with _model(args, "vcloud evaluate") as model:
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


def _cmd_fixed_protocol(args: argparse.Namespace) -> None:
    from vcloud.config import load_model_config
    from vcloud.evaluation.fixed_protocol import write_fixed_protocol

    meta = write_fixed_protocol(args.store, load_model_config(args.config), args.out, threads=args.threads)
    print(f"{args.out}: {meta['samples']} samples, {meta['pixels']} touched pixels detected")


def _cmd_predict(args: argparse.Namespace) -> None:
    import shlex

    _start_unresumable(args)
    from vcloud.apply.run import predict

    with _model(args, "vcloud predict") as model:
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


def _cmd_bundle(args: argparse.Namespace) -> None:
    import shlex

    from vcloud.apply.bundle import write_bundle

    manifest = write_bundle(
        out=args.out,
        stages=sorted(set(args.stage)),
        checkpoints=_checkpoints(args),
        config_path=args.config,
        train_store=args.train_store,
        wind_cache=args.wind_cache,
        eval_reports=args.eval or [],
        command=shlex.join(["vcloud", *args.argv]),
    )
    print(f"{args.out}: {len(manifest['members']) + 1} members, each with its SHA-256 in vcloud-bundle.json")


def _cmd_uncrtaints_convert(args: argparse.Namespace) -> None:
    from vcloud.evaluation.uncrtaints import convert_pairs

    entries = convert_pairs(args.source, args.out)
    print(f"{args.out}: {entries} entries of {args.source}")


def _cmd_memory(args: argparse.Namespace) -> None:
    from vcloud.models.memory import main as memory_main

    print(memory_main(args.config, args.json))


def _cmd_lumi_profile(args: argparse.Namespace) -> None:
    from vcloud.runtime.profile import write_profile

    print(write_profile(args.config, args.out, check=args.check))


def _cmd_image(args: argparse.Namespace) -> None:
    from vcloud.runtime import image
    from vcloud.runtime.lumi import Cluster
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
        repo=Path(__file__).resolve().parents[2],
        out=Path(out),
        runner=args.runner,
        dry_run=args.dry_run,
    ):
        print(line)
    if not args.dry_run:
        print(f"{out}: written ({image.version_stamp(Path('.'))}); bound by every rule at /user-software")


def _cmd_rccl_check(args: argparse.Namespace) -> None:
    from vcloud.runtime import transport

    _apply_env(args)
    report = transport.run_check(log_dir=args.log_dir, out=args.out)
    if report.get("ok"):
        print(f"{args.out}: RCCL used aws-ofi-rccl over cxi on {report['world_size']} ranks")


def _cmd_rehearsal_summary(args: argparse.Namespace) -> None:
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
        stage1_estimate_gb=estimate,
    )
    print("\n".join(rehearsal.lines(summary)))
    if not summary["passed"]:  # beside the output, for the doctor: never taken as done
        rehearsal.write(summary, args.out.with_name(args.out.name + ".failed"))
        raise VcloudError(f"rehearsal: failed: {'; '.join(summary['problems'])}")
    rehearsal.write(summary, args.out)


def _cmd_doctor(args: argparse.Namespace) -> None:
    from vcloud.runtime.doctor import run

    report = run(args.profile, args.config)
    print(report.text())
    if report.errors:
        raise VcloudError(f"{len(report.errors)} check(s) failed")
    print("doctor: all checks passed")


def _cmd_export_viewer(args: argparse.Namespace) -> None:
    from vcloud.export.viewer import export_viewer

    with _model(args, "vcloud export-viewer", needs_stage=False) as model:
        export_viewer(
            store=args.store,
            checkpoints=model.checkpoints,
            config_path=model.config,
            out=args.out,
            samples=args.samples,
            seed=args.seed,
            wind_cache=model.wind_cache,
            fixed_protocol=args.fixed_protocol,
        )


def _cmd_plot_curves(args: argparse.Namespace) -> None:
    from vcloud.errors import ConfigError
    from vcloud.export.report import plot_curves

    if len(args.out) != len(args.metrics):
        raise ConfigError(f"vcloud plot-curves: {len(args.metrics)} --metrics files but {len(args.out)} --out PNGs")
    labels = {stage.name: f"{stage.name} ({stage.label})" for stage in STAGES}  # curves/stage<n>.png
    for metrics, out in zip(args.metrics, args.out):
        plot_curves(metrics, out, title=f"{labels.get(out.stem, out.stem)} training curves")


def _cmd_report_tables(args: argparse.Namespace) -> None:
    from vcloud.export.report import evaluation_tables

    evaluation_tables(args.reports, args.out, markdown=args.markdown)


def _cmd_compare_stages(args: argparse.Namespace) -> None:
    from vcloud.evaluation.compare import markdown, write_comparison
    from vcloud.registry import VIEWER_STAGES

    comparison = write_comparison(args.reports, args.out, stages=VIEWER_STAGES, markdown_out=args.markdown)
    print(markdown(comparison), end="")


def _cmd_accounting(args: argparse.Namespace) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    from vcloud.constants import N_TIMES, PATCH_SIZE
    from vcloud.data.clouds import CloudThresholds

    parser = argparse.ArgumentParser(prog="vcloud", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"vcloud {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("synth", help="write a synthetic raw tree in the real SEN12MS-CR-TS layout")
    p.add_argument("--out", type=Path, required=True, help="raw root to create")
    p.add_argument("--rois", type=int, default=4, help="number of ROIs (default names)")
    p.add_argument("--roi", action="append", help="explicit ROI name ROIsXXXX/NNN (repeatable)")
    p.add_argument("--patches", type=int, default=4, help="patches (locations) per ROI")
    p.add_argument("--times", type=int, default=N_TIMES, help="dates per location")
    p.add_argument("--size", type=int, default=PATCH_SIZE, help="pixels per side")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--archives",
        action="store_true",
        help="write the downloaded form: {s1,s2}_<region>[_test].tar.gz (dataset ROIs only)",
    )
    p.set_defaults(func=_cmd_synth)

    p = sub.add_parser("index", help="index downloaded archives once, beside them (<archive>.vcloud-index)")
    p.add_argument("archives", type=Path, nargs="+", help="{s1,s2}_<region>[_test].tar.gz")
    p.add_argument("--rebuild", action="store_true", help="rebuild even when an index is there")
    p.add_argument("--check", action="store_true", help="only check that the index matches its archive")
    p.add_argument("--index-dir", type=Path, help="keep the index here instead of beside the archive")
    p.set_defaults(func=_cmd_index)

    p = sub.add_parser("prepare", help="one raw ROI -> a prepared zarr store")
    p.add_argument(
        "--raw",
        type=Path,
        action="append",
        required=True,
        help="folder of downloaded archives, one archive, an extracted tree (repeatable: the train and val/test "
        "roots), or a plain folder of your own dated GeoTIFFs: S2/<anything>_YYYYMMDD.tif [S1/...] (docs/predict.md)",
    )
    p.add_argument("--threads", type=int, default=1, help="locations prepared in parallel (one core each)")
    p.add_argument("--index-dir", type=Path, help="folder of the archives' indexes (default: beside each archive)")
    p.add_argument("--roi", required=True, help="ROIsXXXX/NNN (a plain folder: any such name, kept in the store)")
    p.add_argument("--out", type=Path, required=True, help="FILE.zarr to write")
    p.add_argument("--on-bad-image", choices=("fail", "skip"), default="fail")
    p.add_argument(
        "--times", type=int, help=f"expected dates per location (default {N_TIMES}; a plain folder: its dates)"
    )
    p.add_argument("--size", type=int, default=PATCH_SIZE, help="expected pixels per side")
    p.add_argument("--wind", type=Path, help="optional wind: CSV rois,roi,date,u,v, or an ERA5 u10/v10 grid")
    defaults = CloudThresholds()
    p.add_argument("--clear-max-cover", type=float, default=defaults.clear_max_cover)
    p.add_argument("--thick-min-prob", type=float, default=defaults.thick_min_prob)
    p.add_argument("--opaque-min-cover", type=float, default=defaults.opaque_min_cover)
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("assemble", help="gather per-ROI stores into one split store (shards hard-linked, not copied)")
    p.add_argument("--out", type=Path, required=True, help="FILE.zarr to write")
    p.add_argument("stores", type=Path, nargs="+", help="per-ROI stores")
    p.set_defaults(func=_cmd_assemble)

    p = sub.add_parser("verify", help="read every chunk of a prepared store; list what is damaged")
    p.add_argument("store", type=Path, help="FILE.zarr (a per-ROI or split store)")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("era5-wind", help="ERA5 10 m wind for every location and date of raw ROIs (network)")
    p.add_argument(
        "--raw",
        type=Path,
        required=True,
        action="append",
        help="raw SEN12MS-CR-TS: archives folder, one archive, or extracted tree (repeat for several)",
    )
    p.add_argument(
        "--index-dir", type=Path, default=None, help="where the archive indexes are (default: beside each archive)"
    )
    p.add_argument("--roi", required=True, action="append", help="ROIsXXXX/NNN (repeat for several)")
    p.add_argument("--out", type=Path, required=True, help="FOLDER.zarr to write (one group per ROI)")
    p.add_argument("--source", default=None, help="ERA5 zarr store (default: the public ARCO-ERA5 store)")
    p.add_argument("--times", type=int, default=N_TIMES, help="expected dates per location")
    p.add_argument("--size", type=int, default=PATCH_SIZE, help="expected pixels per side")
    p.add_argument("--workers", type=int, default=4, help="ERA5 hours read at once")
    p.set_defaults(func=_cmd_era5_wind)

    p = sub.add_parser("wind-cache", help="precompute the wind-scanner orders into an npz file")
    p.add_argument("--out", type=Path, required=True, help="FILE.npz to write")
    p.add_argument("--grid-h", type=int, required=True, help="token rows: patch_size / 8")
    p.add_argument("--grid-w", type=int, required=True, help="token columns: patch_size / 8")
    p.add_argument("--sectors", type=int, default=16, help="stage1.model.wind_sectors")
    p.set_defaults(func=_cmd_wind_cache)

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
    _add_checkpoint_flags(
        p, sorted({n for s in STAGES for n in (*s.upstream, s.init_from) if n is not None}), "stages that build on it"
    )
    p.add_argument("--wind-cache", type=Path, help="wind-scanner cache (when stage1.model.wind_scan)")
    _add_env_flag(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("evaluate", help="a stage's metrics on a prepared store, next to baselines")
    p.add_argument("--stage", type=int, choices=STAGE_NUMBERS, help="required unless --bundle (default: its stage)")
    p.add_argument("--store", type=Path, required=True, help="any prepared store (e.g. the test split)")
    p.add_argument("--out", type=Path, required=True, help="FILE.json to write")
    _add_checkpoint_flags(p, STAGE_NUMBERS, "the ones the stage's predictor needs")
    p.add_argument("--config", type=Path, help="config/models/*.yaml the stages used (required unless --bundle)")
    _add_bundle_flag(p)
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
    _add_env_flag(p)
    p.set_defaults(func=_cmd_evaluate)

    p = sub.add_parser(
        "uncrtaints-convert", help="a released UnCRtainTS pairing file (.npy pickled dict) -> checked JSON"
    )
    p.add_argument("source", type=Path, help="generic_{T}_test_all_s2cloudless_mask.npy (read without unpickling code)")
    p.add_argument("out", type=Path, help="FILE.json to write (read by vcloud evaluate --uncrtaints-pairs)")
    p.set_defaults(func=_cmd_uncrtaints_convert)

    p = sub.add_parser("predict", help="reconstruct cloudy dates of a prepared store as Cloud-Optimized GeoTIFFs")
    p.add_argument("--stage", type=int, choices=(1, 2, 3),
                   help="the stage whose predictor is used (required unless --bundle; default: the bundle's)")  # fmt: skip
    p.add_argument("--store", type=Path, required=True, help="any prepared store: a split or one ROI's")
    p.add_argument(
        "--out", type=Path, required=True, help="folder: GeoTIFFs, mosaics/, manifest.json (docs/predict.md)"
    )
    _add_checkpoint_flags(p, STAGE_NUMBERS, "the ones the stage's predictor needs")
    p.add_argument("--config", type=Path, help="config/models/*.yaml the stages used (required unless --bundle)")
    p.add_argument("--wind-cache", type=Path, help="wind-scanner cache (when stage1.model.wind_scan)")
    _add_bundle_flag(p)
    p.add_argument("--dates", nargs="+", metavar="YYYY-MM-DD", help="dates to reconstruct (default: the cloudy ones)")
    p.add_argument("--min-cover", type=float, default=0.05, help="default dates: cloud cover above this (0.05)")
    p.add_argument("--draws", type=int, help="stages 2-3: diffusion draws averaged (default: stage2.model.ensemble); "
                   ">= 2 also writes their per-pixel spread")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=8, help="images per model call (8)")
    p.add_argument("--device", help="torch device (default: cuda when there is one, else cpu)")
    p.add_argument("--clear-pixels", choices=("observed", "model"), default="observed",
                   help="pixels the cloud mask calls clear: the observed reflectance (default) or the model's")  # fmt: skip
    _add_env_flag(p)
    p.set_defaults(func=_cmd_predict)

    p = sub.add_parser("bundle", help="pack a trained model (weights, config, wind cache, model card) into one tar")
    p.add_argument("--stage", type=int, choices=STAGE_NUMBERS, action="append", required=True,
                   help="a stage to predict with; its predictor's checkpoints are packed (repeatable)")  # fmt: skip
    _add_checkpoint_flags(p, STAGE_NUMBERS, "the ones the stages' predictors need")
    p.add_argument("--config", type=Path, required=True, help="config/models/*.yaml the stages used")
    p.add_argument("--wind-cache", type=Path, help="wind-scanner cache (packed when stage1.model.wind_scan)")
    p.add_argument("--train-store", type=Path, required=True,
                   help="the training split store: the card's patch size, normalisation and training data")  # fmt: skip
    p.add_argument("--eval", type=Path, nargs="+", metavar="REPORT",
                   help="results/eval/stage<n>.json of bundled stages: their figures go into the card")  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="FILE.tar to write (atomically)")
    p.set_defaults(func=_cmd_bundle)

    p = sub.add_parser("memory", help="memory estimate per component of the stage-1 model")
    p.add_argument("--config", type=Path, required=True, help="config/models/*.yaml")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    p.set_defaults(func=_cmd_memory)

    p = sub.add_parser("lumi-profile", help="generate profiles/lumi from the cluster section of config/lumi.yaml")
    p.add_argument(
        "--config", type=Path, default=Path("config/lumi.yaml"), help="workflow config with a cluster section"
    )
    p.add_argument("--out", type=Path, default=Path("profiles/lumi/config.yaml"))
    p.add_argument("--check", action="store_true", help="fail when the profile differs, write nothing")
    p.set_defaults(func=_cmd_lumi_profile)

    p = sub.add_parser("image", help="build the squashfs venv of every rule inside the CSC image (works on LUMI)")
    p.add_argument(
        "--config", type=Path, default=Path("config/lumi.yaml"), help="workflow config with a cluster section"
    )
    p.add_argument("--out", type=Path, help="FILE.sqsh (default: cluster.env_image)")
    p.add_argument("--runner", default="singularity", help="container runtime (singularity or apptainer)")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.set_defaults(func=_cmd_image)

    p = sub.add_parser("rccl-check", help="one all-reduce; fail unless RCCL logs aws-ofi-rccl over cxi")
    p.add_argument("--log-dir", type=Path, required=True, help="folder for RCCL's INFO log, one file per rank")
    p.add_argument("--out", type=Path, required=True, help="report (JSON); written only when the check passes")
    _add_env_flag(p)
    p.set_defaults(func=_cmd_rccl_check)

    p = sub.add_parser("rehearsal-summary", help="the dev-g rehearsal's closing summary (pass or fail)")
    p.add_argument("--results", type=Path, required=True, help="the rehearsal's results folder")
    p.add_argument("--logs", type=Path, default=Path("logs"), help="the rules' logs folder")
    p.add_argument("--config", type=Path, required=True, help="the rehearsal's model config")
    p.add_argument("--full-config", type=Path, help="the real run's model config (its epoch sizes)")
    p.add_argument("--train-store", type=Path, help="the real training split store (its locations per epoch)")
    p.add_argument("--transport", type=Path, help="rccl-check's report (absent: the transport check did not run)")
    p.add_argument("--miopen-cache", help="MIOPEN_USER_DB_PATH of the runtime environment")
    p.add_argument("--out", type=Path, required=True, help="summary JSON, written only when the rehearsal passed")
    p.set_defaults(func=_cmd_rehearsal_summary)

    p = sub.add_parser("doctor", help="pre-flight checks of a cluster run (one line per problem)")
    p.add_argument("--profile", type=Path, default=Path("profiles/lumi"), help="snakemake profile folder")
    p.add_argument("--config", type=Path, help="workflow config (default: the profile's configfiles)")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("export-viewer", help="quicklooks of test samples and an offline index.html")
    p.add_argument("--store", type=Path, required=True, help="prepared store (e.g. the test split)")
    _add_checkpoint_flags(p, STAGE_NUMBERS, "the shown stages 1-3 read every stage's")
    p.add_argument("--config", type=Path, help="config/models/*.yaml the stages used (required unless --bundle)")
    _add_bundle_flag(p)
    p.add_argument("--out", type=Path, required=True, help="viewer folder: index.html, images/, thumbnails.png")
    p.add_argument("--samples", type=int, default=12, help="samples to show (of the evaluation's fixed protocol)")
    p.add_argument("--seed", type=int, default=0, help="which samples are shown")
    p.add_argument("--wind-cache", type=Path, help="wind-scanner cache (when stage1.model.wind_scan)")
    p.add_argument("--fixed-protocol", type=Path, metavar="PATH", help=FIXED_PROTOCOL_HELP)
    p.set_defaults(func=_cmd_export_viewer)

    p = sub.add_parser("fixed-protocol", help="s2cloudless on every fixed-protocol sample, once for the run")
    p.add_argument("--store", type=Path, required=True, help="prepared store (e.g. the test split)")
    p.add_argument("--config", type=Path, required=True, help="config/models/*.yaml of the evaluations")
    p.add_argument("--out", type=Path, required=True, help="FILE.npz to write (read by evaluate --fixed-protocol)")
    p.add_argument("--threads", type=int, default=1, help="LightGBM threads and samples read at once")
    p.set_defaults(func=_cmd_fixed_protocol)

    p = sub.add_parser("plot-curves", help="training curves (loss, val PSNR, samples/s) of stages as PNG")
    p.add_argument("--out", type=Path, nargs="+", required=True, help="one PNG per metrics file, in order")
    p.add_argument("--metrics", type=Path, nargs="+", required=True, help="a stage's metrics.jsonl each")
    p.set_defaults(func=_cmd_plot_curves)

    p = sub.add_parser("report-tables", help="evaluation reports of the stages as one HTML page")
    p.add_argument("--out", type=Path, required=True, help="FILE.html to write")
    p.add_argument("--markdown", type=Path, help="also write the tables as Markdown (FILE.md)")
    p.add_argument("reports", type=Path, nargs="+", help="results/eval/stage<n>.json")
    p.set_defaults(func=_cmd_report_tables)

    p = sub.add_parser("compare-stages", help="each stage against the one before it, per protocol (paired PSNR)")
    p.add_argument("--out", type=Path, required=True, help="FILE.json to write (results/eval/stages.json)")
    p.add_argument("--markdown", type=Path, help="also write the table as Markdown (FILE.md)")
    p.add_argument("reports", type=Path, nargs="+", help="results/eval/stage<n>.json of the same store")
    p.set_defaults(func=_cmd_compare_stages)

    p = sub.add_parser("accounting", help="wall, CPU and GPU hours per rule and stage from benchmark files")
    p.add_argument("--benchmarks", type=Path, required=True, help="benchmarks folder (<rule>/*.tsv)")
    p.add_argument("--resources", required=True, help="JSON object: the workflow config's resources section")
    p.add_argument("--tsv", type=Path, required=True, help="FILE.tsv to write")
    p.add_argument("--html", type=Path, required=True, help="FILE.html to write")
    p.set_defaults(func=_cmd_accounting)
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


if __name__ == "__main__":
    sys.exit(main())

"""The data commands: synthetic and downloaded raw trees, prepared stores, wind, and the inputs
of the fixed evaluation protocols."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_synth(sub: argparse._SubParsersAction) -> None:
    from vcloud.constants import N_TIMES, PATCH_SIZE

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
    p.set_defaults(func=run_synth)


def run_synth(args: argparse.Namespace) -> None:
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


def add_index(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="index downloaded archives once, beside them (<archive>.vcloud-index)")
    p.add_argument("archives", type=Path, nargs="+", help="{s1,s2}_<region>[_test].tar.gz")
    p.add_argument("--rebuild", action="store_true", help="rebuild even when an index is there")
    p.add_argument("--check", action="store_true", help="only check that the index matches its archive")
    p.add_argument("--index-dir", type=Path, help="keep the index here instead of beside the archive")
    p.set_defaults(func=run_index)


def run_index(args: argparse.Namespace) -> None:
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


def add_prepare(sub: argparse._SubParsersAction) -> None:
    from vcloud.constants import N_TIMES, PATCH_SIZE
    from vcloud.data.clouds import CloudThresholds

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
    p.add_argument(
        "--scl",
        action="append",
        metavar="CODE=PROB",
        help="a plain folder's SCL/: the cloud probability of an SCL class (repeatable; given, it replaces the whole "
        "default table 0=1 1=1 3=0.5 8=0.8 9=1 10=0.5; unlisted codes are clear; docs/data.md)",
    )
    p.add_argument(
        "--bands",
        default="l1c",
        help="the S2 files' bands, in file order: a preset (l1c: the 13 Level-1C bands; l2a: 12, no B10; 10m_20m: "
        "B2-B8A, B11, B12) or a comma-separated list; other than l1c only in a plain folder (docs/data.md)",
    )
    p.add_argument("--level", choices=("L1C", "L2A"), default="L1C", help="the S2 files' product level")
    p.add_argument(
        "--s1-max-days",
        type=int,
        help="a plain folder: the S1 image nearest each S2 date is paired with it within this many days "
        "(default 6; 0: the same day only)",
    )
    p.add_argument(
        "--overlap",
        type=int,
        help="a plain folder's scenes larger than --size are cut into patches that overlap their neighbours by "
        "this many pixels (default: size/8, at least 16, at most size/2; docs/predict.md)",
    )
    p.add_argument(
        "--boa-offset",
        type=int,
        help="Level-2A: the BOA_ADD_OFFSET of files whose metadata give neither it nor the processing baseline "
        "(-1000 from baseline 04.00, 0 before)",
    )
    p.set_defaults(func=run_prepare)


def run_prepare(args: argparse.Namespace) -> None:
    from vcloud.bands import BandSetError, resolve_bands
    from vcloud.constants import N_TIMES
    from vcloud.data.clouds import CloudThresholds
    from vcloud.data.folder import folder_times
    from vcloud.data.layout import parse_roi
    from vcloud.data.masks import parse_scl_flags
    from vcloud.data.prepare import prepare_roi
    from vcloud.data.s2files import S2Spec
    from vcloud.errors import BadInputError

    try:
        s2 = S2Spec(bands=resolve_bands(args.bands, key="--bands"), level=args.level, boa_offset=args.boa_offset)
    except BandSetError as err:
        raise BadInputError(str(err)) from None

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
        scl=parse_scl_flags(args.scl),
        s2=s2,
        s1_max_days=args.s1_max_days,
        overlap=args.overlap,
    )


def add_assemble(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("assemble", help="gather per-ROI stores into one split store (shards hard-linked, not copied)")
    p.add_argument("--out", type=Path, required=True, help="FILE.zarr to write")
    p.add_argument("stores", type=Path, nargs="+", help="per-ROI stores")
    dates = "(YYYY-MM-DD, both included; repeatable; a temporal split)"
    p.add_argument(
        "--keep",
        nargs=2,
        action="append",
        default=[],
        metavar=("FIRST", "LAST"),
        help=f"keep only the dates in FIRST..LAST {dates}",
    )
    p.add_argument(
        "--drop",
        nargs=2,
        action="append",
        default=[],
        metavar=("FIRST", "LAST"),
        help=f"mark the dates in FIRST..LAST missing {dates}",
    )
    p.set_defaults(func=run_assemble)


def run_assemble(args: argparse.Namespace) -> None:
    from vcloud.data.store import DateRanges, assemble

    ranges = None
    if args.keep or args.drop:
        ranges = DateRanges(keep=_date_ranges("--keep", args.keep), drop=_date_ranges("--drop", args.drop))
    assemble(args.stores, args.out, dates=ranges)


def _date_ranges(flag: str, pairs: list[list[str]]) -> tuple[tuple[str, str], ...]:
    """--keep/--drop FIRST LAST pairs as ISO dates in order; ConfigError naming the flag otherwise."""
    from vcloud.data.splits import iso_date
    from vcloud.errors import ConfigError

    ranges = []
    for first, last in pairs:
        days = []
        for text in (first, last):
            try:
                days.append(iso_date(text))
            except ValueError:
                raise ConfigError(f"{flag} {first} {last}: {text} is not a date YYYY-MM-DD") from None
        if days[0] > days[1]:
            raise ConfigError(f"{flag} {first} {last}: {first} is after {last} (give FIRST LAST)")
        ranges.append((days[0].isoformat(), days[1].isoformat()))
    return tuple(ranges)


def add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="read every chunk of a prepared store; list what is damaged")
    p.add_argument("store", type=Path, help="FILE.zarr (a per-ROI or split store)")
    p.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> None:
    from vcloud.constants import CLEAR_MAX_COVER
    from vcloud.data.masks import agreement_lines
    from vcloud.data.shards import DamagedStoreError, verify
    from vcloud.data.store import open_store

    problems = verify(args.store)
    for line in problems:
        print(line)
    if problems:
        raise DamagedStoreError(f"{args.store}: {len(problems)} damaged (listed above); prepare the ROI again")
    print(f"{args.store}: every chunk reads back and matches its checksum")
    ds = open_store(args.store)
    clear = ds.attrs.get("producer", {}).get("options", {}).get("cloud_thresholds", {})
    for line in agreement_lines(ds, args.store, clear_max_cover=clear.get("clear_max_cover", CLEAR_MAX_COVER)):
        print(line)


def add_era5_wind(sub: argparse._SubParsersAction) -> None:
    from vcloud.constants import N_TIMES, PATCH_SIZE

    p = sub.add_parser(
        "era5-wind", help="ERA5 10 m wind for every location and date of raw ROIs or your own locations (network)"
    )
    p.add_argument(
        "--raw",
        type=Path,
        action="append",
        help="raw SEN12MS-CR-TS of the --roi: archives folder, one archive, or extracted tree (repeat for several)",
    )
    p.add_argument(
        "--index-dir", type=Path, default=None, help="where the archive indexes are (default: beside each archive)"
    )
    p.add_argument("--roi", action="append", help="ROIsXXXX/NNN of --raw (repeat for several)")
    p.add_argument(
        "--location",
        nargs=2,
        action="append",
        metavar=("FOLDER", "ROI"),
        help="one of your own locations: its plain folder and the ROI it is prepared as (`vcloud prepare --raw "
        "FOLDER --roi ROI`; the workflow's ROIs9000/<n>, docs/data.md); repeat for several",
    )
    p.add_argument("--out", type=Path, required=True, help="FOLDER.zarr to write (one group per ROI)")
    p.add_argument("--source", default=None, help="ERA5 zarr store (default: the public ARCO-ERA5 store)")
    p.add_argument(
        "--times", type=int, help=f"expected dates per location (default {N_TIMES}; a plain folder: its dates)"
    )
    p.add_argument("--size", type=int, default=PATCH_SIZE, help="expected pixels per side")
    p.add_argument("--workers", type=int, default=4, help="ERA5 hours read at once")
    p.set_defaults(func=run_era5_wind)


def run_era5_wind(args: argparse.Namespace) -> None:
    import json

    from vcloud.constants import N_TIMES
    from vcloud.data.era5 import fetch, wind_needs
    from vcloud.data.folder import folder_times, is_plain_folder
    from vcloud.data.layout import parse_roi
    from vcloud.errors import BadInputError

    if not args.roi and not args.location:
        raise BadInputError("nothing to fetch: give --raw with --roi (the dataset's ROIs) or --location FOLDER ROI")
    if bool(args.raw) != bool(args.roi):
        raise BadInputError("--raw and --roi go together (the dataset's ROIs); your own locations take --location")
    places = [(args.raw, parse_roi(text)) for text in args.roi or []]
    for folder, text in args.location or []:
        if not is_plain_folder(Path(folder)):
            raise BadInputError(f"--location {folder}: not a plain folder (S2/ of dated GeoTIFFs, or <tile>/S2/)")
        places.append(([Path(folder)], parse_roi(text)))
    seen: set[str] = set()
    for _, roi in places:
        if roi.slug in seen:
            raise BadInputError(f"{roi}: given twice; each ROI or location is one group of --out")
        seen.add(roi.slug)
    needs = [
        wind_needs(
            raws,
            roi,
            times=args.times or folder_times(raws) or N_TIMES,
            size=args.size,
            index_dir=args.index_dir,
        )
        for raws, roi in places
    ]
    print(json.dumps(fetch(args.source, needs, args.out, workers=args.workers)))


def add_wind_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("wind-cache", help="precompute the wind-scanner orders into an npz file")
    p.add_argument("--out", type=Path, required=True, help="FILE.npz to write")
    p.add_argument("--grid-h", type=int, required=True, help="token rows: patch_size / 8")
    p.add_argument("--grid-w", type=int, required=True, help="token columns: patch_size / 8")
    p.add_argument("--sectors", type=int, default=16, help="stage1.model.wind_sectors")
    p.set_defaults(func=run_wind_cache)


def run_wind_cache(args: argparse.Namespace) -> None:
    from vcloud.wind.scan_orders import write_cache

    write_cache(
        args.out,
        grid_h=args.grid_h,
        grid_w=args.grid_w,
        sectors=args.sectors,
    )


def add_uncrtaints_convert(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "uncrtaints-convert", help="a released UnCRtainTS pairing file (.npy pickled dict) -> checked JSON"
    )
    p.add_argument("source", type=Path, help="generic_{T}_test_all_s2cloudless_mask.npy (read without unpickling code)")
    p.add_argument("out", type=Path, help="FILE.json to write (read by vcloud evaluate --uncrtaints-pairs)")
    p.set_defaults(func=run_uncrtaints_convert)


def run_uncrtaints_convert(args: argparse.Namespace) -> None:
    from vcloud.evaluation.uncrtaints import convert_pairs

    entries = convert_pairs(args.source, args.out)
    print(f"{args.out}: {entries} entries of {args.source}")


def add_fixed_protocol(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fixed-protocol", help="s2cloudless on every fixed-protocol sample, once for the run")
    p.add_argument("--store", type=Path, required=True, help="prepared store (e.g. the test split)")
    p.add_argument("--config", type=Path, required=True, help="config/models/*.yaml of the evaluations")
    p.add_argument("--out", type=Path, required=True, help="FILE.npz to write (read by evaluate --fixed-protocol)")
    p.add_argument("--threads", type=int, default=1, help="LightGBM threads and samples read at once")
    p.set_defaults(func=run_fixed_protocol)


def run_fixed_protocol(args: argparse.Namespace) -> None:
    from vcloud.config import load_model_config
    from vcloud.evaluation.fixed_protocol import write_fixed_protocol

    meta = write_fixed_protocol(args.store, load_model_config(args.config), args.out, threads=args.threads)
    print(f"{args.out}: {meta['samples']} samples, {meta['pixels']} touched pixels detected")

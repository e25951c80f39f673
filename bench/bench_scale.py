"""From downloaded archives to the prepared store at the real patch size, and the extrapolation
to the whole SEN12MS-CR-TS next to LUMI's quotas.

    python bench/bench_scale.py [--patches 32] [--times 30] [--size 256] [--workdir /tmp/vcloud-bench]

One synthetic ROI written as the dataset's archives (s1_/s2_europa.tar.gz); the archives are
indexed once (one streaming pass each), then the ROI is prepared with 1 and with 2 workers, each
in its own process (peak memory = that process's max RSS). Prints one JSON object: seconds per
image at 1 and 2 workers and the scaling, files and bytes per location of the store, the index
pass's throughput, and the extrapolation (files, bytes, CPU-hours, wall time on N LUMI CPU
nodes) with the quotas. The full dataset's size comes from the archive sizes in util/dl_data.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import emit  # noqa: E402
from vcloud.data.layout import RoiId  # noqa: E402

ROI = RoiId("ROIs1970", 119)  # a europa train ROI: s1_europa.tar.gz, s2_europa.tar.gz
# Archive sizes from util/dl_data.sh (1 kB units; they add up to ~1.2 TiB, FIELD-FACTS.md).
DL_KB = {
    "s2": [98233900, 110245004, 113948560, 96082796, 196669740, 25421744, 25421824, 40534760, 15012924, 79568460],
    "s1": [60544524, 67947416, 70230104, 59218848, 121213836, 15668120, 15668160, 24982736, 9252904, 49040432],
}
FULL_ROIS = 53
LUMI_CORES_PER_NODE = 128  # LUMI-C (standard/small partitions)
QUOTAS = {"scratch": {"bytes": 50e12, "files": 2_000_000}, "projappl": {"bytes": 50e9, "files": 100_000}}


def _child(args: argparse.Namespace) -> None:
    """One prepare in this process; prints seconds and max RSS as JSON."""
    from vcloud.data.prepare import prepare_roi

    start = time.perf_counter()
    prepare_roi(
        raw=args.raw,
        roi=ROI,
        out=args.out,
        times=args.times,
        size=args.size,
        workers=args.workers,
        index_dir=args.index_dir,
    )
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime  # robust to a busy machine, unlike wall time
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "peak_rss_bytes": usage.ru_maxrss * 1024}))


def _prepare(raw: Path, out: Path, index_dir: Path, args, workers: int) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--raw",
        str(raw),
        "--out",
        str(out),
        "--workers",
        str(workers),
        "--index-dir",
        str(index_dir),
        "--times",
        str(args.times),
        "--size",
        str(args.size),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patches", type=int, default=32)
    parser.add_argument("--times", type=int, default=30)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/vcloud-bench"))
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--raw", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--index-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)

    from vcloud.data.archive import build_index, write_index
    from vcloud.data.synthetic import write_raw_tree
    from vcloud.runtime.budget import STORE_METADATA_FILES

    raw = args.workdir / f"archives_{args.patches}x{args.times}x{args.size}"
    if not (raw / "s2_europa.tar.gz").is_file():
        write_raw_tree(raw, rois=[ROI], patches=args.patches, times=args.times, size=args.size, seed=0, archives=True)
    index_dir = args.workdir / "index"
    shutil.rmtree(index_dir, ignore_errors=True)
    archive_bytes = sum((raw / f"{k}_europa.tar.gz").stat().st_size for k in ("s1", "s2"))
    start = time.perf_counter()
    data_bytes = 0
    index_bytes = 0
    for kind in ("s1", "s2"):
        index = build_index(raw / f"{kind}_europa.tar.gz", index_dir=index_dir)
        index_bytes += write_index(index).stat().st_size
        data_bytes += index.data_bytes
    index_s = time.perf_counter() - start
    images = 2 * args.patches * args.times

    runs = {}
    for workers in (1, 2):
        out = args.workdir / f"scale_{workers}.zarr"
        runs[workers] = _prepare(raw, out, index_dir, args, workers)
        files = [p for p in out.rglob("*") if p.is_file()]
        store_files, store_bytes = len(files), sum(p.stat().st_size for p in files)
        shutil.rmtree(out)
        out.with_name(out.name.removesuffix(".zarr") + ".bad.tsv").unlink(missing_ok=True)
    s_per_image = {w: runs[w]["seconds"] / images for w in runs}
    scaling = runs[1]["seconds"] / runs[2]["seconds"]

    # Extrapolation. Locations: S2 archive bytes / (times x bytes per S2 image), taking the
    # archived image as large as the uncompressed TIFF (gzip gains nothing): a lower bound on
    # locations; every 2x that gzip gains doubles the counts below.
    s2_image = 13 * args.size * args.size * 2
    s2_bytes = sum(DL_KB["s2"]) * 1000
    full_locations = s2_bytes // (args.times * s2_image)
    full_images = 2 * full_locations * args.times
    per_location_files = store_files / args.patches
    per_location_bytes = store_bytes / args.patches
    full_archives = sum(map(len, DL_KB.values()))
    index_fraction = index_bytes / max(1, data_bytes)
    full_raw_bytes = sum(sum(v) for v in DL_KB.values()) * 1000
    # Archives + indexes, per-ROI store metadata and .bad.tsv, the stores' files per location.
    full_files = 2 * full_archives + FULL_ROIS * (STORE_METADATA_FILES + 1) + round(per_location_files * full_locations)
    full_bytes = full_raw_bytes + index_fraction * full_raw_bytes + per_location_bytes * full_locations
    cpu_hours = s_per_image[1] * full_images / 3600
    efficiency = scaling / 2
    throughput = data_bytes / index_s
    # Streaming instead of an index: every ROI job decompresses its whole archive once.
    s_rois = [6, 6, 6, 6, 11, 3, 3, 4, 2, 6]  # ROIs per archive (train: africa..europa; then test+val)
    stream_per_roi_bytes = sum(kb * 1000 * n for kind in DL_KB for kb, n in zip(DL_KB[kind], s_rois))
    emit(
        {
            "benchmark": "prepare_scale",
            "roi": str(ROI),
            "locations": args.patches,
            "times": args.times,
            "patch_size": args.size,
            "images": images,
            "archive_mb": round(archive_bytes / 1e6, 1),
            "index_pass_s": round(index_s, 2),
            "index_pass_mb_per_s": round(throughput / 1e6, 1),
            "index_mb": round(index_bytes / 1e6, 3),
            "s_per_image_1_worker": round(s_per_image[1], 4),
            "s_per_image_2_workers": round(s_per_image[2], 4),
            "scaling_2_workers": round(scaling, 2),
            "cpu_s_per_image_1_worker": round(runs[1].get("cpu_seconds", float("nan")) / images, 4),
            "cpu_s_per_image_2_workers": round(runs[2].get("cpu_seconds", float("nan")) / images, 4),
            "load_average_1min": round(os.getloadavg()[0], 2),
            "scaling_target": 1.6,
            "peak_rss_mb_1_worker": round(runs[1]["peak_rss_bytes"] / 1e6),
            "peak_rss_mb_2_workers": round(runs[2]["peak_rss_bytes"] / 1e6),
            "store_files_per_location": round(per_location_files, 2),
            "store_mb_per_location": round(per_location_bytes / 1e6, 2),
            "full": {
                "assumption": "archived images as large as uncompressed TIFFs (locations: lower bound)",
                "locations": int(full_locations),
                "images": int(full_images),
                "files": int(full_files),
                "files_if_extracted": int(full_images),
                "tb": round(full_bytes / 1e12, 2),
                "scratch_quota_files": QUOTAS["scratch"]["files"],
                "scratch_quota_tb": QUOTAS["scratch"]["bytes"] / 1e12,
                "cpu_hours": round(cpu_hours),
                "wall_hours_on_nodes": {
                    str(n): round(cpu_hours / (n * LUMI_CORES_PER_NODE * efficiency), 1) for n in args.nodes
                },
                "index_pass_cpu_hours": round(full_raw_bytes / throughput / 3600, 1),
                "streaming_per_roi_cpu_hours": round(stream_per_roi_bytes / throughput / 3600, 1),
            },
        }
    )


if __name__ == "__main__":
    main()

"""Prepare throughput for one ROI next to the floor: only reading and decoding the same TIFFs.

    python bench/bench_prepare.py [--patches 4] [--times 30] [--size 256] [--workdir /tmp/vcloud-bench]

Prints one JSON object. Files are read from the page cache in both measurements (the raw
tree was just written), so the figures compare CPU work, not disk speed. Both run on one core:
prepare with one worker (one LightGBM thread), the floor in one thread; bench_scale.py measures
two workers and the archive path.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import ROI, add_tree_arguments, emit, make_raw, raw_files  # noqa: E402
from vcloud.data.geotiff import read_image  # noqa: E402
from vcloud.data.prepare import prepare_roi  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_arguments(parser)
    args = parser.parse_args()
    raw = make_raw(args.workdir, patches=args.patches, times=args.times, size=args.size)
    files = raw_files(raw)
    raw_mb = sum(f.stat().st_size for f in files) / 1e6
    decoded_mb = 0.0

    start = time.perf_counter()
    for path in files:
        bands, dtype = (13, np.uint16) if path.parent.parent.name == "S2" else (2, np.float32)
        data, _ = read_image(path, bands=bands, size=args.size, dtype=dtype)
        decoded_mb += data.nbytes / 1e6
    read_s = time.perf_counter() - start

    out = args.workdir / "bench_prepare.zarr"
    start = time.perf_counter()
    prepare_roi(raw=raw, roi=ROI, out=out, times=args.times, size=args.size, workers=1)
    prepare_s = time.perf_counter() - start
    store_mb = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 1e6
    shutil.rmtree(out)

    emit(
        {
            "benchmark": "prepare_roi",
            "roi": str(ROI),
            "images": len(files),
            "patch_size": args.size,
            "workers": 1,
            "raw_mb_on_disk": round(raw_mb, 1),
            "decoded_mb": round(decoded_mb, 1),
            "store_mb_on_disk": round(store_mb, 1),
            "prepare_s": round(prepare_s, 2),
            "prepare_raw_mb_per_s": float(f"{raw_mb / prepare_s:.3g}"),  # 3 significant digits: tiny runs too
            "prepare_images_per_s": round(len(files) / prepare_s, 1),
            "read_decode_only_s": round(read_s, 2),
            "read_decode_raw_mb_per_s": float(f"{raw_mb / read_s:.3g}"),
            "read_decode_images_per_s": round(len(files) / read_s, 1),
            "prepare_over_floor": round(prepare_s / read_s, 2),
        }
    )


if __name__ == "__main__":
    main()

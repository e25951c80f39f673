"""Loader throughput: random training samples per second from the prepared store, next to
reading the same samples from the raw GeoTIFFs as the reference loader does.

    python bench/bench_loader.py [--samples 40] [--dates 16] [--size 256] [--workdir /tmp/vcloud-bench]

A sample is one location at `dates` input dates plus one target date, all bands: S2 (13),
S1 (2) and the cloud probability, normalised. The reference loader (UnCRtainTS) reads each
date's S1 and S2 GeoTIFF and runs s2cloudless on every S2 image it loads; "raw decode only"
is the same without cloud detection, the floor for any raw-file loader. Single process.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import ROI, add_tree_arguments, emit, make_raw  # noqa: E402

from vcloud.data.clouds import cloud_mask, cloud_probability  # noqa: E402
from vcloud.data.geotiff import read_image  # noqa: E402
from vcloud.data.layout import scan_roi  # noqa: E402
from vcloud.data.prepare import prepare_roi  # noqa: E402
from vcloud.data.reader import StoreReader  # noqa: E402
from vcloud.data.store import normalise_s1, normalise_s2  # noqa: E402


def raw_sample(raw, scan, patch, dates, size, *, detect_clouds):
    s2 = np.stack([read_image(scan.images[(patch, t)]["s2"].path(raw), bands=13, size=size, dtype=np.uint16)[0] for t in dates])
    s1 = np.stack([read_image(scan.images[(patch, t)]["s1"].path(raw), bands=2, size=size, dtype=np.float32)[0] for t in dates])
    prob = None
    if detect_clouds:
        prob = cloud_probability(s2)
        cloud_mask(prob)
    return normalise_s2(s2), normalise_s1(s1), prob


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--dates", type=int, default=16, help="input dates; the target is one more")
    add_tree_arguments(parser)
    args = parser.parse_args()
    raw = make_raw(args.workdir, patches=args.patches, times=args.times, size=args.size)
    store = args.workdir / f"bench_loader_{args.patches}x{args.times}x{args.size}.zarr"
    if not store.exists():
        prepare_roi(raw=raw, roi=ROI, out=store, times=args.times, size=args.size)
    scan = scan_roi(raw, ROI, times=args.times)
    reader = StoreReader(store)
    rng = np.random.default_rng(0)
    draws = [
        (int(rng.integers(args.patches)), np.sort(rng.choice(args.times, args.dates + 1, replace=False)))
        for _ in range(args.samples)
    ]
    reader.read(*draws[0])  # open the store once, as a worker does

    def rate(fn):
        start = time.perf_counter()
        for loc, dates in draws:
            fn(loc, dates)
        return args.samples / (time.perf_counter() - start)

    store_rate = rate(lambda loc, dates: reader.read(loc, dates))
    decode_rate = rate(lambda loc, dates: raw_sample(raw, scan, loc, dates, args.size, detect_clouds=False))
    reference_rate = rate(lambda loc, dates: raw_sample(raw, scan, loc, dates, args.size, detect_clouds=True))
    emit(
        {
            "benchmark": "loader",
            "samples": args.samples,
            "dates_per_sample": args.dates + 1,
            "patch_size": args.size,
            "store_samples_per_s": round(store_rate, 2),
            "raw_reference_samples_per_s": round(reference_rate, 2),
            "raw_decode_only_samples_per_s": round(decode_rate, 2),
            "speedup_vs_reference": round(store_rate / reference_rate, 1),
            "speedup_vs_decode_only": round(store_rate / decode_rate, 2),
            "target_speedup_vs_reference": 5.0,
        }
    )


if __name__ == "__main__":
    main()

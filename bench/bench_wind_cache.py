"""Wind-scanner cache at TopoFlow's size: precompute time, file size, checked load time.

Format 2 (no regional orders: crops and regions scan in the whole grid's orders restricted to
their window, `vcloud.wind.scan_orders.window_orders`), so the file holds orders + inverse only;
`window_ms` times deriving a 32x32-token crop's orders from them.

Prints one JSON object, next to the anchor from the LUMI notes (seeds/004: a 6.34 MB pickle,
"< 1 s" load per rank) and the targets (<= 1 MB, <= 20 ms load with validation).

    python bench/bench_wind_cache.py [--loads 21]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from vcloud.wind.scan_orders import FORMAT_VERSION, compute_cache, load_cache, window_orders, write_cache

CONFIG = {"grid_h": 64, "grid_w": 128, "sectors": 16}
ANCHOR = {"file_mb": 6.34, "format": "pickle", "load_s_per_rank": "< 1"}
TARGETS = {"file_mb_max": 1.0, "load_ms_max": 20.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=21, help="timed loads (median reported)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "scan_orders.npz"

        start = time.perf_counter()
        compute_cache(**CONFIG)
        compute_s = time.perf_counter() - start

        start = time.perf_counter()
        write_cache(path, **CONFIG)
        write_s = time.perf_counter() - start

        size = path.stat().st_size
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files if name != "meta"}
        raw_bytes = sum(a.nbytes for a in arrays.values())

        cache = load_cache(path, **CONFIG)  # warm the page cache, as every rank but the first sees it
        start = time.perf_counter()
        window_orders(cache.orders, cache.grid, (32, 32))
        window_s = time.perf_counter() - start
        loads = []
        for _ in range(args.loads):
            start = time.perf_counter()
            load_cache(path, **CONFIG)  # checksum, meta and permutation checks included
            loads.append(time.perf_counter() - start)

    load_ms = statistics.median(loads) * 1e3
    result = {
        "config": CONFIG,
        "format_version": FORMAT_VERSION,
        "compute_s": round(compute_s, 4),
        "precompute_and_write_s": round(write_s, 4),
        "file_bytes": size,
        "file_mb": round(size / 1e6, 3),
        "arrays_raw_bytes": raw_bytes,
        "dtypes": {name: str(a.dtype) for name, a in sorted(arrays.items())},
        "load_ms_median": round(load_ms, 3),
        "window_ms": round(window_s * 1e3, 3),
        "load_ms_min": round(min(loads) * 1e3, 3),
        "load_ms_max": round(max(loads) * 1e3, 3),
        "loads": args.loads,
        "anchor": ANCHOR,
        "targets": TARGETS,
        "meets_targets": size / 1e6 <= TARGETS["file_mb_max"] and load_ms <= TARGETS["load_ms_max"],
        "date": time.strftime("%Y-%m-%d"),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

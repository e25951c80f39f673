"""The benchmarks still run and print their JSON (tiny sizes; no timing is asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TINY_TREE = ["--patches", "1", "--times", "3", "--size", "32"]


def _bench(script, *args, cwd=ROOT):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    ("script", "extra", "keys"),
    [
        ("bench_prepare.py", [], ("prepare_raw_mb_per_s", "read_decode_images_per_s", "prepare_over_floor")),
        ("bench_loader.py", ["--samples", "2", "--dates", "1", "--workers", "0"],
         ("read_decompress_floor_samples_per_s", "training_dataset_samples_per_s", "dataloader_samples_per_s",
          "speedup_vs_reference", "training_dataset_device_detect_samples_per_s")),
    ],
)
def test_data_benchmarks_print_their_figures(tmp_path, script, extra, keys):
    result = _bench(script, *TINY_TREE, "--workdir", str(tmp_path), *extra)
    for key in keys:
        assert result[key] > 0, key
    if script == "bench_loader.py":  # seconds of s2cloudless per target, each way
        for size in ("256x256", "32x32"):
            assert result["detector"][size]["lightgbm_1_thread_s"] > 0
            assert result["detector"][size]["torch_cpu_1_thread_s"] > 0


def test_wind_cache_benchmark_meets_its_size_target():
    result = _bench("bench_wind_cache.py")
    assert result["file_mb"] <= 1.0  # size is deterministic; the load-time target is not asserted

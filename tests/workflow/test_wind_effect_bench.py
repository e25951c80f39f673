"""bench/bench_wind_effect.py runs on the shared tiny run's split stores and prints its figures."""

import json
import subprocess
import sys

import pytest

from tests.workflow.snakemake_run import ROOT

pytestmark = pytest.mark.workflow


def test_wind_on_off_benchmark_prints_psnr_per_class_with_standard_errors(pipeline_run):
    work, _, _ = pipeline_run
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench/bench_wind_effect.py"),
            "--workdir",
            str(work),
            "--config",
            str(ROOT / "tests/workflow/tiny_models.yaml"),
            "--seeds",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["samples"] > 0 and result["test_images_with_wind"] == 1.0
    for key in ("psnr_wind_on", "psnr_wind_off", "psnr_on_minus_off", "least_cloudy_baseline"):
        assert result[key]["all"]["n"] == result["samples"], key
        assert sum(stats["n"] for name, stats in result[key].items() if name != "all") == result["samples"]
    on, off, diff = result["psnr_wind_on"]["all"], result["psnr_wind_off"]["all"], result["psnr_on_minus_off"]["all"]
    assert diff["psnr"] == pytest.approx(on["psnr"] - off["psnr"], abs=2e-3)
    assert diff["se"] is not None and diff["se"] >= 0
    assert (work / "bench_wind_effect/on_seed0/eval.json").is_file()
    assert (work / "bench_wind_effect/off_seed0/eval.json").is_file()

"""The benchmarks still run and print their JSON (tiny sizes; no timing is asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# Each runs a benchmark script end to end (20-60 s apiece here): the slow tier.
pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
TINY_TREE = ["--patches", "1", "--times", "3", "--size", "32"]


def _bench(script, *args, cwd=ROOT):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    ("script", "extra", "keys"),
    [
        ("bench_prepare.py", [], ("prepare_raw_mb_per_s", "read_decode_images_per_s", "prepare_over_floor")),
        (
            "bench_loader.py",
            ["--samples", "2", "--dates", "1", "--workers", "0", "--detector-sizes", "32", "--detector-repeats", "1"],
            (
                "read_decompress_floor_samples_per_s",
                "training_dataset_samples_per_s",
                "dataloader_samples_per_s",
                "speedup_vs_reference",
                "training_dataset_device_detect_samples_per_s",
            ),
        ),
    ],
)
def test_data_benchmarks_print_their_figures(tmp_path, script, extra, keys):
    result = _bench(script, *TINY_TREE, "--workdir", str(tmp_path), *extra)
    for key in keys:
        assert result[key] > 0, key
    if script == "bench_loader.py":  # seconds of s2cloudless per target, each way
        assert set(result["detector"]) == {"cuda_device", "32x32"}  # the size asked for, only
        assert result["detector"]["32x32"]["lightgbm_1_thread_s"] > 0
        assert result["detector"]["32x32"]["torch_cpu_1_thread_s"] > 0


def test_wind_cache_benchmark_meets_its_size_target():
    result = _bench("bench_wind_cache.py")
    assert result["file_mb"] <= 1.0  # size is deterministic; the load-time target is not asserted


def test_gpu_benchmark_times_every_stage_and_the_fed_loader(tiny_store, tmp_path):
    """On the CPU here (no GPU in CI): the small config, one timed step per stage, each with its
    memory estimate, and `vcloud predict` on a tiny synthetic ROI."""
    result = _bench(
        "bench_gpu.py",
        *("--size", "32", "--predict", "--predict-patches", "1", "--predict-dates", "3", "--predict-size", "32"),
        *("--predict-batch", "2", "--workdir", str(tmp_path)),
        "--config",
        "config/models/small.yaml",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--store",
        str(tiny_store),
        "--feed-steps",
        "2",
        "--workers",
        "0",
    )
    stages = result["stages"]
    assert sorted(stages) == ["stage0", "stage1", "stage2", "stage3"]
    for name, figures in stages.items():
        assert figures["step_s_median"] > 0 and figures["samples_per_s"] > 0, name
        assert figures["trainable_parameters_m"] > 0, name
    assert stages["stage2"]["refine_one_sample_s"] > 0
    assert stages["stage3"]["pseudo_label_s_per_sample"] > 0 and stages["stage3"]["sampler_seeds"] >= 1
    for name, figures in stages.items():  # the estimate for the same shapes, every stage
        assert figures["estimated_peak_gib_configured"] > 0, name
        assert figures["estimated_step_total_gib_configured"] >= figures["estimated_peak_gib_configured"], name
        assert figures["estimated_largest_total_gib"] >= figures["estimated_step_total_gib_configured"], name
    assert stages["stage3"]["estimated_largest_phase"] in ("step", "teacher", "validate")
    predict = result["predict"]
    assert predict["stage"] == 2 and predict["outputs"] > 0 and predict["outputs_per_s"] > 0
    assert predict["km2_per_s"] > 0 and predict["device"] == "cpu"
    fed = result["stage1_fed_from_store"]
    assert fed["samples_per_s"] > 0 and 0 <= fed["data_wait_fraction"] <= 1 and fed["workers"] == 0


def test_stage1_profile_names_the_ops_and_times_the_step_without_checkpointing():
    """On the CPU (no device rows): the profiled step, its heaviest operators, and the same step
    with grad_checkpoint off, on tiny_models.yaml, whose CFDT checkpoints."""
    result = _bench(
        "profile_stage1.py",
        *("--config", "tests/workflow/tiny_models.yaml", "--size", "32", "--dates", "4"),
        *("--steps", "1", "--warmup", "1"),
    )
    profiled = result["profiled"]
    assert profiled["step_wall_s"] > 0 and profiled["device_busy_s_per_step"] is None
    ops = [row["op"] for row in profiled["top_ops"]]
    assert len(ops) == 20 and any("conv" in op for op in ops), ops
    assert all(row["self_cpu_ms_per_step"] >= 0 and row["calls_per_step"] >= 0 for row in profiled["top_ops"])
    assert result["without_grad_checkpoint"]["step_s_median"] > 0


def test_extent_benchmark_gives_time_per_km2_against_the_forward_floor(tmp_path):
    """A scene of any size (80 x 70 px, 32 px patches, the tiny models): prepare and predict per
    square kilometre, and predict over the model's forward alone on the same patches."""
    tiny = ["--height", "80", "--width", "70", "--size", "32", "--config", "tests/workflow/tiny_models.yaml"]
    result = _bench("bench_extent.py", *tiny, "--workdir", str(tmp_path))
    assert result["patches"] == 16 and result["km2"] == 0.56  # rows 0, 16, 32, 48; columns 0, 16, 32, 38
    for key in ("prepare_s_per_km2", "predict_s_per_km2", "forward_floor_s", "predict_over_floor"):
        assert result[key] > 0, key


def test_the_real_series_benchmark_trains_and_scores_against_every_simple_answer(real_location, tmp_path):
    """bench_realdata.py on the shared real series: prepared, split in time, stages 0 and 1 trained
    for one short epoch, scored on val and test, each opening with the strongest simple answer."""
    tiny = ["stage0.train.epochs=1", "stage1.train.epochs=1", "data.samples_per_epoch=8", "data.val_samples=4"]
    result = _bench("bench_realdata.py", "--work", str(tmp_path), "--seeds", "0", "--design", "tiny", *tiny)
    assert result["split"]["gap_days"] == 30
    stage1 = result["designs"]["tiny"]["stages"]["stage1"]
    for split in ("val", "test"):
        for protocol in ("fixed", "reference"):
            scored = stage1[split][protocol]
            assert scored["samples"] > 0 and "series_clear_median" in scored["psnr"]
            assert scored["strongest"]["baseline"] in scored["psnr"]
            assert scored["headline"].startswith(f"model - {scored['strongest']['baseline']} (the strongest simple")
    # the temporal split: val and test each hold only their own dates
    from vcloud.data.shards import ShardReader

    for split, (first, last) in (("val", result["split"]["val"]), ("test", result["split"]["test"])):
        reader = ShardReader(tmp_path / f"{split}.zarr")
        kept = reader.date_s2[reader.valid_s2].astype("datetime64[D]")
        assert kept.min() >= np.datetime64(first) and kept.max() <= np.datetime64(last)

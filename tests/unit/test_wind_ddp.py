"""The wind cache under DDP: every rank reads the file; a missing file fails every rank fast.

Two real processes wired from SLURM variables (gloo on CPU) run `vcloud train --stage 1`
with a wind-scanning CFDT, as the seeds' 400-GPU LUMI job did with the precomputed cache.
"""

import json
import logging
import os
import subprocess
import sys
import time

import pytest
import torch
import yaml

from vcloud.data.prepare import prepare_roi
from vcloud.train.stages import wind_sectors
from vcloud.wind.scan_orders import write_cache

from ..conftest import TINY, TINY_ROIS
from .test_distributed import _free_port_in_slurm_range

MODELS = {
    "name": "tiny-wind",
    "data": {"input_dates": 2, "crop": None, "samples_per_epoch": 4, "val_samples": 2, "clear_target_max_cover": 1.01},
    "stage0": {"model": {"widths": [8, 8], "latent_channels": 4}, "train": {"epochs": 1, "batch_size": 2, "lr": 1e-3}},
    "stage1": {
        "model": {
            "widths": [8, 8, 8, 8],
            "tmt_layers": 1,
            "tmt_heads": 2,
            "gate_width": 8,
            "gate_layers": 1,
            "day_embedding": 8,
            "wind_scan": True,
            "wind_sectors": 4,
        },
        "train": {"epochs": 1, "batch_size": 1, "lr": 1e-3},
    },
    "stage2": {
        "model": {"widths": [8, 8], "timesteps": 20, "sample_steps": 2},
        "train": {"epochs": 1, "batch_size": 1, "lr": 1e-3},
    },
    "stage3": {"train": {"epochs": 1, "batch_size": 1, "lr": 1e-3}},
}
GRID = TINY["size"] // 8


@pytest.fixture(scope="module")
def setup(tiny_raw_master, tmp_path_factory):
    folder = tmp_path_factory.mktemp("wind")
    store = folder / "store.zarr"
    prepare_roi(
        raw=tiny_raw_master,
        roi=TINY_ROIS[0],
        out=store,
        times=TINY["times"],
        size=TINY["size"],
        wind_table=tiny_raw_master / "wind.csv",
    )
    config = folder / "models.yaml"
    config.write_text(yaml.safe_dump(MODELS))
    return store, config


def _two_ranks(args, timeout):
    port = _free_port_in_slurm_range()
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in launcher}
    base.update(
        SLURM_NTASKS="2",
        SLURM_NODELIST="localhost",
        SLURM_JOB_ID=str(6_000_000 + port - 29500),
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "vcloud.cli", *args],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
        )
        for r in range(2)
    ]
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            results.append((proc.returncode, err))
    except subprocess.TimeoutExpired:
        pytest.fail(f"two ranks hung for {timeout} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
def test_two_ranks_train_with_wind_scan_reading_the_cache(setup, tmp_path):
    store, config = setup
    cache = tmp_path / "scan_orders.npz"
    write_cache(cache, grid_h=GRID, grid_w=GRID, sectors=4)
    out = tmp_path / "stage1"
    args = [
        "train",
        "--stage",
        "1",
        "--config",
        str(config),
        "--train",
        str(store),
        "--val",
        str(store),
        "--out",
        str(out),
        "--wind-cache",
        str(cache),
    ]
    for code, err in _two_ranks(args, timeout=180):
        assert code == 0, err[-3000:]
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["world_size"] == 2
    assert (out / "best.pt").is_file()


def test_missing_cache_under_ddp_fails_every_rank_instead_of_hanging(setup, tmp_path):
    store, config = setup
    missing = tmp_path / "nowhere.npz"
    args = [
        "train",
        "--stage",
        "1",
        "--config",
        str(config),
        "--train",
        str(store),
        "--val",
        str(store),
        "--out",
        str(tmp_path / "stage1"),
        "--wind-cache",
        str(missing),
    ]
    for code, err in _two_ranks(args, timeout=60):
        assert code == 2
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "wind cache not found and world size is 2" in lines[0], err[-2000:]
    assert not missing.exists()  # nobody computed it on the fly


def test_wrong_grid_in_the_cache_is_named(setup, tmp_path, capsys):
    from vcloud.cli import main

    store, config = setup
    cache = tmp_path / "scan_orders.npz"
    write_cache(cache, grid_h=8, grid_w=8, sectors=4)
    code = main(
        [
            "train",
            "--stage",
            "1",
            "--config",
            str(config),
            "--train",
            str(store),
            "--val",
            str(store),
            "--out",
            str(tmp_path / "s1"),
            "--wind-cache",
            str(cache),
        ]
    )
    assert code == 2
    assert "grid 8x8 in the file" in capsys.readouterr().err


def test_sectors_come_from_the_wind_and_unknown_wind_means_no_reordering():
    wind = torch.tensor([[5.0, 0.0], [0.0, 3.0], [float("nan"), float("nan")], [-2.0, 0.0]])
    assert wind_sectors(wind, 4).tolist() == [0, 1, -1, 2]


def test_single_process_recomputes_only_when_the_config_allows(setup, tmp_path, capsys, caplog):
    from vcloud.cli import main

    store, config = setup
    args = [
        "train",
        "--stage",
        "1",
        "--config",
        str(config),
        "--train",
        str(store),
        "--val",
        str(store),
        "--out",
        str(tmp_path / "s1"),
        "--wind-cache",
        str(tmp_path / "missing.npz"),
    ]
    assert main(args) == 2
    assert "wind cache not found; run `vcloud wind-cache" in capsys.readouterr().err
    allowed = yaml.safe_load(config.read_text())
    allowed["stage1"]["model"]["wind_allow_recompute"] = True
    (tmp_path / "allowed.yaml").write_text(yaml.safe_dump(allowed))
    args[4] = str(tmp_path / "allowed.yaml")
    assert main(args) == 0
    assert "computing scan orders in memory" in caplog.text
    assert not (tmp_path / "missing.npz").exists()


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
def test_a_cpu_run_leaves_its_dataloader_workers_their_cores(setup, tmp_path, monkeypatch, caplog):
    """3 rule threads and 1 worker: the step runs on 2 threads (3 would oversubscribe the job), the
    rest of the job (setup, validation) on all 3."""
    from vcloud.cli import main

    store, config = setup
    models = yaml.safe_load(config.read_text())
    models["data"]["num_workers"] = 1
    (tmp_path / "one_worker.yaml").write_text(yaml.safe_dump(models))
    cache = tmp_path / "scan_orders.npz"
    write_cache(cache, grid_h=GRID, grid_w=GRID, sectors=4)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    caplog.set_level(logging.INFO, logger="vcloud.train.run")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # not what the run should pick
    try:
        code = main(
            [
                "train",
                "--stage",
                "1",
                "--config",
                str(tmp_path / "one_worker.yaml"),
                "--train",
                str(store),
                "--val",
                str(store),
                "--out",
                str(tmp_path / "s1"),
                "--wind-cache",
                str(cache),
            ]
        )
        assert code == 0
        assert torch.get_num_threads() == 3
        assert "torch threads 3 (training steps 2)" in caplog.text
    finally:
        torch.set_num_threads(threads)

"""Wind in the chain: wind_cache in the default and LUMI plans, era5_wind feeding prepare_roi."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import yaml

from tests.lumi.helpers import REPO, stand_in_env
from tests.workflow.snakemake_run import run

pytestmark = pytest.mark.workflow


def job_count(text: str, rule: str) -> int:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == rule and parts[1].isdigit():
            return int(parts[1])
    return 0


def commands(text: str, marker: str) -> list[str]:
    return [line for line in text.splitlines() if marker in line]


def test_default_dry_run_scans_by_wind_in_stages_1_to_3_evaluation_and_viewer(tmp_path):
    # The embedded default config, as `snakemake --cores all` runs it.
    text = "\n".join(run(["-n", "-p", "-d", str(tmp_path)], cwd=tmp_path).stdout.splitlines())
    assert job_count(text, "wind_cache") == 1, text[-2000:]
    assert job_count(text, "era5_wind") == 0  # synthetic data records its own wind
    cache = "--wind-cache results/wind/scan_orders.npz"
    assert "vcloud wind-cache --out results/wind/scan_orders.npz --grid-h 8 --grid-w 8 --sectors 16" in text
    trains = commands(text, "vcloud train --stage")
    evals = commands(text, "vcloud evaluate --stage")
    assert len(trains) == 4 and len(evals) == 4
    for line in trains + evals:
        assert (cache in line) == ("--stage 0" not in line), line
    viewer = commands(text, "vcloud export-viewer")
    assert len(viewer) == 1 and cache in viewer[0]
    prepares = commands(text, "vcloud prepare")
    assert prepares and all("--wind resources/sen12mscrts_synth/wind.csv" in line for line in prepares)


def test_lumi_dry_run_fetches_era5_wind_and_builds_the_cache(tmp_path):
    for roi in ("ROIs1868/119", "ROIs2017/22", "ROIs1158/119"):  # a raw tree stand-in
        (tmp_path / "raw" / roi).mkdir(parents=True)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--profile",
            "lumi",
            "--directory",
            str(tmp_path),
            "-n",
            "-p",
            "--config",
            f"data={{raw: {tmp_path / 'raw'}}}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=stand_in_env(tmp_path),
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert job_count(text, "era5_wind") == 1 and job_count(text, "wind_cache") == 1, text[-3000:]
    assert "vcloud wind-cache --out results/wind/scan_orders.npz --grid-h 32 --grid-w 32" in text
    fetch = commands(text, "vcloud era5-wind")
    assert len(fetch) == 1
    for roi in ("ROIs1158/119", "ROIs1868/119", "ROIs2017/22"):
        assert f"--roi {roi}" in fetch[0]
    assert "--out resources/wind/era5_u10v10.zarr" in fetch[0] and "--size 256" in fetch[0]
    prepares = commands(text, "vcloud prepare")
    assert len(prepares) == 3 and all("--wind resources/wind/era5_u10v10.zarr" in p for p in prepares)
    for stage in (1, 2, 3):
        train = [line for line in commands(text, "vcloud train") if f"--stage {stage} " in line]
        assert train and "--wind-cache results/wind/scan_orders.npz" in train[0], stage
    assert "vcloud doctor: train_stage" not in text  # no wind complaint from the doctor


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
def test_era5_wind_rule_against_a_local_store_feeds_prepare(tiny_raw_master, tmp_path):
    from tests.unit.test_era5 import write_arco_like
    from vcloud.data.era5 import wind_needs
    from vcloud.data.store import open_store

    from ..conftest import TINY, TINY_ROIS

    roi = TINY_ROIS[0]
    need = wind_needs(tiny_raw_master, roi, times=TINY["times"], size=TINY["size"])
    noon = np.array([np.datetime64(d, "ns") + np.timedelta64(12, "h") for d in need.dates])
    source = write_arco_like(tmp_path / "arco.zarr", noon)
    config = {
        "synthetic": {"enabled": False},
        "data": {
            "raw": str(tiny_raw_master),
            "rois": [str(roi)],
            "times": TINY["times"],
            "patch_size": TINY["size"],
            "wind_table": "resources/wind/era5_u10v10.zarr",
        },
        "wind": {"era5_source": str(source)},
    }
    (tmp_path / "real.yaml").write_text(yaml.safe_dump(config))
    target = f"results/prepared/rois/{roi.slug}.zarr"
    run(["--cores", "1", "--configfile", "real.yaml", "-d", str(tmp_path), target], cwd=tmp_path)
    assert (tmp_path / "resources/wind/era5_u10v10.zarr" / roi.slug).is_dir()
    assert (tmp_path / "benchmarks/era5_wind/era5_wind.tsv").is_file()
    ds = open_store(tmp_path / target)
    assert np.isfinite(ds["wind_u"].values).all() and np.isfinite(ds["wind_v"].values).all()
    assert float(np.abs(ds["wind_u"].values).max()) > 0.5

"""Shared by the LUMI-profile workflow tests and the real-SLURM tests: a tiny overlay config,
the stand-in apptainer on PATH, and a reader for its call log."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from vcloud.runtime.lumi import Cluster
from vcloud.runtime.profile import load_workflow_config

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "tests" / "lumi" / "bin"
# An account the test cluster knows (tests/slurm/cluster-up.sh); not a placeholder.
TEST_ACCOUNT = "project_465000000"


def write_overlay(workdir: Path, **extra) -> tuple[Path, Cluster]:
    """A config over config/lumi.yaml: one synthetic ROI of one 32-px location, a dummy image."""
    image = workdir / "image.sif"
    image.write_text("stand-in image\n")
    overlay = {
        "synthetic": {"enabled": True, "rois": ["ROIs1868/119"], "patches": 1},
        "data": {"patch_size": 32},
        "paths": {"prepared": "results/prepared"},
        "cluster": {"account": TEST_ACCOUNT, "image": str(image)},
        # The test node has 2 cores: the LUMI requests (4 cores, 16 GB) would never start.
        "resources": {
            rule: {"runtime": 20, "mem_mb": 2000, "threads": 1, "partition": "small"}
            for rule in ("synth_raw", "prepare_roi")
        },
        **extra,
    }
    path = workdir / "overlay.yaml"
    path.write_text(yaml.safe_dump(overlay))
    config = load_workflow_config(REPO / "config" / "lumi.yaml")
    config["cluster"].update(overlay["cluster"])
    return path, Cluster.from_config(config)


def stand_in_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{STAND_IN}:{env['PATH']}"
    env["VCLOUD_APPTAINER_LOG"] = str(workdir / "apptainer.jsonl")
    return env


def apptainer_calls(workdir: Path) -> list[dict]:
    log = workdir / "apptainer.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def exec_calls(workdir: Path) -> list[dict]:
    return [c for c in apptainer_calls(workdir) if c["argv"][:1] == ["exec"]]


def binds_of(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word in ("-B", "--bind")]

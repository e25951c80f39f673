"""A site the code has never seen, from one new file: its profile is written and snakemake
plans the run on it with the site's partitions, typed GPU GRES and `--nv` on the GPU steps."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.lumi.helpers import stand_in_env
from tests.workflow.snakemake_run import copy_worktree
from vcloud.cli import build_parser

pytestmark = pytest.mark.workflow

NEW_SITE = {
    "name": "kestrel",
    "title": "Kestrel",
    "account_pattern": "^grp[0-9]{3}$",
    "account_example": "grp001",
    "vendor": "nvidia",
    "gpu_request": "gres",
    "runner": "apptainer",
    "transport": "ib",
    "billing": {"formula": "gpu_hours", "unit": "GPU-h", "source": "made up for the test", "verified": False},
    "placement": {"cpu": "cpu", "gpu": "gpu"},
    "gpu_rules": {"mem_mb_per_gpu": 30000, "threads": 4},
    "image": "/site/images/torch.sif",
    "binds": ["/site"],
    "containlibs": [],
    "partitions": {
        "cpu": {"max_runtime": 1440, "max_nodes": 2, "gpus_per_node": 0, "full_nodes": False},
        "gpu": {
            "max_runtime": 4320,
            "max_nodes": 1,
            "gpus_per_node": 2,
            "full_nodes": False,
            "gpu": {"model": "T4", "memory_gb": 16, "compute_capability": 7.5, "gres_type": "t4"},
        },
    },
    "env": {"NCCL_IB_DISABLE": "0"},
}


def test_a_new_site_from_one_file_plans_a_run(tmp_path):
    repo = copy_worktree(tmp_path / "repo")
    (repo / "config" / "sites" / "kestrel.yaml").write_text(yaml.safe_dump(NEW_SITE, sort_keys=False))
    raw = tmp_path / "raw"
    for roi in ("ROIs1868/119", "ROIs2017/22", "ROIs1158/119"):
        (raw / roi).mkdir(parents=True)
    run = {
        "data": {"raw": str(raw), "rois": ["ROIs1868/119", "ROIs2017/22", "ROIs1158/119"], "patch_size": 32},
        "model_config": "config/models/small.yaml",  # bf16 off: the T4 (7.5) has none
        "cluster": {"site": "kestrel", "account": "grp042", "gpu_hour_budget": 1000},
        "synthetic": {"enabled": False},
    }
    (repo / "config" / "kestrel.yaml").write_text(yaml.safe_dump(run))
    made = subprocess.run(
        [sys.executable, "-m", "vcloud.cli", "profile", "--site", "kestrel"],
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    assert (repo / "kestrel").resolve() == (repo / "profiles" / "kestrel").resolve()
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", "kestrel", "-n", "-p", "--directory", str(tmp_path / "work")],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
        env=stand_in_env(tmp_path),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    block = out[out.index("rule train_stage1:") :]
    block = block[: block.index("\n\n")]
    assert "slurm_partition=gpu" in block and "gres=gpu:t4:1" in block and "slurm_account=grp042" in block, block
    assert "srun --nodes=1 --ntasks-per-node=1 --gres=gpu:t4:1 --cpus-per-task=4 apptainer exec --nv" in block
    assert "--env NCCL_IB_DISABLE=0" in block
    prepare = out[out.index("rule prepare_roi:") :]
    prepare = prepare[: prepare.index("\n\n")]
    assert "slurm_partition=cpu" in prepare and "--nv" not in prepare


def kestrel_run(tmp_path: Path) -> tuple[Path, dict]:
    """A clone with the new site's file, and a run file for it over an empty raw folder."""
    repo = copy_worktree(tmp_path / "repo")
    (repo / "config" / "sites" / "kestrel.yaml").write_text(yaml.safe_dump(NEW_SITE, sort_keys=False))
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("s1_africa", "s2_africa", "s1_africa_test", "s2_africa_test"):
        (raw / f"{name}.tar.gz").write_bytes(b"")
    run = {"data": {"raw": str(raw)}, "synthetic": {"enabled": False}}
    run["cluster"] = {"site": "kestrel", "account": "grp042", "gpu_hour_budget": 100}
    return repo, run


def plan_rehearsal(repo: Path, run: dict, tmp_path: Path) -> str:
    """`vcloud profile --site kestrel`, then the rehearsal's dry run with its shell commands."""
    (repo / "config" / "kestrel.yaml").write_text(yaml.safe_dump(run))
    made = subprocess.run(
        [sys.executable, "-m", "vcloud.cli", "profile", "--site", "kestrel"], cwd=repo, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        "kestrel",
        "-n",
        "-p",
        "--directory",
        str(tmp_path / "w"),
    ]
    command += ["--configfile", "config/kestrel.yaml", "config/rehearsal.yaml"]
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600, env=stand_in_env(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def test_the_new_site_rehearses_on_its_gpu_partition_with_its_transport(tmp_path):
    repo, run = kestrel_run(tmp_path)
    out = plan_rehearsal(repo, run, tmp_path)
    transport = out[out.index("rule rehearse_transport:") :]
    transport = transport[: transport.index("\n\n")]
    assert "gres=gpu:t4:2" in transport and "--nproc-per-node=2" in transport and "--expect ib" in transport
    stage1 = out[out.index("rule train_stage1:") :]
    stage1 = stage1[: stage1.index("\n\n")]
    assert "slurm_partition=gpu" in stage1 and "runtime=12" in stage1
    assert "python3 -m vcloud.runtime.launch --warn-after 150 vcloud train --stage 1" in stage1
    # The closing summary's command line is one vcloud takes on an NVIDIA site (no MIOpen cache
    # there: an empty --miopen-cache once left the option without its argument).
    summary = out[out.index("rule rehearsal_summary:") :]
    line = next(text for text in summary.splitlines() if text.startswith("Shell command: vcloud rehearsal-summary"))
    line = line.removeprefix("Shell command: ")
    argv = shlex.split(line.split(" > ")[0])[1:]
    assert "--miopen-cache" not in argv
    build_parser().parse_args(argv)  # exits 2 on a malformed line


def test_a_rehearsal_of_a_grid_plans_one_run_of_it(tmp_path):
    """A run file with experiments and seeds, rehearsed: the jobs of one run (compare's baseline,
    its first seed, at the rehearsal's epochs), not the grid's, and the summary names that run."""
    repo, run = kestrel_run(tmp_path)
    run["experiments"] = [
        {"name": "base"},
        {"name": "s3_long", "overrides": {"stage3": {"train": {"lr": 1.0e-4, "epochs": 300}}}},
        {"name": "no_s1", "overrides": {"data": {"s1_dropout": 0.0}}},
    ]
    run["seeds"] = [7, 8]
    run["compare"] = {"baseline": "s3_long"}
    out = plan_rehearsal(repo, run, tmp_path)
    table = out.split("job ", 1)[1].split("total", 1)[0]
    counts = {name: int(n) for name, n in re.findall(r"^(\w+)\s+(\d+)$", table, flags=re.M)}
    # One run: each stage trained once, scored on test and val (a research run's), one stage table,
    # one model config written; the grid would train stage 3 six times and stage 0 four.
    assert all(counts[f"train_stage{n}"] == 1 and counts[f"evaluate_stage{n}"] == 2 for n in range(4)), counts
    assert counts["run_config"] == 1 and counts["report_tables"] == 1 and counts["compare"] == 1, counts
    assert counts["rehearsal_summary"] == 1 and counts["rehearse_transport"] == 1, counts
    stage3 = next(line for line in out.splitlines() if "vcloud train --stage 3" in line)
    assert "--config results-rehearsal/model.yaml" in stage3 and "--out results-rehearsal/stage3" in stage3, stage3
    config = next(line for line in out.splitlines() if "vcloud run-config" in line)
    assert '"lr": 0.0001' in config and '"seed": 7' in config and "300" not in config, config  # not its epochs
    summary = next(line for line in out.splitlines() if "vcloud rehearsal-summary" in line)
    assert "--experiment s3_long --seed 7" in summary and "--config results-rehearsal/model.yaml" in summary
    argv = shlex.split(summary[summary.index("vcloud rehearsal-summary") :].split(" > ")[0])[1:]
    assert build_parser().parse_args(argv).experiment == "s3_long"
    assert "results-rehearsal/s3_long" not in out and "results-rehearsal/base" not in out

"""vcloud doctor: each failure of the field reports is caught with one line naming the key."""

from __future__ import annotations

import copy
import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from vcloud.config import load_model_config
from vcloud.runtime.doctor import Report, bound_paths, check_memory, preflight
from vcloud.runtime.lumi import Cluster
from vcloud.runtime.profile import load_workflow_config

REPO = Path(__file__).resolve().parents[2]
ALL_INPUTS = {f"train_stage{n}": {"train", "val", "wind_cache"} for n in range(4)}


@pytest.fixture(scope="module")
def base() -> dict:
    config = load_workflow_config(REPO / "config" / "lumi.yaml")
    config["cluster"]["account"] = "project_465000123"
    return config


@pytest.fixture(scope="module")
def model_set():
    return load_model_config(REPO / "config" / "models" / "full.yaml")


def good_args(config) -> tuple[str, str]:
    cluster = Cluster.from_config(config)
    return cluster.apptainer_args(), cluster.precommand()


def run(config, model_set, *, args=None, pre=None, inputs=ALL_INPUTS) -> Report:
    good_a, good_p = good_args(config)
    return preflight(config, model_set, apptainer_args=good_a if args is None else args,
                     precommand=good_p if pre is None else pre, train_inputs=inputs, memory=False)


def test_shipped_lumi_config_passes_once_account_is_set(base, model_set):
    report = run(base, model_set)
    assert report.errors == []
    assert any("total 280.0 GPU-h" in line for line in report.lines)


def test_rocm_is_refused(base, model_set):
    args, _ = good_args(base)
    report = run(base, model_set, args=args + " --rocm")
    assert len(report.errors) == 1 and "--rocm" in report.errors[0]


@pytest.mark.parametrize("missing", ["/opt/cray/libfabric", "/scratch/project_465000123",
                                     "/projappl/project_465000123", "/flash/project_465000123"])
def test_each_missing_bind_is_named(base, model_set, missing):
    args = " ".join(f"-B {p}" for p in Cluster.from_config(base).binds if p != missing)
    report = run(base, model_set, args=args)
    assert report.errors == [f"apptainer-args: bind {missing} missing (cluster.binds; "
                             "regenerate the profile with `vcloud lumi-profile`)"]


def test_bind_parsing_accepts_lists_and_destinations():
    assert bound_paths("--bind /a:/x,/b/ -B /c:/c:ro --bind=/d") == {"/a", "/b", "/c", "/d"}


def test_missing_containlib_is_named(base, model_set):
    report = run(base, model_set, pre="export SINGULARITY_CONTAINLIBS=/usr/lib64/libcxi.so.1")
    assert len(report.errors) == 1 and "librocm_smi64.so.7" in report.errors[0]


def test_placeholder_account(base, model_set):
    config = copy.deepcopy(base)
    config["cluster"]["account"] = "project_465XXXXXX"
    report = run(config, model_set)
    assert len(report.errors) == 1 and report.errors[0].startswith("cluster.account:")


@pytest.mark.parametrize("change,expected", [
    ({"runtime": 4321}, "resources.train_stage1.runtime: 3-00:01:00 is above the small-g limit"),
    ({"partition": "standard-g", "gpus": 8, "runtime": 2881}, "resources.train_stage1.runtime: 2-00:01:00 is above the standard-g"),
    ({"partition": "small"}, "resources.train_stage1.gpus: small has no GPUs"),
    ({"partition": "standard-g", "gpus": 1, "runtime": 2880}, "resources.train_stage1.gpus: standard-g allocates and bills whole nodes"),
    ({"gpus": 9}, "resources.train_stage1.gpus: 9 per node, but a small-g node has 8 GCDs"),
    ({"nodes": 2, "gpus": 8}, "resources.train_stage1.nodes: 2 nodes do not fit small-g"),
    ({"partition": "gpu-a100"}, "resources.train_stage1.partition: 'gpu-a100' is not one of"),
    ({"cpus_per_gpu": 8, "gpus": 8}, "resources.train_stage1.cpus_per_gpu: 8 x 8 GCDs"),
    ({"gpus": 0}, "resources.train_stage1.gpus: 0 on the GPU partition small-g"),
])
def test_partition_limits(base, model_set, change, expected):
    config = copy.deepcopy(base)
    config["resources"]["train_stage1"].update(change)
    report = run(config, model_set)
    assert report.errors[0].startswith(expected), report.errors
    assert all(e.startswith("resources.train_stage1.") for e in report.errors)


def test_multinode_on_standard_g_passes(base, model_set):
    config = copy.deepcopy(base)
    config["resources"]["train_stage1"].update(partition="standard-g", nodes=4, gpus=8, runtime=2880)
    report = run(config, model_set)
    assert report.errors == []
    assert any("train_stage1" in line and "32 GCDs" in line and "1536.0 GPU-h" in line
               for line in report.lines)


def test_budget_exceeded(base, model_set):
    config = copy.deepcopy(base)
    config["cluster"]["gpu_hour_budget"] = 100
    report = run(config, model_set)
    assert report.errors == ["cluster.gpu_hour_budget: the requested wall times need 280 GPU-h, "
                             "more than the budget of 100"]


def test_distributed_wind_scan_without_cache_input(base, model_set):
    config = copy.deepcopy(base)
    config["resources"]["train_stage2"]["gpus"] = 8
    wind = dataclasses.replace(model_set.stage1.model, wind_scan=True)
    scanning = dataclasses.replace(model_set, stage1=dataclasses.replace(model_set.stage1, model=wind))
    inputs = dict(ALL_INPUTS, train_stage2={"train", "val"})
    report = run(config, scanning, inputs=inputs)
    assert report.errors == ["train_stage2: 8 ranks scan by wind but the rule does not take the "
                             "wind cache (results/wind/scan_orders.npz) as input"]
    calm = dataclasses.replace(model_set.stage1.model, wind_scan=False)
    no_scan = dataclasses.replace(model_set, stage1=dataclasses.replace(model_set.stage1, model=calm))
    assert run(config, no_scan, inputs=inputs).errors == []  # no wind scan: no cache needed


def test_memory_above_one_gcd(base, model_set):
    report = Report()
    check_memory(model_set, Cluster.from_config(base), report, estimate={"cfdt_gb_configured": 84.6})
    assert report.errors and report.errors[0].startswith("memory: the stage-1 step needs about 84.6 GB")
    report = Report()
    check_memory(model_set, Cluster.from_config(base), report, estimate={"cfdt_gb_configured": 6.0})
    assert report.errors == []


@pytest.mark.skipif(shutil.which("vcloud") is None, reason="vcloud not installed")
def test_cli_exits_nonzero_with_one_line_per_problem(tmp_path):
    """The shipped placeholder account fails the pre-flight from the command line."""
    out = subprocess.run(["vcloud", "doctor", "--profile", str(REPO / "profiles" / "lumi"),
                          "--config", str(REPO / "config" / "lumi.yaml")],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2
    errors = [line for line in out.stdout.splitlines() if line.startswith("error:")]
    assert errors == ["error: cluster.account: 'project_465XXXXXX' is a placeholder; set your LUMI "
                      "project (e.g. project_465000123) in config/lumi.yaml"]
    assert "stage-1 memory estimate" in out.stdout and "GPU-h budget" in out.stdout

"""`snakemake --profile lumi` from the repository root, as typed, with a stand-in apptainer.

Apptainer cannot be installed on the CI machine: tests/lumi/bin/apptainer records its
arguments and runs the command on the host. These tests run snakemake's local executor with
the lumi profile (so the container wrapping is real); tests/slurm/ runs it through SLURM.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.lumi.helpers import REPO, TEST_ACCOUNT, binds_of, exec_calls, stand_in_env, write_overlay

pytestmark = pytest.mark.workflow
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def snakemake(args, workdir, env, check=True):
    # cwd is the repository root: `--profile lumi` resolves to ./lumi -> profiles/lumi.
    proc = subprocess.run(
        [*SNAKEMAKE, "--profile", "lumi", "--directory", str(workdir), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def make_raw_folders(root):
    """ROI folders of the raw layout (test, val and train ROIs): enough for the DAG."""
    for roi in ("ROIs1868/119", "ROIs2017/22", "ROIs1158/119"):
        (root / "raw" / roi).mkdir(parents=True)


def test_dry_run_as_typed_warns_about_the_placeholder_account(tmp_path):
    """The shipped config: a dry run works (DAG inspection on a login node) and says what
    stops a real run."""
    make_raw_folders(tmp_path)
    env = stand_in_env(tmp_path)
    proc = snakemake(["-n", "--config", f"data={{raw: {tmp_path / 'raw'}}}"], tmp_path, env)
    out = proc.stdout + proc.stderr
    assert "vcloud doctor: cluster.account: 'project_465XXXXXX' is a placeholder" in out
    assert "slurm_partition=small-g" in out and "gpu=1" in out and "cpus_per_gpu=7" in out
    assert "train_stage3" in out


def test_real_run_with_placeholder_account_submits_nothing(tmp_path):
    make_raw_folders(tmp_path)
    env = stand_in_env(tmp_path)
    proc = snakemake(
        ["--executor", "local", "--cores", "1", "--config", f"data={{raw: {tmp_path / 'raw'}}}"],
        tmp_path,
        env,
        check=False,
    )
    assert proc.returncode != 0
    assert "vcloud doctor: cluster.account" in proc.stderr + proc.stdout
    assert "(nothing was submitted)" in proc.stderr + proc.stdout
    assert exec_calls(tmp_path) == []


def test_rules_run_in_the_image_with_the_binds_and_never_rocm(tmp_path):
    overlay, cluster = write_overlay(tmp_path)
    env = stand_in_env(tmp_path)
    # One job at a time: the recording stand-in appends one JSON line per call to one file.
    snakemake(
        [
            "--executor",
            "local",
            "--cores",
            "1",
            "--configfile",
            "config/lumi.yaml",
            str(overlay),
            "--apptainer-args",
            cluster.apptainer_args(),
            "--",
            "results/prepared/rois/ROIs1868_119.zarr",
        ],
        tmp_path,
        env,
    )
    calls = exec_calls(tmp_path)
    commands = [c["argv"][-1] for c in calls]
    # synth_raw, index_archive for the ROI's S1 and S2 archives, prepare_roi: each in the image.
    assert len(calls) == 4
    assert "vcloud synth" in commands[0] and "vcloud prepare" in commands[3]
    assert all("vcloud index" in command for command in commands[1:3])
    for call in calls:
        argv = call["argv"]
        assert "--rocm" not in argv
        assert argv[argv.index("bash") - 1] == cluster.image  # the image, right before the command
        binds = binds_of(argv)
        for path in (
            "/opt/cray/libfabric",
            f"/scratch/{TEST_ACCOUNT}",
            f"/projappl/{TEST_ACCOUNT}",
            f"/flash/{TEST_ACCOUNT}",
        ):
            assert path in binds
    assert (tmp_path / "results/prepared/rois/ROIs1868_119.zarr/zarr.json").is_file()


def test_bind_missing_from_the_command_line_stops_the_run(tmp_path):
    overlay, cluster = write_overlay(tmp_path)
    env = stand_in_env(tmp_path)
    args = cluster.apptainer_args().replace(f"-B /flash/{TEST_ACCOUNT}", "") + " --rocm"
    proc = snakemake(
        [
            "--executor",
            "local",
            "--cores",
            "1",
            "--configfile",
            "config/lumi.yaml",
            str(overlay),
            "--apptainer-args",
            args,
            "--",
            "results/prepared/rois/ROIs1868_119.zarr",
        ],
        tmp_path,
        env,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "vcloud doctor: apptainer-args: --rocm" in out
    assert f"vcloud doctor: apptainer-args: bind /flash/{TEST_ACCOUNT} missing" in out
    assert exec_calls(tmp_path) == []


def test_set_resources_gpu_changes_the_launch_line(tmp_path):
    """`--set-resources train_stage1:gpu=8`: the job asks for 8 GCDs with 8 x the memory per
    GCD, and its launch line starts torchrun once with 8 processes (dry run, as typed)."""
    make_raw_folders(tmp_path)
    env = stand_in_env(tmp_path)
    proc = snakemake(
        ["-n", "--config", f"data={{raw: {tmp_path / 'raw'}}}", "--set-resources", "train_stage1:gpu=8"], tmp_path, env
    )
    out = proc.stdout + proc.stderr
    block = out[out.index("rule train_stage1:") :]
    block = block[: block.index("\n\n")]
    resources = next(line for line in block.splitlines() if "resources:" in line)
    assert "gpu=8" in resources and "mem_mb=480000" in resources and "tasks_per_node=2" in resources
    assert "--nproc-per-node=8" in out and "--gpus-per-node=8 --cpus-per-task=56" in out
    assert out.count("--nproc-per-node=") == 1  # the other stages keep one GCD each
    assert "--signal=USR1@300" in resources


def test_set_resources_that_change_the_task_geometry_are_refused(tmp_path):
    make_raw_folders(tmp_path)
    env = stand_in_env(tmp_path)
    proc = snakemake(
        ["-n", "--config", f"data={{raw: {tmp_path / 'raw'}}}", "--set-resources", "train_stage1:tasks_per_gpu=1"],
        tmp_path,
        env,
        check=False,
    )
    assert proc.returncode != 0
    assert (
        "--set-resources train_stage1:tasks_per_gpu: vcloud sets the task geometry itself" in proc.stdout + proc.stderr
    )

"""`snakemake --profile lumi` from the repository root, as typed, with a stand-in apptainer.

Apptainer cannot be installed on the CI machine: tests/lumi/bin/apptainer records its
arguments and runs the command in a sandbox as strict as a container (the image's PATH plus
SINGULARITYENV_PREPEND_PATH; only the binds, the home and the physical working directory are
visible). These tests run snakemake's local executor with the lumi profile, so every rule runs
as a local rule does on a LUMI login node; tests/slurm/ runs it through SLURM.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.lumi.helpers import (
    REPO,
    TEST_ACCOUNT,
    binds_of,
    exec_calls,
    lumi_tree,
    require_stand_in,
    stand_in_env,
    write_overlay,
)

pytestmark = pytest.mark.workflow
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


@pytest.fixture(autouse=True)
def _stand_in(request):
    if request.node.get_closest_marker("container"):
        require_stand_in()


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


@pytest.mark.container
def test_rules_run_in_the_image_with_the_binds_and_never_rocm(tmp_path):
    """Every rule, run where snakemake runs (as era5_wind and the report rules do on a LUMI
    login node), finds `vcloud` in the squashfs environment: snakemake gives the profile's
    precommand to remote jobs only, so the workflow exports the container environment itself."""
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
        assert set(cluster.binds) <= set(binds_of(argv))
        assert f"{cluster.env_image}:/user-software:image-src=/" in binds_of(argv)
        assert call["env"]["SINGULARITYENV_PREPEND_PATH"] == "/user-software/venv/bin"
        assert call["containlibs"] == ",".join(cluster.containlibs)
    assert (tmp_path / "results/prepared/rois/ROIs1868_119.zarr/zarr.json").is_file()


@pytest.mark.container
def test_working_directory_through_the_scratch_symlink(tmp_path):
    """The clone reached through /scratch/<project> (a symlink): jobs start in the physical
    /pfs path and `../data` lies there. Bound without /pfs, the start check names the path and
    submits nothing; with /pfs bound (config/lumi.yaml), the rules see it and the run passes."""
    lumi = tmp_path / "lumi"
    code = lumi_tree(lumi)
    container = tmp_path / "container"
    container.mkdir()
    extra = {"paths": {"prepared": "../data/prepared"}}
    scratch_only = [str(lumi / "scratch" / TEST_ACCOUNT), str(container)]
    overlay, cluster = write_overlay(container, binds=scratch_only, **extra)
    env = stand_in_env(tmp_path)
    target = ["--", "../data/prepared/rois/ROIs1868_119.zarr"]
    base = ["--executor", "local", "--cores", "1", "--configfile", "config/lumi.yaml", str(overlay)]
    proc = snakemake([*base, "--apptainer-args", cluster.apptainer_args(), *target], code, env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    real = lumi / "pfs" / "lustrep2" / "scratch" / TEST_ACCOUNT / "vcloud"
    assert f"vcloud doctor: paths.prepared: ../data/prepared (really {real / 'data/prepared'}) is outside" in out
    assert "vcloud doctor: working directory: . (really" in out and "(nothing was submitted)" in out
    assert exec_calls(tmp_path) == []

    overlay, cluster = write_overlay(container, binds=[str(lumi / "pfs"), *scratch_only], **extra)
    snakemake([*base, "--apptainer-args", cluster.apptainer_args(), *target], code, env)
    assert (real / "data/prepared/rois/ROIs1868_119.zarr/zarr.json").is_file()
    assert len(exec_calls(tmp_path)) == 4


@pytest.mark.container
def test_stale_environment_is_refused_before_anything_runs(tmp_path):
    """src/ edited after `vcloud image`: the start check compares the squashfs stamp with the
    checkout and stops, naming the file and the command that rebuilds it."""
    overlay, cluster = write_overlay(tmp_path)
    stale = tmp_path / "stale"
    (stale / "env").mkdir(parents=True)
    (stale / "env" / "vcloud-version").write_text("vcloud 0.1.0 0000000 src 0000000000000000\n")
    subprocess.run(["mksquashfs", str(stale / "env"), str(stale / "old.sqsh"), "-quiet", "-no-xattrs"], check=True)
    overlay.write_text(overlay.read_text().replace(str(cluster.env_image), str(stale / "old.sqsh")))
    args = cluster.apptainer_args().replace(str(cluster.env_image), str(stale / "old.sqsh"))
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
        stand_in_env(tmp_path),
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"vcloud doctor: cluster.env_image: {stale / 'old.sqsh'} holds 'vcloud 0.1.0 0000000" in out
    assert "rebuild it with `vcloud image`" in out and "(nothing was submitted)" in out
    assert exec_calls(tmp_path) == []


@pytest.mark.container
def test_bind_missing_from_the_command_line_stops_the_run(tmp_path):
    overlay, cluster = write_overlay(tmp_path)
    env = stand_in_env(tmp_path)
    args = cluster.apptainer_args().replace(f"-B {tmp_path} ", "") + " --rocm"
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
    assert f"vcloud doctor: apptainer-args: bind {tmp_path} missing" in out
    assert exec_calls(tmp_path) == []


def test_set_resources_gpu_changes_the_launch_line(tmp_path):
    """`--set-resources train_stage1:gpu=8`: a whole node, so the job goes to standard-g (same
    price as 8 GCDs of small-g, CPU binding), asks for 8 x the memory per GCD, and its launch
    line starts one task per GCD with the GCD-affine CPU masks (dry run, as typed)."""
    make_raw_folders(tmp_path)
    env = stand_in_env(tmp_path)
    proc = snakemake(
        ["-n", "--config", f"data={{raw: {tmp_path / 'raw'}}}", "--set-resources", "train_stage1:gpu=8"], tmp_path, env
    )
    out = proc.stdout + proc.stderr
    block = out[out.index("rule train_stage1:") :]
    block = block[: block.index("\n\n")]
    resources = next(line for line in block.splitlines() if "resources:" in line)
    assert "gpu=8" in resources and "mem_mb=480000" in resources and "tasks_per_node=8" in resources
    assert "slurm_partition=standard-g" in resources
    assert "srun --nodes=1 --ntasks-per-node=8 --gpus-per-node=8 --cpu-bind=mask_cpu:0xfe000000000000," in block
    assert "torchrun" not in out and out.count("--cpu-bind=mask_cpu:") == 1  # the others keep one GCD each
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


def test_rehearsal_plan_indexes_one_region_and_runs_every_gpu_rule_on_dev_g(tmp_path):
    """`snakemake --profile lumi --configfile config/lumi.yaml config/lumi-rehearsal.yaml -n` as
    typed: 4 archives indexed (not 20), 3 ROIs, every GPU job on dev-g one at a time, the forced
    warning on stage 1, the 8-GCD transport step and the closing summary."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("s1_africa", "s2_africa", "s1_africa_test", "s2_africa_test"):
        (raw / f"{name}.tar.gz").write_bytes(b"")
    proc = snakemake(
        [
            "-n",
            "-p",
            "--configfile",
            "config/lumi.yaml",
            "config/lumi-rehearsal.yaml",
            "--config",
            f"data={{raw: {raw}, rois: [ROIs1970/21, ROIs2017/22, ROIs2017/32]}}",
        ],
        tmp_path,
        stand_in_env(tmp_path),
    )
    out = proc.stdout + proc.stderr
    counts = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    assert counts["index_archive"] == 4 and counts["prepare_roi"] == 3, counts
    assert counts["rehearse_transport"] == 1 and counts["rehearsal_summary"] == 1, counts
    for rule in ("train_stage0", "train_stage1", "train_stage2", "train_stage3", "evaluate_stage3"):
        block = out[out.index(f"rule {rule}:") :]
        block = block[: block.index("\n\n")]
        resources = next(line for line in block.splitlines() if "resources:" in line)
        assert "slurm_partition=dev-g" in resources and "dev_g_jobs=1" in resources, resources
    assert out.count("python3 -m vcloud.runtime.launch --warn-after 150 vcloud train --stage 1") == 1
    transport = out[out.index("rule rehearse_transport:") :]
    assert "--nproc-per-node=8" in transport[: transport.index("\n\n")]
    assert "vcloud rehearsal-summary --results results-rehearsal" in out

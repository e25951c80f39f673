"""`vcloud image`: the squashfs environment built the way LUMI allows (no root, no fakeroot).

The container runtime is the recording stand-in (tests/lumi/bin/apptainer runs `exec`
commands on the host); mksquashfs/unsquashfs are the real Debian squashfs-tools, installed by
tests/system-packages.sh: missing, the tests that need them skip naming it (fail under CI=true).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lumi.helpers import REPO, apptainer_calls, require_stand_in, stand_in_env, write_stand_in_image
from tests.system import require
from vcloud.errors import BadInputError
from vcloud.runtime import image


@pytest.fixture(scope="session")
def squashfs_tools():
    require("squashfs-tools", "mksquashfs", "unsquashfs")
    return True


def test_commands_make_the_venv_inside_the_image_and_pack_it(tmp_path):
    commands = image.build_commands(base="/appl/csc.sif", repo=REPO, build=tmp_path / "env", out=tmp_path / "env.sqsh")
    venv, reqs, package, smoke, pack = commands
    for command in (venv, reqs, package, smoke):
        assert command[:6] == ["singularity", "exec", "-B", f"{tmp_path / 'env'}:/user-software", "-B", str(REPO)]
        assert command[6] == "/appl/csc.sif" and "--rocm" not in command and "build" not in command
    assert venv[7:] == ["python3", "-m", "venv", "--system-site-packages", "/user-software/venv"]
    assert reqs[-2:] == ["-r", str(REPO / "containers/requirements-image.txt")]
    assert package[-2:] == ["--no-deps", str(REPO)]  # torch stays the image's build
    assert pack[:3] == ["mksquashfs", str(tmp_path / "env"), str(tmp_path / "env.sqsh")]
    assert "snakemake" not in smoke[-1]  # LUMI's jobs run the host's snakemake


def test_a_site_that_runs_snakemake_from_the_image_gets_the_controllers_packages(tmp_path):
    """host_installs: false (Olivia): the environment also installs requirements-controller.txt,
    and the build's import check fails unless snakemake, its SLURM plugin and MLflow import."""
    commands = image.build_commands(
        base="/appl/x.sif", repo=REPO, build=tmp_path / "env", out=tmp_path / "env.sqsh", controller=True
    )
    reqs, smoke = commands[1], commands[3]
    assert reqs[-4:] == [
        "-r",
        str(REPO / "containers/requirements-image.txt"),
        "-r",
        str(REPO / "containers/requirements-controller.txt"),
    ]
    assert "snakemake, snakemake_executor_plugin_slurm, mlflow;" in smoke[-1]


def test_build_with_the_stand_in_and_real_mksquashfs_then_the_doctor_reads_the_stamp(tmp_path, squashfs_tools):
    require_stand_in()
    env = stand_in_env(tmp_path)
    base = write_stand_in_image(tmp_path)
    out = tmp_path / "projappl" / "vcloud-env.sqsh"
    old_path = os.environ["PATH"]
    os.environ["PATH"] = env["PATH"]
    os.environ["VCLOUD_APPTAINER_LOG"] = env["VCLOUD_APPTAINER_LOG"]
    try:
        # mount=None: the build folder bound at its own path (node-local, under $TMPDIR); on
        # LUMI it is bound at /user-software inside the image.
        lines = image.build(
            base=str(base), repo=REPO, out=out, mount=None, runner="apptainer", workdir=tmp_path / "node-tmp"
        )
    finally:
        os.environ["PATH"] = old_path
        os.environ.pop("VCLOUD_APPTAINER_LOG")
    assert len(lines) == 6 and lines[-1].startswith("mksquashfs ") and lines[-1].endswith("-no-xattrs")
    calls = [c["argv"] for c in apptainer_calls(tmp_path)]
    assert len(calls) == 5 and all(c[0] == "exec" and str(base) in c for c in calls)
    # pip was held to the image's own torch and numpy, and to the tested versions.
    assert "-c" in calls[2] and str(REPO / "containers/image-constraints.txt") in calls[2]
    assert not list((tmp_path / "node-tmp").iterdir())  # the node-local build folder is gone
    assert out.is_file() and not list(out.parent.glob("*.partial")) and not list(out.parent.glob(".vcloud-image-*"))
    listing = subprocess.run(["unsquashfs", "-l", str(out)], capture_output=True, text=True, check=True).stdout
    assert "squashfs-root/venv/bin/python" in listing and "squashfs-root/vcloud-version" in listing
    assert image.same_code(image.read_stamp(out), image.version_stamp(REPO))
    assert image.check(image=str(base), env_image=str(out), repo=REPO) == []
    # An environment of other code is named, with the way out.
    stale = tmp_path / "stale"
    (stale / "env").mkdir(parents=True)
    (stale / "env" / "vcloud-version").write_text("vcloud 0.0.1 deadbeef\n")
    subprocess.run(["mksquashfs", str(stale / "env"), str(stale / "old.sqsh"), "-quiet"], check=True)
    (problem,) = image.check(image=str(base), env_image=str(stale / "old.sqsh"), repo=REPO)
    assert "holds 'vcloud 0.0.1 deadbeef'" in problem and "rebuild it with `vcloud image`" in problem


def test_missing_image_and_environment_are_named(tmp_path):
    problems = image.check(image=str(tmp_path / "no.sif"), env_image=str(tmp_path / "no.sqsh"), repo=REPO)
    assert problems == [
        f"cluster.image: {tmp_path / 'no.sif'} not found; see the README quick start (`vcloud image`)",
        f"cluster.env_image: {tmp_path / 'no.sqsh'} not found; build it with `vcloud image`",
    ]


def test_failed_step_stops_with_one_line_and_leaves_nothing(tmp_path, monkeypatch, squashfs_tools):
    monkeypatch.setenv("PATH", f"{REPO / 'tests/lumi/bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("VCLOUD_APPTAINER_LOG", str(tmp_path / "calls.jsonl"))
    out = tmp_path / "env.sqsh"
    with pytest.raises(BadInputError, match="base image not found"):
        image.build(base=str(tmp_path / "missing.sif"), repo=REPO, out=out, runner="apptainer")
    base = tmp_path / "csc.sif"
    base.write_text("x")
    # A mount point under a regular file: the stand-in's venv step fails there.
    with pytest.raises(BadInputError, match=r"image build: .* failed"):
        image.build(base=str(base), repo=REPO, out=out, mount=str(base / "x"), runner="apptainer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls.jsonl", "csc.sif"]


def test_cli_dry_run_prints_the_commands():
    out = subprocess.run(
        [sys.executable, "-m", "vcloud.cli", "image", "--dry-run", "--out", "/tmp/x.sqsh"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("singularity exec ") and "sys.version_info" in lines[0]  # the image's Python
    assert lines[1].startswith("singularity exec -B ") and "--system-site-packages /user-software/venv" in lines[1]
    assert lines[-1].startswith("mksquashfs ") and Path("/tmp/x.sqsh.partial").name in lines[-1]


def test_an_image_python_older_than_3_11_is_refused_in_one_line():
    with pytest.raises(BadInputError) as err:
        image.image_pins("python 3.10.12\ntorch==2.5.1+rocm6.2.4\nnumpy==1.26.4\n", "/appl/csc.sif")
    assert str(err.value).startswith("/appl/csc.sif: the image's Python is 3.10.12; zarr 3 and xarray need >= 3.11")
    pins = image.image_pins("python 3.12.3\ntorch==2.5.1+rocm6.2.4\nnumpy==1.26.4\n", "/appl/csc.sif")
    assert pins == ["torch==2.5.1+rocm6.2.4", "numpy==1.26.4"]


def test_the_stamp_follows_uncommitted_source_edits(tmp_path, monkeypatch):
    """An edit of src/ without a commit changes the stamp, so a stale environment is caught."""
    import vcloud

    fake = tmp_path / "vcloud"
    fake.mkdir()
    (fake / "__init__.py").write_text("x = 1\n")
    monkeypatch.setattr(vcloud, "__file__", str(fake / "__init__.py"))
    before = image.source_digest(REPO)
    (fake / "__init__.py").write_text("x = 2\n")
    assert image.source_digest(REPO) != before

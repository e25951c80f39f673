"""profiles/<site>/bin (vcloud.runtime.image_run) in the strict container stand-in: on the host
each name runs in the image of the node's architecture with the SLURM client bound in; inside,
it is the image's own command (no container in a container); `apptainer` called from a job that
inherited the image's PATH is the host's again."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

from tests.lumi.helpers import (
    STAND_IN,
    build_env_image,
    exec_calls,
    require_stand_in,
    stand_in_env,
    write_stand_in_image,
)
from vcloud.runtime import image_run
from vcloud.runtime.cluster import Cluster
from vcloud.runtime.profile import load_workflow_config

pytestmark = pytest.mark.container
REPO = Path(__file__).resolve().parents[2]
PROBE = "import os, sys; print(os.path.isdir('/.singularity.d'), os.path.isdir('/run/munge'), sys.argv[1:])"
OTHER = {"x86_64": "aarch64", "aarch64": "x86_64"}


@pytest.fixture
def site(tmp_path):
    """An Olivia whose images are stand-ins: the node's architecture's, and the other one's
    (declared, so the stand-in refuses it as apptainer would), and a bin folder written."""
    require_stand_in()
    machine = platform.machine()
    native = write_stand_in_image(tmp_path / "native")
    foreign = write_stand_in_image(tmp_path / "foreign", arch=OTHER[machine])
    env_image = build_env_image(tmp_path / "native")
    config = load_workflow_config(REPO / "config" / "olivia.yaml")
    config["cluster"].update(
        account="nn1234k",
        image=str(foreign),  # the default: only the node's own architecture may take the native one
        images={machine: str(native), OTHER[machine]: str(foreign)},
        env_image=str(env_image),
        binds=[str(tmp_path)],
        slurm_binds=["/run/munge"],
    )
    cluster = Cluster.from_config(config)
    folder = tmp_path / "profile" / "bin"
    image_run.write(cluster, folder)
    return tmp_path, folder, native


def run(argv, tmp_path, **env):
    return subprocess.run(
        argv, cwd=tmp_path, env={**stand_in_env(tmp_path), **env}, capture_output=True, text=True, timeout=120
    )


def test_on_the_host_the_name_runs_in_the_image_of_this_architecture(site):
    tmp_path, folder, native = site
    out = run([str(folder / "python"), "-c", PROBE, "a b"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "True True ['a b']"  # inside, with munge's socket bound in
    (call,) = exec_calls(tmp_path)
    assert str(native) in call["argv"] and "/run/munge" in call["argv"]
    assert call["argv"][-4:] == ["python", "-c", PROBE, "a b"]


def test_inside_the_image_the_names_are_the_image_commands(site):
    tmp_path, folder, _ = site
    # vcloud (from the environment image) and python again, started inside: no second container.
    nested = f"import subprocess; subprocess.run(['python', '-c', {PROBE!r}], check=True); subprocess.run(['vcloud', '--help'], check=True, capture_output=True)"
    out = run([str(folder / "python"), "-c", nested], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("True True []")
    assert len(exec_calls(tmp_path)) == 1


def test_a_job_with_the_image_path_finds_the_host_apptainer_again(site):
    tmp_path, folder, _ = site
    # A job step that a containerised sbatch or srun started: PATH is the image's (this folder
    # first), VCLOUD_HOST_PATH the host's, where apptainer is.
    image_path = f"{folder}:/usr/local/bin:/usr/bin:/bin"
    host_path = f"{STAND_IN}:{os.environ['PATH']}"
    out = run([str(folder / "apptainer"), "--version"], tmp_path, PATH=image_path, VCLOUD_HOST_PATH=host_path)
    assert out.returncode == 0 and "apptainer" in out.stdout.lower(), out.stderr
    # And `python` from such a job enters the image, with the host PATH recorded for its steps.
    out = run(
        [str(folder / "python"), "-c", "import os; print(os.environ['VCLOUD_HOST_PATH'])"],
        tmp_path,
        PATH=image_path,
        VCLOUD_HOST_PATH=host_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == host_path


def test_the_other_architecture_image_is_refused_where_it_is_named(site, tmp_path):
    root, folder, native = site
    text = (folder / image_run.SCRIPT).read_text()
    machine = platform.machine()
    (folder / image_run.SCRIPT).write_text(text.replace(f"{machine}) image=", f"{machine}-not) image="))
    out = run([str(folder / "python"), "-c", "print(1)"], root)
    assert out.returncode == 255 and "architecture" in out.stderr.lower(), out.stderr


def test_inside_the_image_this_folder_stays_first_on_path_for_what_it_submits(site):
    tmp_path, folder, _ = site
    # The controller's python: the jobs its snakemake submits (--export=ALL) inherit its PATH.
    out = run([str(folder / "python"), "-c", "import os; print(os.environ['PATH'].split(':')[0])"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(folder.resolve())

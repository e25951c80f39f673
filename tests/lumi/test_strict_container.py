"""The container stand-in (tests/lumi/bin/apptainer) is as strict as its name: inside it, no
/usr/local of the host, no checkout, and no `vcloud` but the squashfs environment's; an image
of another CPU architecture is refused as apptainer refuses it; `--nv` is recorded.

Each test here fails against the stand-in as it was before (the host's /usr/local and the
checkout's src/ visible, vcloud importable through the host's editable install, `arch`
ignored, `--nv` not recorded).
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lumi.helpers import (
    REPO,
    apptainer_calls,
    build_env_image,
    require_stand_in,
    stand_in_env,
    write_stand_in_image,
)

pytestmark = pytest.mark.container
GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}  # apptainer names architectures as Go does
IMPORT = "import vcloud, importlib.metadata as m; print(vcloud.__file__); print(m.version('vcloud'))"


@pytest.fixture
def container(tmp_path):
    """exec(script, *options, image=...): `bash -c script` in the stand-in image, from a
    working directory and a --home of the test's own (so that neither shows the checkout)."""
    require_stand_in()
    image = write_stand_in_image(tmp_path / "container")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = stand_in_env(tmp_path)

    def exec_(script: str, *options: str, image: Path = image, **variables: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["apptainer", "exec", "--home", str(home), *options, str(image), "bash", "-c", script],
            cwd=work,
            env={**env, **variables},
            capture_output=True,
            text=True,
            timeout=300,
        )

    exec_.image = image
    return exec_


def test_the_hosts_usr_local_is_not_there(container):
    assert any(Path("/usr/local").iterdir())  # the host has one: the test sees something to hide
    proc = container("ls -A /usr/local")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""


def test_the_checkout_is_not_there(container):
    assert (REPO / "src" / "vcloud").is_dir()
    proc = container(f"test ! -e {REPO / 'src'} && test ! -e {REPO / 'pyproject.toml'}")
    assert proc.returncode == 0, f"{REPO} visible inside the container"


@pytest.mark.parametrize("bind", [None, sys.prefix], ids=["image", "prefix-bound"])
def test_vcloud_is_not_in_the_image_python(container, bind):
    """Not importable, no distribution metadata, no script: the host's editable install is
    hidden, even under a bind that shows its folder."""
    options = ["-B", bind] if bind else []
    proc = container(f'python3 -c "{IMPORT}"', *options)
    assert proc.returncode != 0 and "No module named 'vcloud'" in proc.stderr, proc.stdout + proc.stderr
    proc = container("python3 -c \"import importlib.metadata as m; m.version('vcloud')\"", *options)
    assert proc.returncode != 0 and "PackageNotFoundError" in proc.stderr, proc.stdout + proc.stderr
    proc = container("command -v vcloud", *options)
    assert proc.returncode != 0 and proc.stdout == ""
    # The image's Python still has what the CSC image carries.
    proc = container("python3 -c 'import numpy, yaml; print(numpy.__file__)'", *options)
    assert proc.returncode == 0 and proc.stdout.startswith(sys.prefix), proc.stderr


def test_vcloud_comes_from_the_environment_image(container, tmp_path):
    import vcloud

    env_image = build_env_image(tmp_path / "container")
    mount = ["-B", f"{env_image}:/user-software:image-src=/"]
    script = (
        f'python3 -c "{IMPORT}"; command -v vcloud; vcloud --version; python3 -c "import numpy; print(numpy.__file__)"'
    )
    proc = container(script, *mount, SINGULARITYENV_PREPEND_PATH="/user-software/venv/bin")
    assert proc.returncode == 0, proc.stderr
    package, version, script_path, cli_version, numpy = proc.stdout.splitlines()
    assert package == "/user-software/site/vcloud/__init__.py"
    assert version == vcloud.__version__ and cli_version == f"vcloud {vcloud.__version__}"
    assert script_path == "/user-software/venv/bin/vcloud"
    assert numpy.startswith(sys.prefix)  # torch, numpy and the rest: the image's Python
    # Mounted but not first on PATH (no SINGULARITYENV_PREPEND_PATH): the image's python3 has no vcloud.
    proc = container(f'python3 -c "{IMPORT}"', *mount)
    assert proc.returncode != 0 and "No module named 'vcloud'" in proc.stderr


def test_an_image_of_another_architecture_is_refused_naming_both(container, tmp_path):
    host = platform.machine()
    other = "aarch64" if host == "x86_64" else "x86_64"
    image = container.image
    foreign = image.with_name("foreign.sif")
    foreign.write_text(f"{image.read_text()}arch {other}\n")
    proc = container(f"touch {tmp_path / 'ran'}", image=foreign)
    assert proc.returncode == 255 and not (tmp_path / "ran").exists()
    assert proc.stderr.startswith("FATAL:")
    assert (
        f"could not open image {foreign}: the image's architecture ({GOARCH.get(other, other)}) "
        f"could not run on the host's ({GOARCH.get(host, host)})" in proc.stderr
    )
    native = image.with_name("native.sif")
    native.write_text(f"{image.read_text()}arch {host}\n")
    assert container("true", image=native).returncode == 0


def test_nv_is_recorded_and_accepted_without_a_driver(container, tmp_path):
    gpu = container("echo gpu step", "--nv")
    cpu = container("echo cpu rule")
    assert gpu.returncode == 0 and gpu.stdout == "gpu step\n", gpu.stderr
    assert cpu.returncode == 0 and "nv files" not in cpu.stderr
    if not list(Path("/dev").glob("nvidia*")):
        assert "INFO:    Could not find any nv files on this host!" in gpu.stderr
    calls = apptainer_calls(tmp_path)
    assert [call.get("nv") for call in calls] == [True, False]
    assert [call["argv"][-1] for call in calls] == ["echo gpu step", "echo cpu rule"]

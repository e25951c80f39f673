"""Shared by the LUMI-profile workflow tests and the real-SLURM tests: a tiny overlay config,
the strict apptainer stand-in on PATH with its image and squashfs environment, and a reader
for its call log.

The stand-in (tests/lumi/bin/apptainer) is as strict as a container: PATH is the image's
default plus SINGULARITYENV_PREPEND_PATH, and only the image (the host's /usr without
/usr/local, and this interpreter's prefix without what the host installed of vcloud), the
binds, the home and the physical working directory are visible; not the checkout. So the
tests' runs need what a LUMI run needs: `vcloud` from the squashfs environment (a copy of the
package built from this checkout with pip, packed with the real mksquashfs, stamped) and every
path they use under a bind.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tests.system import require
from vcloud.runtime.cluster import Cluster
from vcloud.runtime.profile import load_workflow_config

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "tests" / "lumi" / "bin"
# An account the test cluster knows (tests/slurm/cluster-up.sh); not a placeholder.
TEST_ACCOUNT = "project_465000000"


def require_stand_in() -> None:
    """The stand-in needs bubblewrap (the sandbox) and squashfs-tools (the environment)."""
    require("bubblewrap and squashfs-tools", "bwrap", "mksquashfs", "unsquashfs")


def host_installs(name: str = "vcloud") -> list[str]:
    """What the host installed of `name` into this interpreter's prefixes (an editable
    install's .pth and finder, its dist-info, its console script; a plain install's package
    folder): the paths the stand-in image hides, as the CSC image has none of them."""
    found: set[Path] = set()
    for dist in importlib.metadata.distributions(path=[*site.getsitepackages(), site.getusersitepackages()]):
        if (dist.metadata["Name"] or "").lower() != name:
            continue
        folder = Path(os.path.normpath(dist.locate_file("")))
        for file in dist.files or []:
            path = Path(os.path.normpath(folder / file))
            found.add(folder / path.relative_to(folder).parts[0] if path.is_relative_to(folder) else path)
    return sorted(str(path) for path in found)


def write_stand_in_image(folder: Path, *, arch: str | None = None) -> Path:
    """A stand-in of the CSC image: its Python (with torch) first on the image's PATH, and no
    `vcloud` anywhere in it, as in the real image: neither the checkout nor what the host
    installed of vcloud (`hide` lines). `arch`: the CPU architecture it declares (default:
    none, the host's)."""
    folder.mkdir(parents=True, exist_ok=True)
    bin_dir = folder / "image-bin"
    bin_dir.mkdir(exist_ok=True)
    python = bin_dir / "python3"
    if not python.exists():
        python.symlink_to(sys.executable)
    image = folder / "image.sif"
    lines = ["stand-in image", f"ro {sys.base_prefix}", f"ro {sys.prefix}", f"ro {bin_dir}"]
    lines += [f"hide {path}" for path in host_installs()]
    lines.append(f"path {bin_dir}")
    if arch:
        lines.append(f"arch {arch}")
    image.write_text("\n".join(dict.fromkeys(lines)) + "\n")
    return image


_PACKAGES: dict[str, Path] = {}  # source digest -> vcloud installed by pip, once per process


def installed_package(stamp: str, root: Path = REPO) -> Path:
    """vcloud as pip installs it from this checkout or `root` (its package data, its dist-info, no
    dependencies: those are the image's), built from a copy so that parallel builds never
    share the checkout's build/ folder."""
    if stamp in _PACKAGES and _PACKAGES[stamp].is_dir():
        return _PACKAGES[stamp]
    work = Path(tempfile.mkdtemp(prefix="vcloud-env-package-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    source = work / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(root / "src", source / "src", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(root / name, source / name)
    target = work / "site"
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    command += ["--no-compile", "--root-user-action=ignore", "--target", str(target), str(source)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:  # --no-build-isolation: this interpreter's setuptools builds it
        raise RuntimeError(f"pip install of vcloud for the environment image failed: {done.stderr.strip()[-800:]}")
    _PACKAGES[stamp] = target
    return target


def build_env_image(folder: Path, root: Path = REPO) -> Path:
    """The squashfs environment `vcloud image` makes, reduced to what a job uses: the venv's
    python and `vcloud` at /user-software/venv/bin, vcloud itself in /user-software/site (on
    that python's path), and the stamp of this checkout. Everything else (torch, numpy, zarr,
    snakemake) is the image's Python's, as the CSC image carries its packages. `root`: the
    checkout it is built from and stamped with (a test's copy of the working tree)."""
    from vcloud.runtime.image import MOUNT, STAMP, version_stamp

    require_stand_in()
    out = folder / "vcloud-env.sqsh"
    if out.is_file():
        return out
    env = folder / "env-build"
    venv_bin = env / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    stamp = version_stamp(root)
    shutil.copytree(installed_package(stamp, root), env / "site", symlinks=True)
    # Wrappers, not symlinks: this interpreter must start under its own path to find its
    # environment (a venv's pyvenv.cfg sits beside the path it is started by). The site folder
    # comes first on its path, before any PYTHONPATH of the caller's.
    python = venv_bin / "python3"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={MOUNT}/site${{PYTHONPATH:+:$PYTHONPATH}} exec {sys.executable} "$@"\n')
    script = venv_bin / "vcloud"
    script.write_text(f'#!/bin/sh\nexec {MOUNT}/venv/bin/python3 {MOUNT}/site/bin/vcloud "$@"\n')
    # snakemake as an image that runs it (a site without host installs) carries it: its command.
    snakemake = venv_bin / "snakemake"
    snakemake.write_text(f'#!/bin/sh\nexec {MOUNT}/venv/bin/python3 -m snakemake "$@"\n')
    for path in (python, script, snakemake):
        path.chmod(0o755)
    (venv_bin / "python").symlink_to("python3")  # a venv has both
    (env / STAMP).write_text(stamp + "\n")
    subprocess.run(["mksquashfs", str(env), str(out), "-noappend", "-quiet", "-no-xattrs"], check=True)
    return out


def write_overlay(workdir: Path, *, binds: list[str] | None = None, **extra) -> tuple[Path, Cluster]:
    """A config over config/lumi.yaml: one synthetic ROI of one 32-px location, the stand-in
    image and environment, and binds that cover the work folder (or `binds`)."""
    image = write_stand_in_image(workdir / "container")
    env_image = build_env_image(workdir / "container")
    overlay = {
        "synthetic": {"enabled": True, "rois": ["ROIs1868/119"], "patches": 1},
        "data": {"patch_size": 32},
        "paths": {"prepared": "results/prepared"},
        "cluster": {
            "account": TEST_ACCOUNT,
            "image": str(image),
            "env_image": str(env_image),
            "binds": binds or [str(workdir)],
        },
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


def lumi_tree(root: Path) -> Path:
    """/scratch/<project> as on LUMI, a symlink to /pfs/lustrep2/scratch/<project>, with a clone
    folder in it: returns the clone's path through the symlink (where a user `cd`s)."""
    real = root / "pfs" / "lustrep2" / "scratch" / TEST_ACCOUNT
    (real / "vcloud" / "code").mkdir(parents=True)
    (root / "scratch").mkdir()
    (root / "scratch" / TEST_ACCOUNT).symlink_to(real)
    return root / "scratch" / TEST_ACCOUNT / "vcloud" / "code"


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

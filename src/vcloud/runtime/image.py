"""`vcloud image`: the software environment of every rule, built on LUMI without root.

LUMI has no fakeroot and no user namespaces, so `apptainer build` of a definition file
cannot run there (FIELD-FACTS.md, "containers"). What works by LUMI's documentation (LUMI AI
guide, chapter 2): keep the CSC PyTorch image as it is, make a venv *inside* it with
`--system-site-packages` (torch, ROCm and RCCL stay CSC's builds), install the packages the
image lacks and vcloud itself into that venv, pack the venv into one squashfs file with
`mksquashfs` (one file on Lustre instead of ~10^4 small ones), and bind that file at run
time with `-B env.sqsh:/user-software:image-src=/` plus
`SINGULARITYENV_PREPEND_PATH=/user-software/venv/bin`.

The venv is built in a folder bound at the same mount point it is used at later
(/user-software), so its absolute paths (bin/python, script shebangs) hold. The folder is
node-local ($TMPDIR or /tmp: ~10^4 small files stay off Lustre; on a compute node /tmp is
memory and counts against the job's --mem) and packed as the LUMI AI guide does
(`mksquashfs ... -no-xattrs`: extended attributes cause warnings on LUMI).

Pins: pip may never replace what the image provides. The image's own torch and numpy (read
from the image at build time) and the exact versions in containers/image-constraints.txt
constrain every install. The image's Python must be >= 3.11 (zarr 3 and xarray need it).

A stamp file `vcloud-version` (package version, git revision and a digest of the package's
sources and the image requirements) lets `vcloud doctor` and the workflow's start check that
the squashfs carries the checkout's code, uncommitted edits included, with `unsquashfs -cat`
or, where that tool is missing, by reading it through the container itself.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from vcloud.errors import BadInputError, ConfigError

MOUNT = "/user-software"
STAMP = "vcloud-version"


MIN_IMAGE_PYTHON = (3, 11)  # zarr 3 and xarray declare Requires-Python >= 3.11
# Packages the image provides that pip must keep exactly as they are (ABI of torch's builds).
IMAGE_PINNED = ("torch", "numpy")


def source_digest(repo: Path) -> str:
    """SHA-256 (16 hex) of what the environment installs: the package's files as they are on
    disk (uncommitted edits included) and the image requirements and constraints."""
    import vcloud

    package = Path(vcloud.__file__).resolve().parent
    files = sorted(
        path
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo")
    )
    files += [
        path
        for path in (Path(repo) / "containers" / name for name in ("requirements-image.txt", "image-constraints.txt"))
        if path.is_file()
    ]
    digest = hashlib.sha256()
    for path in files:
        name = path.relative_to(package) if path.is_relative_to(package) else Path("containers") / path.name
        digest.update(str(name).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def version_stamp(repo: Path) -> str:
    """What the squashfs environment of this checkout holds: version, revision, sources."""
    from vcloud import __version__
    from vcloud.io import git_revision

    return f"vcloud {__version__} {git_revision()} src {source_digest(repo)}"


PROBE = (
    "import sys, importlib.metadata as m; print('python', '%d.%d.%d' % sys.version_info[:3]); "
    "[print(f'{n}=={m.version(n)}') for n in " + repr(IMAGE_PINNED) + "]"
)


def probe_command(*, base: str, runner: str = "singularity") -> list[str]:
    """What the image provides: its Python version and the versions pip must keep."""
    return [runner, "exec", base, "python3", "-c", PROBE]


def image_pins(probe_output: str, base: str) -> list[str]:
    """The constraints lines from the probe's output; a Python older than 3.11 stops here."""
    lines = probe_output.strip().splitlines()
    version = next((line.split()[1] for line in lines if line.startswith("python ")), None)
    if version is None:
        raise BadInputError(f"{base}: could not read the image's Python version ({probe_output.strip()[-200:]!r})")
    if tuple(int(x) for x in version.split(".")[:2]) < MIN_IMAGE_PYTHON:
        want = ".".join(map(str, MIN_IMAGE_PYTHON))
        raise BadInputError(
            f"{base}: the image's Python is {version}; zarr 3 and xarray need >= {want}: use an image "
            "with a newer Python (e.g. a LUMI AI Factory image, /appl/local/laifs/containers/) as cluster.image"
        )
    return [line for line in lines if "==" in line]


def build_commands(
    *,
    base: str,
    repo: Path,
    build: Path,
    out: Path,
    mount: str = MOUNT,
    runner: str = "singularity",
    pins: str = "image-pins.txt",
    controller: bool = False,
) -> list[list[str]]:
    """The commands after the probe, in order: venv inside the base image, packages (held to
    the image's torch and numpy, `pins` in the build folder, and containers/image-constraints.txt),
    vcloud, an import check, squashfs. `controller`: the site runs snakemake from the image
    (host_installs: false), which then carries containers/requirements-controller.txt too."""
    exec_ = [runner, "exec", "-B", f"{build}:{mount}", "-B", str(repo), base]
    pip = [*exec_, f"{mount}/venv/bin/python", "-m", "pip", "install", "--no-cache-dir"]
    requirements = ["requirements-image.txt", *(["requirements-controller.txt"] if controller else [])]
    imports = "vcloud, torch, zarr, xarray, s2cloudless" + (
        ", snakemake, snakemake_executor_plugin_slurm, mlflow" if controller else ""
    )
    constraints = ["-c", f"{mount}/{pins}", "-c", str(repo / "containers" / "image-constraints.txt")]
    return [
        [*exec_, "python3", "-m", "venv", "--system-site-packages", f"{mount}/venv"],
        [*pip, *constraints, *(arg for name in requirements for arg in ("-r", str(repo / "containers" / name)))],
        # --no-deps: torch and numpy stay the image's own builds.
        [*pip, "--no-deps", str(repo)],
        [
            *exec_,
            f"{mount}/venv/bin/python",
            "-c",
            f"import {imports}; print('vcloud', vcloud.__version__, 'torch', torch.__version__)",
        ],
        # As the LUMI AI guide packs environments: xattrs cause warnings on LUMI.
        ["mksquashfs", str(build), str(out), "-noappend", "-quiet", "-no-xattrs"],
    ]


def build(
    *,
    base: str,
    repo: Path,
    out: Path,
    mount: str | None = MOUNT,
    runner: str = "singularity",
    workdir: Path | None = None,
    dry_run: bool = False,
    controller: bool = False,
) -> list[str]:
    """Build the squashfs environment at `out` (packed beside it, renamed when complete).

    The venv is made node-local (workdir, default $TMPDIR or /tmp), not on Lustre.
    mount None: the build folder itself, bound at its own path."""
    out = Path(out)
    lines = []
    if not dry_run:
        for tool in (runner, "mksquashfs"):
            if shutil.which(tool) is None:
                raise BadInputError(f"{tool}: not on PATH (LUMI login and compute nodes have both)")
        if not Path(base).is_file():
            raise BadInputError(f"{base}: base image not found (cluster.image)")
        out.parent.mkdir(parents=True, exist_ok=True)
    root = Path(workdir or os.environ.get("TMPDIR") or tempfile.gettempdir())
    if not dry_run:
        root.mkdir(parents=True, exist_ok=True)
    tmp_root = Path(tempfile.mkdtemp(prefix="vcloud-image-", dir=root)) if not dry_run else root / "vcloud-image-XXXX"
    folder = tmp_root / "env"
    partial = out.with_name(out.name + ".partial")
    try:
        probe = probe_command(base=base, runner=runner)
        lines.append(shlex.join(probe))
        if not dry_run:
            folder.mkdir()
            (folder / STAMP).write_text(version_stamp(repo) + "\n")
            (folder / "image-pins.txt").write_text("\n".join(image_pins(_run(probe), base)) + "\n")
        for command in build_commands(
            base=base,
            repo=Path(repo),
            build=folder,
            out=partial,
            mount=mount or str(folder),
            runner=runner,
            controller=controller,
        ):
            lines.append(shlex.join(command))
            if not dry_run:
                _run(command)
        if not dry_run:
            partial.replace(out)
    finally:
        if not dry_run:
            shutil.rmtree(tmp_root, ignore_errors=True)
            partial.unlink(missing_ok=True)
    return lines


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise BadInputError(f"image build: `{shlex.join(command[:6])} ...` failed ({done.returncode}): {tail[0]}")
    return done.stdout


def read_stamp(sqsh: Path, *, image: str | None = None, runner: str | None = None) -> str:
    """The version stamp inside a squashfs environment: with `unsquashfs -cat`, or where that
    tool is missing, through the container itself (`image` given)."""
    if shutil.which("unsquashfs") is not None:
        done = subprocess.run(["unsquashfs", "-cat", str(sqsh), STAMP], capture_output=True, text=True)
    else:
        runner = runner or next((r for r in ("singularity", "apptainer") if shutil.which(r)), None)
        if runner is None or image is None:
            raise ConfigError(
                f"{sqsh}: cannot read its stamp: neither unsquashfs nor singularity is on PATH on this node"
            )
        done = subprocess.run(
            [runner, "exec", "-B", f"{sqsh}:{MOUNT}:image-src=/", image, "cat", f"{MOUNT}/{STAMP}"],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise ConfigError(
            f"{sqsh}: not a vcloud environment ({STAMP} unreadable: {(done.stderr.strip().splitlines() or ['?'])[-1]})"
        )
    return done.stdout.strip()


def same_code(stamp: str, want: str) -> bool:
    """Whether two stamps name the same code: package version and source digest (the git
    revision is provenance only: a commit that changes no installed file needs no rebuild)."""
    a, b = stamp.split(), want.split()
    return len(a) == len(b) == 5 and a[:2] == b[:2] and a[3:] == b[3:]


def check(*, image: str, env_image: str | None, repo: Path) -> list[str]:
    """One line per problem: a missing image or environment, or one built from other code."""
    problems = []
    if not Path(image).is_file():
        problems.append(f"cluster.image: {image} not found; see the README quick start (`vcloud image`)")
    if env_image is None:
        return problems
    if not Path(env_image).is_file():
        return problems + [f"cluster.env_image: {env_image} not found; build it with `vcloud image`"]
    try:
        stamp = read_stamp(Path(env_image), image=image if not problems else None)
    except ConfigError as err:
        return problems + [str(err)]
    want = version_stamp(repo)
    if not same_code(stamp, want):
        problems.append(
            f"cluster.env_image: {env_image} holds '{stamp}', this checkout is '{want}' "
            "(the image would run other code); rebuild it with `vcloud image`"
        )
    return problems

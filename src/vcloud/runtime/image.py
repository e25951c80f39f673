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
(/user-software), so its absolute paths (bin/python, script shebangs) hold. A stamp file
`vcloud-version` (package version and git revision) lets `vcloud doctor` check that the
squashfs carries the checkout's code, without mounting it (`unsquashfs -cat`).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from vcloud.errors import BadInputError, ConfigError

MOUNT = "/user-software"
STAMP = "vcloud-version"


def version_stamp(repo: Path) -> str:
    from vcloud import __version__
    from vcloud.io import git_revision

    del repo  # the revision is the checkout's this module runs from
    return f"vcloud {__version__} {git_revision()}"


def build_commands(
    *, base: str, repo: Path, build: Path, out: Path, mount: str = MOUNT, runner: str = "singularity"
) -> list[list[str]]:
    """The commands, in order: venv inside the base image, packages, vcloud, squashfs."""
    exec_ = [runner, "exec", "-B", f"{build}:{mount}", "-B", str(repo), base]
    pip = [*exec_, f"{mount}/venv/bin/python", "-m", "pip", "install", "--no-cache-dir"]
    return [
        [*exec_, "python3", "-m", "venv", "--system-site-packages", f"{mount}/venv"],
        [*pip, "-r", str(repo / "containers" / "requirements-image.txt")],
        # --no-deps: torch and numpy stay the image's own builds.
        [*pip, "--no-deps", str(repo)],
        [
            *exec_,
            f"{mount}/venv/bin/python",
            "-c",
            "import vcloud, torch, zarr, xarray, s2cloudless; print('vcloud', vcloud.__version__, 'torch', torch.__version__)",
        ],
        ["mksquashfs", str(build), str(out), "-noappend", "-quiet", "-comp", "zstd"],
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
) -> list[str]:
    """Build the squashfs environment at `out` (written beside it, renamed when complete).

    mount None: the build folder itself (for a runner that ignores binds, as the tests' one)."""
    out = Path(out)
    lines = []
    if not dry_run:
        for tool in (runner, "mksquashfs"):
            if shutil.which(tool) is None:
                raise BadInputError(f"{tool}: not on PATH (LUMI login and compute nodes have both)")
        if not Path(base).is_file():
            raise BadInputError(f"{base}: base image not found (cluster.base_image)")
        out.parent.mkdir(parents=True, exist_ok=True)
    tmp_root = (
        Path(tempfile.mkdtemp(prefix=".vcloud-image-", dir=workdir or out.parent))
        if not dry_run
        else out.parent / ".vcloud-image-XXXX"
    )
    folder = tmp_root / "env"
    partial = out.with_name(out.name + ".partial")
    try:
        if not dry_run:
            folder.mkdir()
            (folder / STAMP).write_text(version_stamp(repo) + "\n")
        for command in build_commands(
            base=base, repo=Path(repo), build=folder, out=partial, mount=mount or str(folder), runner=runner
        ):
            lines.append(shlex.join(command))
            if dry_run:
                continue
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
                raise BadInputError(
                    f"image build: `{shlex.join(command[:6])} ...` failed ({done.returncode}): {tail[0]}"
                )
        if not dry_run:
            partial.replace(out)
    finally:
        if not dry_run:
            shutil.rmtree(tmp_root, ignore_errors=True)
            partial.unlink(missing_ok=True)
    return lines


def read_stamp(sqsh: Path) -> str | None:
    """The version stamp inside a squashfs environment, or None when unsquashfs is missing."""
    if shutil.which("unsquashfs") is None:
        return None
    done = subprocess.run(["unsquashfs", "-cat", str(sqsh), STAMP], capture_output=True, text=True)
    if done.returncode != 0:
        raise ConfigError(
            f"{sqsh}: not a vcloud environment ({STAMP} unreadable: {(done.stderr.strip().splitlines() or ['?'])[-1]})"
        )
    return done.stdout.strip()


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
        stamp = read_stamp(Path(env_image))
    except ConfigError as err:
        return problems + [str(err)]
    want = version_stamp(repo)
    if stamp is not None and stamp != want:
        problems.append(
            f"cluster.env_image: {env_image} holds '{stamp}', this checkout is '{want}'; rebuild it with `vcloud image`"
        )
    return problems

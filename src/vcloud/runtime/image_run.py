"""A site without host installs (Olivia: "we don't allow native installations"): snakemake, its
jobs and `vcloud` itself run from the image.

`vcloud profile --site <site>` then writes, beside the profile, profiles/<site>/bin/: one script
under the names `python`, `python3`, `vcloud` and the container runner (`apptainer`). Called on
the host (the login node, a batch script, a job step), it runs its name inside the image built
for the node's CPU architecture (`uname -m`: cluster.images), with the site's binds, the SLURM
client (cluster.slurm_binds: commands, configuration, munge socket) and this folder first on
the image's PATH. Called inside the image, it steps aside: the image's own command runs.

That one rule carries the whole chain:
- the user types `profiles/<site>/bin/vcloud submit --profile profiles/<site>`: vcloud runs in
  the image and submits the controller, whose batch script starts `python` from this folder;
- the controller's snakemake (in the image) submits its jobs with `sbatch --export=ALL`, so each
  job's `python -m snakemake` (the profile's shared-fs-usage leaves software deployment out, so
  the plugin names `python`, not the image's path) finds this folder first on PATH and starts
  the job's snakemake in the image of that node's architecture (aarch64 on Olivia's GPU nodes);
- rules run in that snakemake's image (no per-rule container: snakemake's software deployment
  is off); a GPU rule's self-launched `srun ... apptainer exec --nv` starts its step on the host,
  where `apptainer` is this script again: it restores the host's PATH (VCLOUD_HOST_PATH, set on
  the way in) and runs the host's apptainer.

Inside or outside is told by the file system, not the environment: apptainer makes
/.singularity.d in every container, while variables such as APPTAINER_CONTAINER travel into the
jobs that a containerised sbatch submits (`--export=ALL`).

Host-side only: no torch.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from vcloud.errors import ConfigError
from vcloud.io import atomic_write_text

BIN = "bin"  # profiles/<site>/bin
REQUIREMENTS = "containers/requirements-controller.txt"  # what snakemake in the image needs
SCRIPT = "vcloud-image"
NAMES = ("python", "python3", "vcloud")


def wrapper_names(cluster) -> tuple[str, ...]:
    return (*NAMES, cluster.runner)


def check(cluster) -> None:
    """A site without host installs needs an image for each architecture it runs on and the
    SLURM client inside it; one line naming the key otherwise."""
    if cluster.host_installs:
        return
    if not cluster.slurm_binds:
        raise ConfigError(
            f"cluster.slurm_binds: empty, but {cluster.title} runs snakemake from the image "
            "(host_installs: false); name the SLURM commands, their configuration and the munge socket"
        )
    for name, part in cluster.partitions.items():
        if part.arch != "x86_64" and part.arch not in cluster.images:
            raise ConfigError(f"cluster.images: no {part.arch} image for partition {name}")


def in_image() -> bool:
    """Inside a container: apptainer makes /.singularity.d in every one (see the module's text)."""
    return Path("/.singularity.d").is_dir()


def package_problems(repo: Path, *, inside: bool | None = None) -> list[str]:
    """Where snakemake runs from the image, the image it runs in must carry the packages of
    containers/requirements-controller.txt at their floors: one line per one missing or too old.
    Run in the image (`vcloud doctor` through profiles/<site>/bin); on the host, nothing is
    checked (the image of another architecture cannot be run there either)."""
    from importlib import metadata

    if not (in_image() if inside is None else inside):
        return []
    try:
        from packaging.requirements import Requirement  # snakemake's dependency
    except ImportError:
        return [
            f"image: packaging is missing (snakemake needs it), so is snakemake: build the image with {REQUIREMENTS}"
        ]
    problems = []
    for line in (Path(repo) / REQUIREMENTS).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        want = Requirement(line)
        try:
            have = metadata.version(want.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or not want.specifier.contains(have, prereleases=True):
            found = "is missing" if have is None else f"is {have}"
            problems.append(
                f"image: {want.name} {found}, {want.specifier} needed: snakemake runs from the image on this site "
                f"(host_installs: false); build the image with {REQUIREMENTS} (docs/clusters.md)"
            )
    return problems


def script(cluster, here: Path) -> str:
    """The text of profiles/<site>/bin/vcloud-image (absolute paths: jobs run it from anywhere)."""
    check(cluster)
    here = Path(here).resolve()
    binds = " ".join(f"-B {shlex.quote(b)}" for b in cluster.slurm_binds)
    args = f"{cluster.apptainer_args()} {binds}".strip()
    prepend = [str(here)]
    env = dict(cluster.container_env())
    for key in ("APPTAINERENV_PREPEND_PATH", "SINGULARITYENV_PREPEND_PATH"):
        if value := env.pop(key, None):
            prepend.append(value)
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    cases = "".join(
        f"    {arch}) image={shlex.quote(path)} ;;\n" for arch, path in sorted(cluster.images.items()) if arch
    )
    runner = cluster.runner
    return f"""#!/bin/sh
# Written by `vcloud profile --site {cluster.name}`: {cluster.title} allows no host installs, so this
# script runs its name ({", ".join(wrapper_names(cluster))}) in the image (vcloud.runtime.image_run).
here={shlex.quote(str(here))}
name=${{0##*/}}
strip() {{ printf '%s' "$1" | tr ':' '\\n' | grep -vxF "$here" | paste -sd: -; }}
if [ "$name" != {runner} ] && [ -d /.singularity.d ]; then
    # Inside the image: its own command, the next of the name on PATH. PATH stays as it is, this
    # folder first: the jobs that this process submits inherit it.
    IFS=:
    for dir in $PATH; do
        if [ "$dir" != "$here" ] && [ -x "$dir/$name" ]; then
            unset IFS
            exec "$dir/$name" "$@"
        fi
    done
    echo "$name: not in the image (PATH=$PATH)" >&2
    exit 127
fi
# On the host: its own PATH, also where a job inherited the image's.
PATH=$(strip "${{VCLOUD_HOST_PATH:-$PATH}}"); export PATH
if [ "$name" = {runner} ]; then
    exec {runner} "$@"
fi
case $(uname -m) in
{cases}    *) image={shlex.quote(cluster.image)} ;;
esac
{exports}export VCLOUD_HOST_PATH="$PATH"
export APPTAINERENV_PREPEND_PATH={shlex.quote(":".join(prepend))}
export SINGULARITYENV_PREPEND_PATH="$APPTAINERENV_PREPEND_PATH"
exec {runner} exec {args} "$image" "$name" "$@"
"""


def write(cluster, folder: Path, *, check_only: bool = False) -> list[str]:
    """profiles/<site>/bin: the script and its names (links); one status line. With
    check_only, compares and raises ConfigError when stale."""
    folder = Path(folder)
    text = script(cluster, folder)
    path = folder / SCRIPT
    if check_only:
        stale = not path.is_file() or path.read_text() != text
        stale = stale or any(not (folder / n).is_symlink() for n in wrapper_names(cluster))
        if stale:
            raise ConfigError(f"{path}: stale; run `vcloud profile --site {cluster.name}`")
        return [f"{folder}: up to date"]
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    path.chmod(0o755)
    for name in wrapper_names(cluster):
        link = folder / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(SCRIPT)
    return [f"{folder}: {', '.join(wrapper_names(cluster))} run in the image ({cluster.title} has no host installs)"]

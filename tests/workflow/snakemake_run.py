"""Running snakemake through its command line on the small test configuration (shared helpers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile")]

SMALL = {
    "data": {"patch_size": 32},
    # One test ROI (the default has three, for the statistics): the tests need the layout, not the SE.
    "synthetic": {"patches": 2, "rois": ["ROIs1868/119", "ROIs2017/22", "ROIs1970/119", "ROIs1970/21"]},
    "model_config": str(ROOT / "tests/workflow/tiny_models.yaml"),
}
# The drills that only need every rule to run: one location in a train, a val and a test ROI of one
# region (africa: 4 archives), the smallest data the whole chain runs on.
ONE_REGION = {**SMALL, "synthetic": {"patches": 1, "rois": ["ROIs1970/21", "ROIs2017/22", "ROIs2017/32"]}}


def run(args, cwd, check=True):
    proc = subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def copy_worktree(dest: Path) -> Path:
    """The working tree as a clone of it holds (tracked and new files, not the ignored ones), links
    kept as links: a copy a test may change as a contributor would."""
    import os
    import shutil

    names = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in names:
        source, target = ROOT / name, dest / name
        if not source.is_file() and not source.is_symlink():
            continue  # deleted in the working tree
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return dest

"""The README's LUMI quick start, read from the README itself: its steps come in a first day's
order, and every command of it that can run here runs against the stand-ins as typed (the
host tools' pins, the profile, the doctor, the rehearsal's and the run's snakemake lines)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from tests.lumi.helpers import REPO, stand_in_env
from vcloud.runtime.profile import HOST_CONSTRAINTS, pinned_versions, version_warnings

pytestmark = pytest.mark.workflow
ORDER = [
    "git clone",
    "lumi-workspaces",
    "dl_data.sh",
    "module load cray-python",
    f"pip install -c {HOST_CONSTRAINTS}",
    "pip install --no-deps -e .",
    "vcloud lumi-profile",
    "vcloud image",
    "vcloud doctor",
    "config/lumi-rehearsal.yaml",
    "snakemake --profile lumi -n",
    "results/stage2/best.pt",
]


def quick_start(*, comments: bool = False) -> list[str]:
    """The quick start's lines (commands only, or with the comments that say what to do)."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("**Quick start: a first day on LUMI**") :]
    block = block[block.index("```bash\n") + len("```bash\n") :]
    block = block[: block.index("```")]
    if comments:
        return [line for line in block.splitlines() if line.strip()]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_the_steps_come_in_a_first_days_order():
    lines = quick_start(comments=True)
    where = [next(i for i, line in enumerate(lines) if step in line) for step in ORDER]
    assert where == sorted(where), list(zip(ORDER, where))


def test_the_host_tools_are_pinned_and_this_machine_runs_the_pins():
    """The pip line installs exactly what constraints-lumi-host.txt pins (CI runs those)."""
    line = next(line for line in quick_start() if f"-c {HOST_CONSTRAINTS}" in line)
    packages = [word for word in shlex.split(line) if not word.startswith("-") and word not in ("pip", "install")]
    packages.remove(HOST_CONSTRAINTS)
    pins = pinned_versions(REPO)
    assert all(name.lower() in pins for name in packages), (packages, pins)
    assert version_warnings(REPO) == []


@pytest.mark.slow  # over 10 s: docs/contributing.md, test tiers
def test_every_snakemake_and_vcloud_line_runs_here_as_typed(tmp_path):
    """Dry runs pass; real runs stop at the start check, before any submission, on what a
    fresh clone lacks here (the placeholder account, LUMI's paths)."""
    raw = tmp_path / "data" / "SEN12MS-CR-TS"  # data.raw: ../data/SEN12MS-CR-TS from the clone
    raw.mkdir(parents=True)
    for region in ("africa", "america", "asiaEast", "asiaWest", "europa"):
        for kind in ("s1", "s2"):
            for suffix in ("", "_test"):
                (raw / f"{kind}_{region}{suffix}.tar.gz").write_bytes(b"")
    work = tmp_path / "code"
    work.mkdir()
    env = stand_in_env(tmp_path)
    ran = 0
    for line in quick_start():
        words = shlex.split(line)
        if words[:2] == ["vcloud", "lumi-profile"]:
            proc = subprocess.run([*words, "--check"], cwd=REPO, capture_output=True, text=True, env=env)
            assert proc.returncode == 0, proc.stderr
        elif words[:2] == ["vcloud", "doctor"]:
            proc = subprocess.run(words, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
            assert (
                proc.returncode == 2 and "error: cluster.account: 'project_465XXXXXX' is a placeholder" in proc.stdout
            )
        elif words[:1] == ["snakemake"]:
            command = [sys.executable, "-m", *words, "-d", str(work), "--config", f"data={{raw: {raw}}}"]
            proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
            out = proc.stdout + proc.stderr
            if "-n" in words:
                assert proc.returncode == 0, out[-3000:]
                assert "vcloud doctor: cluster.account" in out  # said already on the dry run
            else:
                assert proc.returncode != 0 and "(nothing was submitted)" in out, out[-3000:]
        else:
            continue
        ran += 1
    assert ran >= 6

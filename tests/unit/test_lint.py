"""ruff keeps src, tests and bench in one style (rules and line length in pyproject.toml),
as snakefmt does for the workflow files (tests/workflow/test_pipeline.py)."""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.system import require_module

ROOT = Path(__file__).parents[2]
FOLDERS = ("src", "tests", "bench")


def _ruff() -> list[str]:
    found = shutil.which("ruff")
    if found:
        return [found]
    require_module("ruff")  # the wheel ships the binary; python -m ruff runs it (skip, or fail under CI=true)
    return [sys.executable, "-m", "ruff"]


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*_ruff(), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_ruff_check_is_clean():
    proc = _run("check", "--no-cache", *FOLDERS)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def test_ruff_format_is_clean():
    proc = _run("format", "--check", "--no-cache", *FOLDERS)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def test_the_configuration_catches_what_it_should(tmp_path):
    """The two tests above would pass vacuously if the configuration selected nothing."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nimport json\n\n\ndef f(x = 1):\n    return x\n")
    config = str(ROOT / "pyproject.toml")
    check = _run("check", "--no-cache", "--config", config, str(bad), cwd=tmp_path)
    assert check.returncode == 1
    for code in ("F401", "I001"):  # unused import, unsorted imports
        assert code in check.stdout, check.stdout
    assert _run("format", "--check", "--no-cache", "--config", config, str(bad), cwd=tmp_path).returncode == 1
    long = "x = " + " + ".join(["1"] * 40) + "\n"  # 4 + 40 + 39 * 3 = 161 characters
    (tmp_path / "long.py").write_text(long)
    assert _run("format", "--check", "--no-cache", "--config", config, "long.py", cwd=tmp_path).returncode == 1
    (tmp_path / "fits.py").write_text("x = " + " + ".join(["1"] * 28) + "\n")  # 116 characters
    assert _run("format", "--check", "--no-cache", "--config", config, "fits.py", cwd=tmp_path).returncode == 0


def test_every_python_file_of_the_three_folders_is_checked():
    """An exclude pattern that matches a folder name anywhere (e.g. "workflow") once hid tests/workflow."""
    proc = _run("check", "--no-cache", "--show-files", *FOLDERS)
    shown = {Path(line.strip()).resolve() for line in proc.stdout.splitlines() if line.strip().endswith(".py")}
    expected = {p.resolve() for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")}
    assert expected <= shown, sorted(str(p.relative_to(ROOT)) for p in expected - shown)[:10]

"""The formatter owns layout: tests/tools/check_fmt_skip.py (a pre-commit hook, hence CI) fails on a
`# fmt` skip comment that .fmt-skip-allowed does not give its file, naming file and line."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
CHECK = ROOT / "tests" / "tools" / "check_fmt_skip.py"
SKIP = "# fmt" + ": skip"  # spelled apart: this file holds none


def _check(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_a_stray_fmt_skip_fails_naming_file_and_line(tmp_path):
    stray = tmp_path / "stray.py"
    stray.write_text(f'TEXT = "{SKIP} in a string is no pragma"\n\n\ndef f(a, b):  {SKIP}\n    return a\n')
    allowed = tmp_path / "allowed"
    allowed.write_text("# nothing allowed\n")
    proc = _check("--allowed", allowed, stray)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        f"{stray}:4: {SKIP} not allowed (1 in the file, 0 in .fmt-skip-allowed): "
        "let ruff format lay it out, or list a table whose alignment matters"
    ]


def test_an_allowance_passes_and_an_unused_one_must_be_lowered(tmp_path):
    table = tmp_path / "table.py"
    table.write_text(f"ROWS = [\n    1,  2,\n    30, 4,\n]  {SKIP}\n")
    allowed = tmp_path / "allowed"
    allowed.write_text(f"{table}: 1: a matrix read by columns\n")
    assert _check("--allowed", allowed, table).returncode == 0
    allowed.write_text(f"{table}: 2: a matrix read by columns\n")
    proc = _check("--allowed", allowed, table)
    assert proc.returncode == 1 and f"{table}: allows 2, the file has 1: lower it" in proc.stdout
    allowed.write_text(f"{table}: 1\n")  # no reason
    proc = _check("--allowed", allowed, table)
    assert proc.returncode == 1 and "expected 'path: count: reason'" in proc.stderr


def test_the_repository_passes():
    proc = _check()
    assert proc.returncode == 0, proc.stdout + proc.stderr

"""A test that lacks what it needs skips naming it, and fails under CI=true (.ci/run exports it):
tests/system.py is the one way to skip for that, and nothing in tests/ skips another way."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

# One test per helper of tests/system.py, each missing what it asks for.
NEEDS = """
from tests.system import require, require_module, unavailable


def test_a_tool():
    require("the vcloud-test-tool package", "vcloud-no-such-tool")


def test_a_module():
    require_module("vcloud_no_such_module")


def test_a_port():
    unavailable("no free port in 1..2")
"""
NAMED = ("vcloud-no-such-tool", "vcloud_no_such_module", "no free port in 1..2")


def _pytest(folder: Path, ci: str | None) -> subprocess.CompletedProcess:
    """pytest in a fresh process on NEEDS alone (not this repository's conftest and options)."""
    (folder / "test_needs.py").write_text(NEEDS)
    (folder / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # no xdist, no other plugin: a second each
    if ci is not None:
        env["CI"] = ci
    command = [sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", "test_needs.py"]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci", [None, "false"])
def test_without_ci_a_missing_tool_skips_naming_it(tmp_path, ci):
    proc = _pytest(tmp_path, ci)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 skipped" in proc.stdout, proc.stdout
    for name in NAMED:
        assert re.search(rf"SKIPPED .*{re.escape(name)}", proc.stdout), (name, proc.stdout)


def test_under_ci_a_missing_tool_fails_naming_it(tmp_path):
    proc = _pytest(tmp_path, "true")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "3 failed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout
    for name in NAMED:
        assert re.search(rf"FAILED .*{re.escape(name)}.*CI=true: every tier must run", proc.stdout), (name, proc.stdout)


# A skip written another way stays a skip under CI=true: pytest.importorskip, pytest.skip, the
# skipif and skip marks. (The patterns are escaped so that this file does not match itself.)
OTHER_SKIPS = re.compile(r"\bimportorskip\(|\bpytest\.skip\(|\bmark\.skipif\b|\bmark\.skip\b")


def test_no_test_skips_outside_tests_system():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path != ROOT / "tests" / "system.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OTHER_SKIPS.search(line)
    ]
    assert not found, "skip through tests/system.py (unavailable, require, require_module):\n" + "\n".join(found)

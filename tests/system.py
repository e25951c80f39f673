"""What a heavy-tier test does when this machine lacks a system tool: skip, naming the script
that installs it, or fail with that one line when CI=true (CI must run every tier)."""

from __future__ import annotations

import os
import shutil

import pytest

SCRIPT = "tests/system-packages.sh"


def unavailable(reason: str) -> None:
    """Skip (or, under CI=true, fail) with `reason`; never returns."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: every tier must run)", pytrace=False)
    pytest.skip(reason)


def require(package: str, *tools: str) -> None:
    """Every one of `tools` on PATH, else unavailable() naming `package` and the script."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        unavailable(f"needs {package} ({', '.join(missing)} not found): run `bash {SCRIPT}` as root")

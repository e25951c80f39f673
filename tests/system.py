"""What a test does when this machine lacks what it needs (a system tool, a Python package, a free
port): skip, naming what to install, or fail with that one line when CI=true (CI must run every
tier). Every skip of that kind goes through unavailable(); tests/unit/test_system.py proves that
CI=true turns it into a failure. Never pytest.importorskip or a bare pytest.skip for it: they skip
under CI too.
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType

import pytest

SCRIPT = "tests/system-packages.sh"
PIP_TEST = "pip install -e '.[test]' installs it"


def unavailable(reason: str) -> None:
    """Skip (or, under CI=true, fail) with `reason`; never returns."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: every tier must run)", pytrace=False)
    pytest.skip(reason)


def require(package: str, *tools: str, install: str = f"run `bash {SCRIPT}` as root") -> None:
    """Every one of `tools` on PATH, else unavailable() naming `package` and how to install it
    (by default the script of the Debian packages)."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        unavailable(f"needs {package} ({', '.join(missing)} not found): {install}")


def require_module(module: str, install: str = PIP_TEST) -> ModuleType:
    """`module` imported, else unavailable() naming it: pytest.importorskip that fails under CI=true."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        unavailable(f"needs the Python module {module} ({err}): {install}")

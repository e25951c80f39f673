"""Headless Chromium for the viewer tests: Debian's chromium and chromium-driver, driven by selenium.

When they are missing and we are root with apt-get, the session installs them once (no browser
is downloaded by any other means); elsewhere the browser tests skip with the reason.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser")
DRIVERS = ("chromedriver", "chromium-driver")
PACKAGES = ("chromium", "chromium-driver")
# Headless, sandbox off (containers run us as root), no GPU, and no traffic of the browser's own.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--window-size=1280,900",
)


def _find() -> tuple[str, str] | None:
    browser = next((p for name in BROWSERS if (p := shutil.which(name))), None)
    driver = next((p for name in DRIVERS if (p := shutil.which(name))), None)
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """(browser, driver) paths; apt-get installs Debian's packages once when they are missing."""
    found = _find()
    if found:
        return found
    if shutil.which("apt-get") is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip(f"needs {' and '.join(PACKAGES)}: missing, and installing them needs root and apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES],
    ):
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(command)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    found = _find()
    if not found:
        pytest.fail(f"apt-get installed {' '.join(PACKAGES)} but no chromium/chromedriver is on PATH")
    return found


@pytest.fixture(scope="session")
def browser(chromium):
    """One headless Chromium for the session, with the console log captured."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = chromium
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium manager: never look anything up online
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in CHROMIUM_ARGS:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="session")
def serve():
    """serve(folder) -> base URL of a loopback http.server (python -m http.server's handler)."""
    servers = []

    def start(folder: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass

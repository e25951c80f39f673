"""Headless Chromium for the viewer tests: Debian's chromium and chromium-driver, driven by selenium.

tests/system-packages.sh installs them (no browser is downloaded by any other means); when they
are missing the browser tests skip, naming that script (fail under CI=true).
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.system import SCRIPT, require_module, unavailable

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
    """(browser, driver) paths of Debian's chromium and chromium-driver."""
    found = _find()
    if not found:
        unavailable(f"needs {' and '.join(PACKAGES)} (no chromium/chromedriver on PATH): run `bash {SCRIPT}` as root")
    return found


@pytest.fixture(scope="session")
def browser(chromium):
    """One headless Chromium for the session, with the console log captured."""
    webdriver = require_module("selenium.webdriver")  # skip, or fail under CI=true
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

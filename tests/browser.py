"""A real browser for tests: the system's Chromium (Debian package ``chromium``) driven by Playwright.

Playwright never downloads a browser here (``playwright install`` is not used): it launches
``/usr/bin/chromium`` (or ``PYMQ_TEST_CHROMIUM``) headless, without sandbox, GPU or background network.
Without Chromium or Playwright the tests that need them are skipped with the command that provides them,
except under CI, where that is a failure (the rule of tests/storage/services.py).

    from tests.browser import chromium   # noqa: F401 - the module-scoped fixture
    def test_page(chromium): page = chromium.new_page(); ...

Screenshots go to ``test-artifacts/<suite>/`` at the repository root (ignored by git; CI can keep it).
"""
from __future__ import annotations

import os
import shutil

import pytest

from tests.storage.services import in_ci

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "test-artifacts")


def _unavailable(reason: str):
    if in_ci():
        pytest.fail(f"{reason} (CI is set: a missing browser is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


def chromium_path() -> str:
    path = os.environ.get("PYMQ_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.path.exists(path):
        _unavailable("no Chromium to drive: apt-get install chromium (or set PYMQ_TEST_CHROMIUM)")
    return path


@pytest.fixture(scope="module")
def chromium():
    """A headless Chromium browser (Playwright ``Browser``) for one test module.  Not for the session:
    while sync Playwright is open it runs an asyncio loop on the main thread, and every later test that
    calls ``asyncio.run()`` (tests/client/test_aio.py) would fail with "cannot be called from a running
    event loop"."""
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright for Python is missing: pip install -e '.[test]'")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def artifacts_dir(suite: str) -> str:
    path = os.path.join(ARTIFACTS, suite)
    os.makedirs(path, exist_ok=True)
    return path

"""Headless Chromium for the web page tests: the system's browser (Debian's
``chromium``) driven by Playwright, with no browser download.

A missing Chromium or Playwright skips the test on a developer machine and
fails it under ``CI=true`` (``require_service``).  Screenshots go to the
test's temporary folder, and also to ``ORCHESTRATOR_TEST_SCREENSHOTS`` when
set (``docs/screenshots`` is made that way).  ``tests/conftest.py`` imports
the fixtures, so one browser serves the whole session.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SCREENSHOTS = os.environ.get("ORCHESTRATOR_TEST_SCREENSHOTS", "")


def chromium_path() -> str | None:
    explicit = os.environ.get("ORCHESTRATOR_TEST_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from tests.conftest import require_service  # (tests/conftest.py imports this module)

    path = chromium_path()
    require_service(path is not None, "Chromium (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require_service(False, "Playwright for Python (pip install -e '.[test]')")
        raise
    with sync_playwright() as pw:
        # No sandbox: CI runs as root, where Chromium's own sandbox cannot start.
        browser = pw.chromium.launch(executable_path=path, chromium_sandbox=False)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page (own cookies and storage) that fails the test on any script error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # The page's policy allows only its own files: a violation is a bug.
    page.on("console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None)
    page.set_default_timeout(15_000)
    yield page
    context.close()
    assert errors == [], errors


def screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    """Save a PNG of the page, tall enough for the whole message list."""
    hidden = page.evaluate(
        "() => { const m = document.getElementById('messages'); return m ? m.scrollHeight - m.clientHeight : 0; }"
    )
    size = page.viewport_size
    if hidden > 0:
        page.set_viewport_size({"width": size["width"], "height": min(size["height"] + hidden + 20, 4000)})
    path = tmp_path / name
    page.screenshot(path=str(path))
    page.set_viewport_size(size)
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(SCREENSHOTS) / name)
    return path

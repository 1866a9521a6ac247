"""Fixtures of the Brain's tests: Debian's Chromium driven by Playwright."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect, sync_playwright

from chalie.process.config import BrowserConfig
from chalie.web.browser import HEADLESS_ARGS
from tests.core.brain.daemon import BrainDaemon

CHROMIUM = str(BrowserConfig().executable)
# How long an expect() waits for its condition: Playwright's 5 s is short for a page
# that waits on a daemon, a scripted model and server-sent events on a loaded 2-core
# machine; a condition that holds is seen at once either way.
EXPECT_TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def d() -> Iterator[BrainDaemon]:
    """One real daemon a module (tests/core/brain/daemon.py)."""
    running = BrainDaemon()
    try:
        yield running
    finally:
        running.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium a module (nothing downloaded: Debian's, by executable_path)."""
    if not os.path.exists(CHROMIUM):  # CI installs it (.ci/run); a skip there would hide tests
        if os.environ.get("CI"):
            raise RuntimeError(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium)")
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=list(HEADLESS_ARGS))
        try:
            yield b
        finally:
            b.close()

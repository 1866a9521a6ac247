"""Fixtures of the web tests: the local site, and a WebKit allowed to reach it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chalie.web.kit import WebKit
from tests.core.web.kit import make_kit
from tests.core.web.site import Site


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    served = Site()
    yield served
    served.stop()


@pytest.fixture
def kit(site: Site, tmp_path: Path) -> Iterator[WebKit]:
    # Generous: the deadline tests make their own kit with a short one. At 2 s the PDF
    # bomb test got fetch-timeout on a loaded machine (a benchmark and two suites).
    made = make_kit(site, tmp_path, fetch_timeout=30.0, max_bytes=5 * 1024 * 1024)
    yield made
    made.close()

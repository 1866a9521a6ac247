"""Chat bridge fixtures: a real ChatBridge actor on a real loop, over the Conversations double."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.core.chat.bridge import Bridge, start_bridge, stop_bridge
from tests.core.chat.daemon import Daemon


@pytest.fixture
def short_home() -> Iterator[Path]:
    # ipc socket paths are capped at 107 bytes: stay short.
    path = Path(tempfile.mkdtemp(prefix="ch", dir="/tmp"))
    path.chmod(0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def bridge(short_home: Path) -> Iterator[Bridge]:
    b = start_bridge(short_home)
    yield b
    stop_bridge(b)


@pytest.fixture(scope="module")
def d() -> Iterator[Daemon]:
    """A whole daemon with the chat bridge, one per test module."""
    running = Daemon()
    try:
        yield running
    finally:
        running.close()

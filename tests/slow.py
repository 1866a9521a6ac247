"""The slow mark's guard: a test that starts a daemon, a model or a server must carry it.

Markers (``setup.cfg``): ``slow`` marks tests that start a daemon, worker
processes, a model or MCP server, or build an index; ``pytest -m "not slow"``
runs the fast unit tests alone, in seconds. A test module whose every test is
slow says so with ``pytestmark = pytest.mark.slow``. The helpers that start a
daemon call :func:`require_slow`, so a test that starts one unmarked fails,
naming the mark it needs (the root conftest notes each test's mark before its
fixtures are set up).
"""

from __future__ import annotations

import pytest

_RUNNING: dict[str, bool] = {"slow": True}


def note_mark(item: pytest.Item) -> None:
    """Called before any fixture of ``item`` is set up (a module's daemon fixture included)."""
    _RUNNING["slow"] = item.get_closest_marker("slow") is not None


def require_slow(what: str) -> None:
    """Fail a test that starts ``what`` (a daemon, a model server...) without the slow mark."""
    if not _RUNNING["slow"]:
        pytest.fail(f"this test starts {what}: mark it @pytest.mark.slow", pytrace=False)

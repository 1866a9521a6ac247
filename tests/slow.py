"""The slow mark's guard: a test that starts a daemon, a model or a server must carry it.

Markers (``setup.cfg``): ``slow`` marks tests that start a daemon, worker
processes, a model or MCP server, or build an index; ``pytest -m "not slow"``
runs the fast unit tests alone, in seconds. A test module whose every test is
slow says so with ``pytestmark = pytest.mark.slow``. The helpers that start a
daemon call :func:`require_slow`, so a test that starts one unmarked fails,
naming the mark it needs (the root conftest notes each test's mark before its
fixtures are set up).

A module marked slow whole is not even imported by a run that deselects slow
tests (``-m "not slow"``, exactly): :func:`whole_module_slow` reads its
``pytestmark`` line from the source, so the fast run spends no time importing
and rewriting code whose every test it would deselect.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# A module-level mark, alone or first in a list: ``pytestmark = pytest.mark.slow`` or
# ``pytestmark = [`` followed by ``pytest.mark.slow,`` on the next line.
_WHOLE = re.compile(r"^pytestmark = (?:pytest\.mark\.slow$|\[\n\s+pytest\.mark\.slow,$)", re.M)
_ASSIGNED = re.compile(r"^pytestmark\s*[:=]", re.M)
FAST_ONLY = "not slow"

_RUNNING: dict[str, bool] = {"slow": True}


def note_mark(item: pytest.Item) -> None:
    """Called before any fixture of ``item`` is set up (a module's daemon fixture included)."""
    _RUNNING["slow"] = item.get_closest_marker("slow") is not None


def require_slow(what: str) -> None:
    """Fail a test that starts ``what`` (a daemon, a model server...) without the slow mark."""
    if not _RUNNING["slow"]:
        pytest.fail(f"this test starts {what}: mark it @pytest.mark.slow", pytrace=False)


def deselects_slow(config: pytest.Config) -> bool:
    """The run keeps only fast tests (``-m "not slow"``, nothing more in the expression)."""
    return " ".join(str(config.getoption("markexpr", "")).split()) == FAST_ONLY


def whole_module_slow(path: Path) -> bool:
    """A test module whose every test is slow: its one module-level ``pytestmark`` says so."""
    if path.suffix != ".py" or not path.name.startswith("test_"):
        return False
    text = path.read_text()
    return len(_ASSIGNED.findall(text)) == 1 and _WHOLE.search(text) is not None

"""The suite's hooks: each test's slow mark is noted before its fixtures run; a fast run
(``-m "not slow"``) does not import a test module marked slow whole.

The helpers live in modules named for what they hold: :mod:`tests.slow` (the
slow mark's guard), :mod:`tests.daemon_process` (a real daemon process),
:mod:`tools.http_servers` (what the small test servers share), :mod:`tools.waiting`
and :mod:`tools.processes` (shared with the benchmarks).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import slow


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # Its every test would be deselected: do not import it at all (True: ignore; None: ask on).
    if slow.deselects_slow(config) and slow.whole_module_slow(collection_path):
        return True
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture of the test is set up (a module's daemon fixture included).
    slow.note_mark(item)


@pytest.fixture(autouse=True)
def _signals_left_as_found() -> Iterator[None]:
    """A test that leaves this process's SIGINT ignored, handled or blocked fails: every
    process started later would inherit it (an ignored or blocked Ctrl-C survives exec)."""
    before = signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    after = signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if after != before:
        signal.signal(signal.SIGINT, before[0])
        signal.pthread_sigmask(signal.SIG_SETMASK, before[1])
        pytest.fail(f"the test left SIGINT changed: handler and mask {before} became {after}")

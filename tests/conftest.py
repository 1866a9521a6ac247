"""The suite's hooks: each test's slow mark is noted before its fixtures run; a fast run
(``-m "not slow"``) does not import a test module marked slow whole.

The helpers live in modules named for what they hold: :mod:`tests.slow` (the
slow mark's guard), :mod:`tests.daemon_process` (a real daemon process),
:mod:`tools.http_servers` (what the small test servers share), :mod:`tests.store_engines`
(the store suite's SQLite and PostgreSQL), :mod:`tools.waiting`
and :mod:`tools.processes` (shared with the benchmarks).
"""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from tests import bytecode, slow  # noqa: F401 (bytecode: first of ours, so the rest is cached)
from tests.store_engines import pg_cluster, store_place  # noqa: F401 (fixtures)
from tools.processes import signal_state


def _sigint_now() -> tuple[object, set[signal.Signals], str]:
    kernel = signal_state(os.getpid(), signal.SIGINT)
    return signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []), kernel


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    # Its every test would be deselected: do not import it at all (True: ignore; None: ask on).
    if slow.deselects_slow(config) and slow.whole_module_slow(collection_path):
        return True
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture of the test is set up (a module's daemon fixture included).
    slow.note_mark(item)


# A run started in the background by a non-interactive shell (`pytest ... &`, nohup in a
# script) inherits SIGINT ignored, and so would every process the tests start: a Ctrl-C test
# would then send SIGINT to a CLI that cannot hear it (what failed the Ctrl-C tests in runs
# started that way, never in a foreground one). The tests' processes get the terminal's
# default, as a person's shell gives a command it starts in the foreground.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_AT_START: Final = _sigint_now()


@pytest.fixture(autouse=True)
def _signals_left_as_found() -> Iterator[None]:
    """SIGINT as the run started (this process's handler, mask and the kernel's view): a test,
    or a module fixture set up for it, that leaves it ignored or blocked fails, since every
    process started later inherits that across exec. Read from /proc too: a C library can
    change it behind Python's back."""
    changed = _sigint_now() != _AT_START
    yield
    if changed or _sigint_now() != _AT_START:
        now = _sigint_now()
        signal.signal(signal.SIGINT, _AT_START[0])  # Python's handler, set in the kernel again
        signal.pthread_sigmask(signal.SIG_SETMASK, _AT_START[1])
        when = "before the test (a fixture of its)" if changed else "by the test"
        pytest.fail(f"SIGINT was changed {when}: {_AT_START} became {now}")


def pytest_collection_finish(session: pytest.Session) -> None:
    # What collection built (every test module, its items, the imported code) lives for
    # the whole run: out of the collector's sight, each collection does not walk it again.
    gc.collect()
    gc.freeze()

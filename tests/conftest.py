"""The suite's one hook: each test's slow mark is noted before its fixtures run.

The helpers live in modules named for what they hold: :mod:`tests.slow` (the
slow mark's guard), :mod:`tests.daemon_process` (a real daemon process),
:mod:`tools.http_servers` (what the small test servers share), :mod:`tools.waiting`
and :mod:`tools.processes` (shared with the benchmarks).
"""

from __future__ import annotations

import pytest

from tests import slow


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture of the test is set up (a module's daemon fixture included).
    slow.note_mark(item)

"""The immediate executor: abilities with ``isolation = "immediate"`` run at once, on the
dispatcher's own thread.

For abilities that compute and return within a fraction of a millisecond and
never wait (no I/O, no locks, no other actor): the clock, the calculator.
Handing such a call to a lane thread and back costs more than the call: two
thread hand-offs, each a wake-up of a sleeping thread (often on the other
core) and a pass of the GIL, measured by ``tools/bench/bench_dispatch.py`` at
about 140 us across two cores, against a few microseconds of work.

A run here cannot be timed out or cancelled (the dispatcher's thread is busy
with it), so the executor keeps every tool to its declaration: a run that
takes longer than :data:`SLOW_RUN` is logged, and from then on, for the life
of the process, that tool runs in inline lanes of its own
(:class:`~actors.calls.executors.inline.InlineExecutor`, started on first use),
where the deadline and cancellation work as for any inline tool. The time is
wall-clock time, so a run that waited for the GIL behind a busy thread may
count as slow too: the move costs that tool its speed, never its safety.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from actors.calls.executors.inline import InlineExecutor
from chalie.calls.execution import Done, Job
from chalie.calls.faults import FAULTS
from chalie.calls.invoke import invoke
from chalie.result import ToolResult

log = logging.getLogger("chalie.calls.dispatch")

# A run that takes longer than this moves its tool to the lanes (seconds).
SLOW_RUN: Final = 0.005


class ImmediateExecutor:
    """Runs a job inside ``start``, on the caller's thread, and returns its result; see the
    module docstring.

    ``start`` is called on the dispatcher's thread only, so the set of moved
    tools needs no lock.
    """

    def __init__(self, lanes: InlineExecutor, slow_run: float = SLOW_RUN) -> None:
        if isinstance(slow_run, bool) or not isinstance(slow_run, int | float) or slow_run <= 0:
            raise ValueError("slow_run must be a positive number of seconds")
        self._lanes = lanes
        self._slow_run = float(slow_run)
        self._moved: set[str] = set()

    def moved(self) -> frozenset[str]:
        """The tools that ran too long here and now run in the lanes."""
        return frozenset(self._moved)

    # -- the Executor protocol ---------------------------------------------------
    def start(self, job: Job, done: Done) -> ToolResult | None:
        tool = job.tool
        if tool in self._moved:
            self._lanes.start(job, done)
            return None
        if job.instance.was_cancelled():
            return FAULTS.cancelled(tool)
        began = time.perf_counter()
        result = invoke(job.instance, job.value)
        spent = time.perf_counter() - began
        if spent > self._slow_run:
            self._moved.add(tool)
            log.warning(
                "%s is declared immediate but one run took %.1f ms (over %.1f ms); it runs "
                "in inline lanes from now on",
                tool,
                spent * 1000,
                self._slow_run * 1000,
            )
        return result

    def cancel(self, job_id: str) -> None:
        self._lanes.cancel(job_id)  # a job run here has already ended

    def close(self) -> None:
        self._lanes.close()

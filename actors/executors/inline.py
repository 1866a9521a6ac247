"""The inline executor: abilities run on a bounded thread pool, shared fairly in per-tool lanes.

One tool may use at most ``lane_limit`` threads at once, so 50 slow calls to
one tool cannot starve another tool; further calls wait in the tool's lane
(at most ``lane_queue`` of them; past that a call is ``overloaded``).

The threads are daemon threads on purpose: a Python thread cannot be killed,
and an ability that ignores its ``cancelled`` event must not keep the daemon
from exiting. Cancelling a running job sets the instance's ``cancelled``
event; a job still waiting in its lane is dropped and reported ``cancelled``.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from typing import Final

from chalie.execution import Done, Job
from chalie.faults import FAULTS
from chalie.invoke import invoke

log = logging.getLogger("chalie.dispatch")

DEFAULT_LANE_QUEUE: Final = 1000


class InlineExecutor:
    """Runs a job's instance in its tool's lane; see the module docstring."""

    def __init__(
        self, threads: int = 16, lane_limit: int | None = None, lane_queue: int = DEFAULT_LANE_QUEUE
    ) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError("inline_threads must be a positive integer")
        if lane_limit is not None and (
            isinstance(lane_limit, bool) or not isinstance(lane_limit, int) or lane_limit < 1
        ):
            raise ValueError("lane_limit must be a positive integer")
        if isinstance(lane_queue, bool) or not isinstance(lane_queue, int) or lane_queue < 0:
            raise ValueError("lane_queue must be a non-negative integer")
        self._limit = lane_limit if lane_limit is not None else max(1, threads // 2)
        self._queue_limit = lane_queue
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[tuple[Job, Done]]] = {}
        self._jobs: dict[str, Job] = {}
        self._in_run: set[str] = set()
        self._queue: queue.SimpleQueue[tuple[Job, Done] | None] = queue.SimpleQueue()
        self._size = threads
        self._threads: list[threading.Thread] = []
        self._started = False

    def _start_threads(self) -> None:
        # Started on first use, so a daemon that never runs an inline tool holds no threads.
        self._started = True
        for i in range(self._size):
            thread = threading.Thread(target=self._serve, name=f"chalie-inline-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    # -- the Executor protocol ---------------------------------------------------
    def start(self, job: Job, done: Done) -> None:
        tool = job.tool
        with self._lock:
            if not self._started:
                self._start_threads()
            self._jobs[job.job_id] = job
            running = self._running.get(tool, 0)
            if running >= self._limit:
                waiting = self._waiting.setdefault(tool, deque())
                if len(waiting) >= self._queue_limit:
                    del self._jobs[job.job_id]
                    overloaded = True
                else:
                    waiting.append((job, done))
                    return
            else:
                self._running[tool] = running + 1
                overloaded = False
        if overloaded:
            done(FAULTS.overloaded(tool))
            return
        self._queue.put((job, done))

    def cancel(self, job_id: str) -> None:
        dropped: tuple[Job, Done] | None = None
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return
            job.instance.cancelled.set()
            waiting = self._waiting.get(job.tool)
            if waiting:
                for item in waiting:
                    if item[0] is job:
                        waiting.remove(item)
                        dropped = item
                        del self._jobs[job_id]
                        break
        if dropped is not None:
            dropped[1](FAULTS.cancelled(job.tool))

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    # -- diagnostics -----------------------------------------------------------------
    def busy(self) -> dict[str, int]:
        """Threads taken per tool (running, or about to run, a job of that tool)."""
        with self._lock:
            return dict(self._running)

    def in_run(self) -> frozenset[str]:
        """The job ids whose ability is inside ``run`` right now."""
        with self._lock:
            return frozenset(self._in_run)

    # -- the lane threads --------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._run(*item)

    def _run(self, job: Job, done: Done) -> None:
        tool = job.tool
        while True:
            if job.instance.cancelled.is_set():
                result = FAULTS.cancelled(tool)
            else:
                with self._lock:
                    self._in_run.add(job.job_id)
                result = invoke(job.instance, job.value)
            # The lane's books first, the report last: reporting wakes the dispatcher,
            # which then wants the GIL this thread holds.
            with self._lock:
                self._in_run.discard(job.job_id)
                self._jobs.pop(job.job_id, None)
                waiting = self._waiting.get(tool)
                following = waiting.popleft() if waiting else None
                if following is None:
                    self._waiting.pop(tool, None)
                    self._running[tool] -= 1
                    if not self._running[tool]:
                        del self._running[tool]
            try:
                done(result)
            except Exception:
                log.exception("reporting the result of %s failed", tool)
            if following is None:
                return
            job, done = following

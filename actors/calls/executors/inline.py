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
import threading
from collections import deque
from typing import Final

from chalie.calls.execution import Done, Job
from chalie.calls.faults import FAULTS
from chalie.calls.invoke import invoke

log = logging.getLogger("chalie.calls.dispatch")

DEFAULT_LANE_QUEUE: Final = 1000


class _Lane:
    """One lane thread's hand-off: the job it is given, and the lock that wakes it."""

    __slots__ = ("item", "wake")

    def __init__(self) -> None:
        self.item: tuple[Job, Done] | None = None
        self.wake = threading.Lock()
        self.wake.acquire()  # held while the thread has nothing to do


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
        # Idle lane threads, the most recently idle last: a job goes to the one whose
        # caches are warm, woken through its own lock (no shared queue to contend on).
        self._idle: list[_Lane] = []
        # Admitted jobs (their lane's count taken) waiting for a free thread, oldest first.
        self._backlog: deque[tuple[Job, Done]] = deque()
        self._size = threads
        self._threads: list[threading.Thread] = []
        self._started = False
        self._closed = False

    def _start_threads(self) -> None:
        # Started on first use, so a daemon that never runs an inline tool holds no threads.
        self._started = True
        for i in range(self._size):
            lane = _Lane()
            self._idle.append(lane)
            thread = threading.Thread(
                target=self._serve, args=(lane,), name=f"chalie-inline-{i}", daemon=True
            )
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
            if running < self._limit:
                self._running[tool] = running + 1
                lane = self._idle.pop() if self._idle else None
                if lane is None:
                    self._backlog.append((job, done))
                    return
                lane.item = (job, done)
            else:
                waiting = self._waiting.setdefault(tool, deque())
                if len(waiting) < self._queue_limit:
                    waiting.append((job, done))
                    return
                del self._jobs[job.job_id]
                lane = None
        if lane is None:
            done(FAULTS.overloaded(tool))
            return
        lane.wake.release()  # last: the lane thread wakes wanting the GIL this one holds

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
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for lane in idle:
            lane.wake.release()  # with no item: the thread ends

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
    def _serve(self, lane: _Lane) -> None:
        item: tuple[Job, Done] | None = None
        while True:
            if item is None:
                lane.wake.acquire()  # released by start (with an item) or close (without)
                item, lane.item = lane.item, None
                if item is None:
                    return
            job, done = item
            tool = job.tool
            if job.instance.was_cancelled():
                result = FAULTS.cancelled(tool)
            else:
                with self._lock:
                    self._in_run.add(job.job_id)
                result = invoke(job.instance, job.value)
            # The books and this thread's next job in one go, the report last: reporting
            # wakes the dispatcher, which then wants the GIL this thread holds.
            stop = False
            with self._lock:
                self._in_run.discard(job.job_id)
                self._jobs.pop(job.job_id, None)
                waiting = self._waiting.get(tool)
                item = waiting.popleft() if waiting else None  # the lane's next, same count
                if item is None:
                    self._waiting.pop(tool, None)
                    self._running[tool] -= 1
                    if not self._running[tool]:
                        del self._running[tool]
                    if self._backlog:
                        item = self._backlog.popleft()
                    elif self._closed:
                        stop = True
                    else:
                        self._idle.append(lane)  # from here on start() may hand it a job
            try:
                done(result)
            except Exception:
                log.exception("reporting the result of %s failed", tool)
            if stop:
                return

"""The process executor: abilities with ``isolation = "process"`` run in the worker pool.

The job's validated parameters and context travel as a :class:`WorkerJob`
(msgpack over ZeroMQ); the worker's :class:`WorkerResult`, rich payload
included, comes back as the :class:`ToolResult` it stands for. The pool
bounds the call with the job's timeout plus :data:`POOL_GRACE`, so the
dispatcher's own deadline (the job's timeout) normally ends the call first
and cancels the job here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Final, Protocol

from chalie.calls.execution import Done, Job
from chalie.calls.faults import FAULTS
from chalie.wire.messages import WorkerJob, WorkerResult
from chalie.workers.broker_state import to_tool_result

log = logging.getLogger("chalie.calls.dispatch")

POOL_GRACE: Final = 1.0


class WorkerPool(Protocol):
    """What this executor needs from the worker pool (actors/workers/worker_pool.py)."""

    def submit(
        self,
        job: WorkerJob,
        *,
        timeout: float,
        on_done: Callable[[Future[WorkerResult]], object] | None = None,
    ) -> Future[WorkerResult]: ...

    def cancel(self, job_id: str) -> Any: ...


class ProcessExecutor:
    """Sends jobs to the worker pool's handle; see the module docstring."""

    def __init__(self, workers: WorkerPool | None) -> None:
        self._workers = workers

    def start(self, job: Job, done: Done) -> None:
        workers = self._workers
        if workers is None:
            done(FAULTS.no_executor(job.tool, "process"))
            return
        try:
            work = WorkerJob(
                job_id=job.job_id,
                ability=job.entry.ref,
                params=job.params,
                context=job.context,
                deadline=time.time() + job.timeout,
            )
            # The callback is on the future before the broker thread is woken.
            workers.submit(
                work, timeout=job.timeout + POOL_GRACE, on_done=lambda f: done(_result(job, f))
            )
        except Exception as exc:
            log.exception("submitting %s to the worker pool failed", job.tool)
            done(FAULTS.executor_failed(job.tool, type(exc).__name__))

    def cancel(self, job_id: str) -> None:
        if self._workers is not None:
            try:
                self._workers.cancel(job_id)
            except Exception:
                log.exception("cancelling worker job %s failed", job_id)

    def close(self) -> None:
        pass  # the pool is a supervised actor of its own


def _result(job: Job, fut: Future[WorkerResult]) -> Any:
    try:
        return to_tool_result(fut.result())
    except Exception as exc:
        log.exception("the worker pool failed call %r", job.call_id)
        return FAULTS.executor_failed(job.tool, f"worker pool: {type(exc).__name__}")

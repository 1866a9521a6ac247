"""The Ray executor: abilities with ``isolation = "process"`` run as Ray tasks on a cluster.

Chosen by ``[workers] engine = "ray"`` (a row of :data:`actors.calls.executors.WORKER_ENGINES`);
nothing of Ray is imported before this executor is built, so a daemon on the
local engine never loads it.

Lifecycle, in order:

1. Built by the dispatcher: a thread (``chalie-ray-connect``) imports ``ray``
   and calls ``ray.init`` with the configured address (``"local"`` starts a
   cluster inside the daemon, for tests), the namespace, and a job
   ``runtime_env`` whose ``working_dir`` is the drop-in folder, which Ray
   uploads once to the cluster: a host that has never seen the folder runs
   its abilities. Calls started meanwhile wait; their deadline runs in the
   dispatcher as always. The thread then waits for ``close``: a ``"local"``
   cluster is its child, and Linux ends it with the thread that started it.
   Ray's fatal-signal handler is turned off before Ray loads, so SIGTERM
   still stops the daemon cleanly.
2. A failed connect ends the waiting calls, and every call until the next
   attempt, with ``service-unavailable``; the thread tries again after a
   growing delay.
3. ``start``: the job travels exactly as to a local worker process, a
   :class:`~chalie.wire.messages.WorkerJob` frame, and one Ray task runs it with
   :func:`chalie.workers.worker_process.run_frame` (the same load, coerce and invoke),
   asking for the ability's resources (``[workers.abilities.NAME]``, default
   one CPU), with ``max_retries=0`` and ``retry_exceptions=False``: Ray never
   runs a call twice. The task's ``WorkerResult`` frame becomes the call's
   result through the ObjectRef's future, on Ray's callback thread.
4. ``cancel`` (the turn was cancelled, or the dispatcher's deadline passed):
   ``ray.cancel(ref, force=True)``. A queued task is dropped; a running one's
   worker process is killed, as the local pool kills a worker. The call is
   reported ``cancelled``.
5. A task whose worker process or node died is ``worker-crashed``, as a local
   worker's death is; any other Ray failure is ``internal-error``.
6. ``close`` disconnects (``ray.shutdown``, which also stops a ``"local"``
   cluster); calls still running are abandoned (the dispatcher ended them).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Final, Literal

from chalie.calls.execution import Done, Job
from chalie.calls.faults import FAULTS
from chalie.process.config import RayTaskConfig, WorkersConfig
from chalie.result import ToolResult
from chalie.wire.frames import decode_message
from chalie.wire.messages import WorkerJob, WorkerResult, encode
from chalie.workers.broker_state import to_tool_result

log = logging.getLogger("chalie.ray")

ENGINE: Final = "Ray"
# Seconds between connection attempts: the first retry, doubled up to the cap.
RETRY_BASE: Final = 1.0
RETRY_CAP: Final = 60.0
# Seconds a TCP connect to the cluster's address may take before it counts as unreachable.
PROBE_TIMEOUT: Final = 5.0
# Calls waiting for the first connection at most; past it a call is overloaded.
MAX_WAITING: Final = 10_000
# Ray's exceptions that mean the process (or the node) running the task died.
CRASHES: Final = ("WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "OutOfMemoryError")

State = Literal["connecting", "ready", "down", "closed"]


def init_options(settings: WorkersConfig, dropins: Path | None) -> dict[str, Any]:
    """The keywords of ``ray.init`` for these settings (the drop-ins shipped when any)."""
    options: dict[str, Any] = {
        "namespace": settings.namespace,
        "log_to_driver": False,
        "configure_logging": False,
    }
    if settings.address == "local":
        options.update(num_cpus=settings.local_cpus, include_dashboard=False)
    else:
        options["address"] = settings.address
    if settings.ship_dropins and dropins is not None and any(dropins.glob("*.py")):
        options["runtime_env"] = {"working_dir": str(dropins), "excludes": ["__pycache__"]}
    return options


def check_reachable(address: str | None, timeout: float = PROBE_TIMEOUT) -> None:
    """ConnectionError at once when a ``HOST:PORT`` (or ``ray://HOST:PORT``) address refuses
    TCP: ``ray.init`` would retry it for tens of seconds while calls wait."""
    if address is None or address in ("local", "auto"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"{address}: {exc}") from None


def task_options(wants: RayTaskConfig) -> dict[str, Any]:
    """The keywords of ``.options`` for one ability's calls: its resources, and never a retry."""
    options: dict[str, Any] = {
        "num_cpus": wants.num_cpus,
        "num_gpus": wants.num_gpus,
        "max_retries": 0,
        "retry_exceptions": False,
    }
    if wants.memory is not None:
        options["memory"] = wants.memory
    if wants.resources:
        options["resources"] = dict(wants.resources)
    return options


def shipped_ref(ref: str, dropins: Path | None) -> str:
    """The reference a cluster worker loads: a drop-in file's path relative to the shipped
    folder (the task's working directory), any other reference unchanged."""
    target, _, qual = ref.rpartition(":")
    if dropins is None or not target.endswith(".py"):
        return ref
    try:
        relative = Path(target).relative_to(dropins.resolve())
    except ValueError:
        return ref
    return f"{relative}:{qual}"


def task_result(job: Job, outcome: Future[Any], cancelled: bool) -> ToolResult:
    """The call's result from the task's future (its frame, or the Ray error it raised)."""
    try:
        frame = outcome.result()
    except Exception as exc:
        kind = type(exc).__name__
        if cancelled:
            return FAULTS.cancelled(job.tool)
        if kind in CRASHES:
            log.error("the Ray worker running %s (%s) died: %s", job.tool, job.call_id, kind)
            return FAULTS.worker_crashed()
        log.error("Ray failed call %r of %s: %s", job.call_id, job.tool, exc)
        return FAULTS.executor_failed(job.tool, f"ray: {kind}")
    if cancelled:
        return FAULTS.cancelled(job.tool)
    try:
        result = decode_message(frame)
    except Exception as exc:
        log.error("Ray task of %s returned an unreadable frame: %s", job.tool, exc)
        return FAULTS.executor_failed(job.tool, "ray: unreadable result")
    if not isinstance(result, WorkerResult):
        return FAULTS.executor_failed(job.tool, f"ray: {type(result).__name__}")
    return to_tool_result(result)


class RayExecutor:
    """Runs worker abilities as Ray tasks; see the module docstring."""

    def __init__(
        self,
        settings: WorkersConfig,
        dropins: Path | None = None,
        *,
        retry_base: float = RETRY_BASE,
    ) -> None:
        self._settings = settings
        self._dropins = dropins if dropins is not None and dropins.is_dir() else None
        self._init = init_options(settings, self._dropins)
        self._shipped = "runtime_env" in self._init
        self._retry_base = retry_base
        self._lock = threading.Lock()
        self._state: State = "connecting"
        self._why = ""  # the last connection failure
        self._waiting: list[tuple[Job, Done]] = []
        self._live: set[str] = set()  # jobs being submitted or running
        self._refs: dict[str, Any] = {}  # job id -> the task's ObjectRef
        self._cancelled: set[str] = set()
        self._ray: Any = None
        self._tasks: dict[str, Any] = {}  # tool -> the remote function with its options
        self._wake = threading.Event()
        self._connector = threading.Thread(
            target=self._connect_loop, name="chalie-ray-connect", daemon=True
        )
        self._connector.start()

    # -- connecting --------------------------------------------------------------------
    def _connect_loop(self) -> None:
        delay = self._retry_base
        while True:
            try:
                self._connect()
                # This thread lives as long as the executor: a cluster that ray.init
                # started ("local") is its child, killed by Linux when the thread that
                # started it ends (PR_SET_PDEATHSIG follows the thread, not the process).
                self._wake.wait()
                return
            except Exception as exc:
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                log.error("cannot connect to the Ray cluster at %s: %s", self.address, why)
                with self._lock:
                    if self._state == "closed":
                        return
                    self._state, self._why = "down", why[:200]
                    waiting, self._waiting = self._waiting, []
                for job, done in waiting:
                    done(self._unavailable(job))
            if self._wake.wait(delay):
                return  # closed
            delay = min(delay * 2, RETRY_CAP)
            if not self._retrying():
                return

    def _retrying(self) -> bool:
        """Back to connecting after a failed attempt; False once closed."""
        with self._lock:
            if self._state == "closed":
                return False
            self._state = "connecting"
            return True

    def _connect(self) -> None:
        # The daemon owns its signals: Ray's own handler of fatal signals takes SIGTERM
        # too, and a daemon stopped with it aborted (exit -6) instead of stopping cleanly.
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        import ray  # here only: the local engine never imports Ray

        from chalie.workers.worker_process import run_frame

        started = time.monotonic()
        check_reachable(self._settings.address)
        if not ray.is_initialized():
            ray.init(**self._init)
        self._ray = ray
        remote = ray.remote(run_frame)
        default = task_options(RayTaskConfig())
        self._tasks = {"": remote.options(**default)}
        for tool, wants in self._settings.abilities.items():
            self._tasks[tool] = remote.options(**task_options(wants))
        log.info(
            "connected to the Ray cluster at %s in %.1f s (drop-ins shipped: %s)",
            self.address,
            time.monotonic() - started,
            self._shipped,
        )
        with self._lock:
            closed = self._state == "closed"
            if not closed:
                self._state, self._why = "ready", ""
                waiting, self._waiting = self._waiting, []
        if closed:  # closed while ray.init ran: leave the cluster it joined
            ray.shutdown()
            return
        for job, done in waiting:
            self._submit(job, done)

    @property
    def address(self) -> str:
        return self._settings.address or "local"

    def _unavailable(self, job: Job) -> ToolResult:
        return FAULTS.engine_unavailable(job.tool, ENGINE, self._why or "not connected")

    # -- the Executor protocol -----------------------------------------------------------
    def start(self, job: Job, done: Done) -> None:
        with self._lock:
            state = self._state
            if state == "connecting" and len(self._waiting) < MAX_WAITING:
                self._waiting.append((job, done))
                return
        if state == "ready":
            self._submit(job, done)
        elif state == "closed":
            done(FAULTS.stopped("the Ray executor is closed"))
        elif state == "down":
            done(self._unavailable(job))
        else:  # connecting, with too many calls waiting already
            done(FAULTS.overloaded(job.tool))

    def _submit(self, job: Job, done: Done) -> None:
        with self._lock:
            self._live.add(job.job_id)
        try:
            frame = encode(
                WorkerJob(
                    job_id=job.job_id,
                    ability=shipped_ref(job.entry.ref, self._dropins if self._shipped else None),
                    params=job.params,
                    context=job.context,
                    deadline=time.time() + job.timeout,
                )
            )
            task = self._tasks.get(job.tool) or self._tasks[""]
            ref = task.remote(frame)
        except Exception as exc:
            log.exception("submitting %s to Ray failed", job.tool)
            with self._lock:
                self._live.discard(job.job_id)
                self._cancelled.discard(job.job_id)
            done(FAULTS.executor_failed(job.tool, f"ray: {type(exc).__name__}"))
            return
        with self._lock:
            self._refs[job.job_id] = ref
            cancel_now = job.job_id in self._cancelled
        if cancel_now:
            self._cancel_ref(ref)
        ref.future().add_done_callback(lambda outcome: self._finished(job, done, outcome))

    def _finished(self, job: Job, done: Done, outcome: Future[Any]) -> None:
        with self._lock:
            self._refs.pop(job.job_id, None)
            self._live.discard(job.job_id)
            cancelled = job.job_id in self._cancelled
            self._cancelled.discard(job.job_id)
        try:
            done(task_result(job, outcome, cancelled))
        except Exception:
            log.exception("reporting the result of %s failed", job.tool)

    def cancel(self, job_id: str) -> None:
        dropped: tuple[Job, Done] | None = None
        ref: Any = None
        with self._lock:
            for item in self._waiting:
                if item[0].job_id == job_id:
                    self._waiting.remove(item)
                    dropped = item
                    break
            else:
                if job_id not in self._live:
                    return  # unknown, or finished already
                self._cancelled.add(job_id)
                ref = self._refs.get(job_id)  # None: being submitted, which cancels it
        if dropped is not None:
            dropped[1](FAULTS.cancelled(dropped[0].tool))
        elif ref is not None:
            self._cancel_ref(ref)

    def _cancel_ref(self, ref: Any) -> None:
        try:
            self._ray.cancel(ref, force=True)
        except Exception:
            log.exception("cancelling a Ray task failed")

    def close(self) -> None:
        with self._lock:
            self._state = "closed"
            waiting, self._waiting = self._waiting, []
            connected = self._ray is not None
        self._wake.set()
        for _job, done in waiting:
            done(FAULTS.stopped("the Ray executor closed before the call was sent"))
        if connected:
            try:
                self._ray.shutdown()
            except Exception:
                log.exception("disconnecting from Ray failed")

    # -- diagnostics ----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The connection's state and the calls in flight (for ``chalie status``)."""
        with self._lock:
            return {
                "engine": "ray",
                "address": self.address,
                "state": self._state,
                "error": self._why or None,
                "running": len(self._refs),
                "waiting": len(self._waiting),
                "dropins_shipped": self._shipped,
            }

"""The WorkerPoolActor: a ZeroMQ ROUTER broker thread and N ability worker processes.

Lifecycle of the pool:

1. ``on_start`` picks the ipc endpoint inside the data directory, binds the
   ROUTER (LINGER=0, ROUTER_MANDATORY, MAXMSGSIZE) and starts the broker
   thread with ``spawn_thread``, so a crash there restarts the pool.
2. The broker thread owns every socket and process. It spawns workers (and
   one warm spare that takes over a dead worker's slot at once) with
   ``subprocess.Popen([sys.executable, "-m", "chalie.workers.worker_process", ...])``, writes
   each a fresh identity and secret on its stdin, and watches each through a
   pidfd in the same blocking ``zmq.Poller`` as the ROUTER and the eventfd
   that wakes it for submissions from other threads. A worker is sent jobs
   only after its WorkerReady proves the secret.
   Frames from peers that are not a live worker are dropped before they are
   decoded, the rest are decoded with a depth limit (``chalie.wire.frames``), and
   one turn of the loop handles a bounded number of frames, so garbage
   traffic can neither crash the thread nor starve heartbeats and deadlines.
3. ``WorkerPoolHandle.submit`` queues a job from any thread and returns a
   future that always resolves to a WorkerResult: the worker's answer, or
   worker-crashed, tool-timeout, cancelled, overloaded or internal-error.
4. ``on_stop`` asks the workers to shut down, kills what is left after a
   short grace, reaps every process and fails any job still open.

The handle outlives the actor: a restarted pool binds itself to the same
handle, so callers keep one object across restarts.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec
import zmq

from actors.actor import SupervisedActor
from actors.future import Reply
from actors.timers import TimerInbox
from chalie.calls.faults import FAULTS
from chalie.wire.frames import DropLog, check_sendable, decode_message
from chalie.wire.messages import (
    Heartbeat,
    WorkerJob,
    WorkerReady,
    WorkerResult,
    WorkerShutdown,
    encode,
)
from chalie.workers.broker_state import (
    BROKER_TIMEOUT,
    HEARTBEAT_INTERVAL,
    LIVENESS,
    MAX_FRAME,
    MAX_PENDING,
    STARTUP_GRACE,
    BrokerState,
    JobRecord,
    broker_endpoint,
    encode_credentials,
    error_result,
    from_tool_result,
    new_credentials,
)
from chalie.workers.worker_process import CONTROL_SUFFIX

log = logging.getLogger("chalie.workers")

# How often the broker looks at deadlines and heartbeats when nothing else happens.
TICK: Final = 0.05
# How long stopping workers get to exit on their own before they are killed.
SHUTDOWN_GRACE: Final = 1.0
# Plain ints: pyzmq's flag enums cost an enum construction on every combination.
_NOBLOCK: Final = int(zmq.NOBLOCK)
_SNDMORE: Final = int(zmq.SNDMORE)
_RCVMORE: Final = int(zmq.RCVMORE)
_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)
# A worker's control socket is its job identity plus this suffix.
CONTROL: Final = CONTROL_SUFFIX.encode()
# Frames, and bytes, handled in one turn of the loop: a flood of small or of
# large frames cannot hold off the clock (deadlines, heartbeats, spawning).
FRAMES_PER_TURN: Final = 256
BYTES_PER_TURN: Final = 32 * 1024 * 1024
# Messages queued per connected peer before ZeroMQ stops reading from it. A
# worker has at most one result and a few heartbeats in flight; the bound
# caps what one hostile peer can make the daemon hold in memory.
RECEIVE_QUEUE: Final = 64

WorkerFuture = concurrent.futures.Future[WorkerResult]
_NOT_RUNNING: Final[dict[str, Any]] = {
    "workers": [],
    "spares": [],
    "pending": 0,
    "running": 0,
    "completed": 0,
    "running_pool": False,
}


def _resolve(future: WorkerFuture, result: WorkerResult) -> None:
    if not future.done():
        try:
            future.set_result(result)
        except concurrent.futures.InvalidStateError:
            pass  # the caller cancelled the future itself


def _stopped(job_id: str) -> WorkerResult:
    return error_result(
        job_id,
        "internal-error",
        "The worker pool is not running (stopped or restarting).",
        "The call did not run; retry it shortly.",
    )


def _check_workers(workers: object) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError("workers must be a positive integer")


class _Process:
    """One worker process and the pidfd that becomes readable when it exits."""

    def __init__(self, popen: subprocess.Popen[bytes], identity: bytes) -> None:
        self.popen = popen
        self.identity = identity
        self.pidfd = os.pidfd_open(popen.pid)

    def kill(self) -> None:
        if self.popen.returncode is None:
            try:
                os.kill(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def reap(self) -> int:
        code = self.popen.wait()
        os.close(self.pidfd)
        return code


class Broker:
    """The broker; all but ``submit``, ``cancel``, ``query`` and ``close`` runs in its thread."""

    def __init__(
        self,
        home: Path,
        workers: int,
        *,
        spares: int = 1,
        heartbeat: float = HEARTBEAT_INTERVAL,
        liveness: int = LIVENESS,
        startup_grace: float = STARTUP_GRACE,
        broker_timeout: float = BROKER_TIMEOUT,
        max_frame: int = MAX_FRAME,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.state = BrokerState(
            workers,
            spares=spares,
            heartbeat=heartbeat,
            liveness=liveness,
            startup_grace=startup_grace,
            max_pending=max_pending,
        )
        self.heartbeat = heartbeat
        self.broker_timeout = broker_timeout
        self.max_frame = max_frame
        self.endpoint, self._tmpdir = broker_endpoint(home)
        self._commands: collections.deque[tuple[Any, ...]] = collections.deque()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # Closed when the broker is garbage: a thread may be writing to it after the
        # shutdown (it is written without a lock), so it never closes under a writer.
        self._close_wake = weakref.finalize(self, os.close, self._wake)
        self._closed = False
        self._signalled = False
        self._lock = threading.Lock()
        self._procs: dict[int, _Process] = {}  # pidfd -> process
        self._answers: list[tuple[WorkerFuture, WorkerResult]] = []  # this turn's results
        self.drops = DropLog(log, "worker broker")
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        try:
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._router.setsockopt(zmq.MAXMSGSIZE, max_frame)
            self._router.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
            self._router.bind(self.endpoint)
        except zmq.ZMQError:
            # A pool that cannot bind must not leak its context and descriptors
            # into every retry the supervisor makes.
            self._router.close(linger=0)
            self._ctx.term()
            self._close_wake()
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
            raise
        self.finished = threading.Event()
        self.poller = zmq.Poller()
        self.poller.register(self._router, zmq.POLLIN)
        self.poller.register(self._wake, zmq.POLLIN)
        self._host: int | None = None  # the driving thread's ident, once begun
        self._next_tick = self._next_beat = 0.0

    # -- called from any thread ---------------------------------------------------
    def _command(self, *command: Any) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._commands.append(command)
            # One wake-up per batch: the broker clears the flag before it drains,
            # so a command appended while the flag is set is always drained.
            if self._signalled:
                return True
            self._signalled = True
        # Written after the lock is let go: the write releases the GIL, the woken broker
        # takes it and then wants this lock; held here, the two would wait on each other.
        # The eventfd stays open until the broker object is gone (see __init__).
        try:
            os.eventfd_write(self._wake, 1)
        except BlockingIOError:
            pass  # the counter is saturated: the broker is awake anyway
        return True

    def submit(self, job: WorkerJob, timeout: float, future: WorkerFuture) -> None:
        # Encoded in the caller's thread: a job that cannot cross the process
        # boundary fails here, and the broker thread does less per call.
        try:
            frame = encode(job)
            too_deep = check_sendable(frame)
            if too_deep:
                raise ValueError(too_deep)
        except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
            _resolve(
                future,
                error_result(
                    job.job_id,
                    "internal-error",
                    f"The call's parameters cannot be sent to a worker process ({exc}).",
                    "Pass only JSON-like values (strings, numbers, lists, objects).",
                ),
            )
            return
        if len(frame) > self.max_frame:
            _resolve(
                future,
                error_result(
                    job.job_id,
                    "invalid-param",
                    f"The call's parameters are too large ({len(frame)} bytes).",
                    "Send less data in one call.",
                ),
            )
            return
        if self._on_host():  # the driving thread itself (a hosted pool's actor): at once
            if self._closed:
                _resolve(future, _stopped(job.job_id))
                return
            self._submit(job, timeout, future, frame, time.monotonic())
            self._dispatch()
        elif not self._command("submit", job, timeout, future, frame):
            _resolve(future, _stopped(job.job_id))

    def cancel(self, job_id: str) -> None:
        if self._on_host():
            self._cancel(job_id)
        else:
            self._command("cancel", job_id)

    def query(self, timeout: float = 5.0) -> dict[str, Any]:
        if self._on_host():
            return self._status()
        reply: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        if not self._command("status", reply):
            return dict(_NOT_RUNNING)
        return reply.result(timeout=timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the broker (it reaps the workers): at once on the driving thread, else
        by a command to it, waiting for it to finish."""
        if self._on_host():
            self._shutdown()
            return
        self._command("close")
        with self._lock:
            self._closed = True
        if not self.finished.wait(timeout):
            log.error("worker broker did not stop within %.1f s", timeout)

    # -- the broker's thread: its own (run), or a host actor's (HostedPool) ------------
    def run(self) -> None:
        """The broker on a thread of its own: wait, handle, until closed."""
        try:
            self.begin()
            while self.on_events(self.poller.poll(self.wait_ms())):
                pass
        finally:
            self._shutdown()

    def begin(self) -> None:
        """Start the workers and the clock, on the thread that will drive the broker."""
        self._host = threading.get_ident()
        now = time.monotonic()
        self._spawn_due(now)
        self._next_tick = now + TICK
        self._next_beat = now + self.heartbeat

    def wait_ms(self) -> int:
        """How long the driving thread may wait before the broker's next tick."""
        return max(0, math.ceil((self._next_tick - time.monotonic()) * 1000))

    def on_events(self, events: list[tuple[Any, int]]) -> bool:
        """One turn: the poller's events (any may be empty), the clock, then the sends
        and answers. False once a close command was read (the driver then shuts down)."""
        for sock, _ in events:
            if sock is self._router:
                self._receive(FRAMES_PER_TURN)
            elif sock == self._wake:
                os.eventfd_read(self._wake)
                with self._lock:
                    self._signalled = False
                if not self._drain_commands():
                    return False
            else:
                self._reap(sock)
        now = time.monotonic()
        if now >= self._next_tick:
            self._next_tick = now + TICK
            self._expire(now)
            self._spawn_due(now)
            if now >= self._next_beat:
                self._next_beat = now + self.heartbeat
                self._beat()
        self._dispatch()
        if self._answers:
            self._answer()
        return True

    def _on_host(self) -> bool:
        """Whether the caller is the thread that drives the broker (it may act at once)."""
        return self._host == threading.get_ident()

    def _answer(self) -> None:
        """Resolve the results this turn received (their callbacks run here)."""
        answers, self._answers = self._answers, []
        for future, result in answers:
            _resolve(future, result)

    def _drain_commands(self) -> bool:
        now = time.monotonic()
        while self._commands:
            command = self._commands.popleft()
            kind = command[0]
            if kind == "submit":
                _, job, timeout, future, frame = command
                self._submit(job, timeout, future, frame, now)
            elif kind == "cancel":
                self._cancel(command[1])
            elif kind == "status":
                command[1].set_result(self._status())
            elif kind == "close":
                return False
        return True

    def _submit(
        self, job: WorkerJob, timeout: float, future: WorkerFuture, frame: bytes, now: float
    ) -> None:
        refused = self.state.submit(job, timeout, future, now, frame)
        if refused == "duplicate":
            _resolve(
                future,
                error_result(
                    job.job_id,
                    "internal-error",
                    f"A job with id {job.job_id!r} is already in flight.",
                    "Use a fresh call id.",
                ),
            )
        elif refused == "overloaded":
            _resolve(
                future,
                error_result(
                    job.job_id,
                    "overloaded",
                    "Too many calls are waiting for a worker process.",
                    "Retry the call in a moment.",
                ),
            )

    def _status(self) -> dict[str, Any]:
        status = self.state.status()
        status["endpoint"] = self.endpoint
        status["running_pool"] = True
        return status

    def _cancel(self, job_id: str) -> None:
        job, worker = self.state.cancel(job_id)
        if job is None:
            return
        _resolve(
            job.future,
            error_result(
                job_id,
                "cancelled",
                "The call was cancelled before it finished.",
                "Nothing more will happen for this call.",
            ),
        )
        if worker is not None:
            log.info("cancel of %s: killing worker pid %d", job_id, worker.pid)
            self._kill(worker.identity)

    def _receive(self, budget: int) -> None:
        """Handle at most ``budget`` waiting frames; the poller reports the rest next turn."""
        router = self._router
        workers = self.state.workers
        size_left = BYTES_PER_TURN
        for _ in range(budget):
            # Asked first: a recv on an empty socket raises, and an exception costs more.
            if not int(router.get(_EVENTS)) & _POLLIN:
                return
            try:
                identity = router.recv(_NOBLOCK)
            except zmq.Again:
                return
            frames = [identity]
            while router.get(_RCVMORE):
                frames.append(router.recv(_NOBLOCK))
                size_left -= len(frames[-1])
            # Strangers first and cheaply: no decoding for a peer that is not
            # one of our live workers.
            control = identity.endswith(CONTROL)
            if (identity[: -len(CONTROL)] if control else identity) not in workers:
                self.drops.drop(identity, "not a live worker of this broker")
            else:
                try:
                    self.on_frames(frames, control, time.monotonic())
                except Exception as exc:  # a last line: no frame may end the broker thread
                    if self.drops.total < self.drops.burst:
                        log.exception("handling a frame from %r failed", identity[:40])
                    self.drops.drop(identity, f"handling failed ({type(exc).__name__})")
            if size_left <= 0:
                return

    def on_frames(self, frames: list[bytes], control: bool, now: float) -> None:
        """One message from a live worker's job (or ``control``) socket."""
        identity = frames[0]
        if len(frames) != 2:
            self.drops.drop(identity, f"{len(frames) - 1} payload frames, expected 1")
            return
        try:
            msg = decode_message(frames[1])
        except msgspec.DecodeError as exc:
            self.drops.drop(identity, f"undecodable ({exc})")
            return
        if control:
            if not isinstance(msg, Heartbeat):
                self.drops.drop(identity, f"unexpected {type(msg).__name__} on a control socket")
            elif not self.state.heard(identity[: -len(CONTROL)], now):
                self.drops.drop(identity, "heartbeat from an unknown worker")
        elif isinstance(msg, WorkerResult):
            job = self.state.on_result(identity, msg.job_id)
            if job is None:
                self.drops.drop(identity, f"result for a job it does not run ({msg.job_id!r})")
                return
            self.state.heard(identity, now)
            # Answered at the end of this turn, once the next jobs are on their way: the
            # answer wakes its caller, which then wants the GIL this thread holds.
            self._answers.append((job.future, msg))
        elif isinstance(msg, WorkerReady):
            if not self.state.on_ready(identity, msg.pid, now, msg.proof):
                self.drops.drop(
                    identity, f"ready from an unexpected worker or without proof (pid {msg.pid})"
                )
                # A process that holds a starting worker's identity without its
                # secret keeps the real one out: give the slot a fresh identity.
                worker = self.state.workers.get(identity)
                if worker is not None and worker.state == "starting":
                    self._kill(identity)
        else:
            self.drops.drop(identity, f"unexpected {type(msg).__name__}")

    def _dispatch(self) -> None:
        router = self._router
        for job, worker in self.state.assignments():
            try:
                router.send(worker.identity, _NOBLOCK | _SNDMORE)
                router.send(job.frame, _NOBLOCK)
            except zmq.ZMQError as exc:
                log.error("cannot reach worker pid %d (%s); replacing it", worker.pid, exc)
                self.state.requeue(job, worker)
                self._kill(worker.identity)

    def _beat(self) -> None:
        frame = encode(Heartbeat())
        for worker in list(self.state.workers.values()):
            try:
                self._router.send_multipart([worker.identity + CONTROL, frame], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # not connected yet, or gone: its pidfd or its silence will tell

    def _expire(self, now: float) -> None:
        expired = self.state.expire(now)
        for job in expired.queued:
            _resolve(job.future, self._timeout(job, "no worker took it in time"))
        for job, worker in expired.running:
            log.warning(
                "job %s timed out in worker pid %d; replacing it", job.job.job_id, worker.pid
            )
            _resolve(job.future, self._timeout(job, "it ran past its timeout"))
            self._kill(worker.identity)
        for worker, running in expired.hung:
            log.error(
                "worker pid %d sent no heartbeat for %.2f s; killing and replacing it",
                worker.pid,
                now - worker.last_seen,
            )
            if running is not None:
                _resolve(running.future, self._timeout(running, "its worker stopped responding"))
            self._kill(worker.identity)

    @staticmethod
    def _timeout(job: JobRecord, why: str) -> WorkerResult:
        return error_result(
            job.job.job_id,
            "tool-timeout",
            f"The call did not finish: {why}.",
            "Try a smaller request, or try again later.",
        )

    def _kill(self, identity: bytes) -> None:
        self.state.remove_worker(identity, time.monotonic())
        for proc in self._procs.values():
            if proc.identity == identity:
                proc.kill()

    def _reap(self, pidfd: Any) -> None:
        proc = self._procs.pop(pidfd, None)
        if proc is None:
            return
        self.poller.unregister(pidfd)
        code = proc.reap()
        job = self.state.remove_worker(proc.identity, time.monotonic())
        if job is not None:
            log.error(
                "worker pid %d died (exit %d) running %s", proc.popen.pid, code, job.job.job_id
            )
            _resolve(job.future, from_tool_result(job.job.job_id, FAULTS.worker_crashed()))
        else:
            log.info("worker pid %d exited with %d", proc.popen.pid, code)
        self._spawn_due(time.monotonic())

    def _spawn_due(self, now: float) -> None:
        for slot in self.state.slots_to_spawn(now):
            self._spawn(slot, now)

    def _spawn(self, slot: int, now: float) -> None:
        identity, secret = new_credentials(slot)
        argv = [
            sys.executable,
            "-m",
            "chalie.workers.worker_process",
            "--endpoint",
            self.endpoint,
            "--heartbeat",
            repr(self.heartbeat),
            "--broker-timeout",
            repr(self.broker_timeout),
            "--max-frame",
            str(self.max_frame),
        ]
        env = dict(os.environ)
        # The worker resolves import references exactly as this process does.
        paths = [os.getcwd() if p == "" else p for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if os.path.isdir(p))
        try:
            # Its own process group: a Ctrl-C at the daemon's terminal (SIGINT to the
            # foreground group) reaches the daemon alone, which stops its workers itself.
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                env=env,
                close_fds=True,
                process_group=0,
            )
        except OSError as exc:
            log.error("cannot start a worker process: %s", exc)
            self.state.add_worker(identity.encode(), slot, -1, now, secret=b"")
            self.state.remove_worker(identity.encode(), now)
            return
        stdin = popen.stdin
        assert stdin is not None  # stdin=PIPE
        try:
            # Far below a pipe's capacity: the write cannot block.
            stdin.write(encode_credentials(identity, secret))
            stdin.close()
        except OSError as exc:
            log.error("cannot hand worker pid %d its credentials: %s", popen.pid, exc)
        proc = _Process(popen, identity.encode())
        self._procs[proc.pidfd] = proc
        self.poller.register(proc.pidfd, zmq.POLLIN)
        self.state.add_worker(identity.encode(), slot, popen.pid, now, secret=secret)
        log.info("started worker pid %d for slot %d", popen.pid, slot)

    def _shutdown(self) -> None:
        """Stop every worker, reap it, fail what is open, release the socket (once)."""
        if self.finished.is_set():
            return
        with self._lock:
            self._closed = True
            leftover = list(self._commands)
            self._commands.clear()
        for command in leftover:
            if command[0] == "submit":
                _resolve(command[3], _stopped(command[1].job_id))
            elif command[0] == "status":
                command[1].set_result(dict(_NOT_RUNNING))
        self._answer()  # results received in the turn that ended the loop
        for job in self.state.drain():
            _resolve(job.future, _stopped(job.job.job_id))
        bye = encode(WorkerShutdown())
        for worker in list(self.state.workers.values()):
            try:
                self._router.send_multipart([worker.identity + CONTROL, bye], zmq.NOBLOCK)
            except zmq.ZMQError:
                self._kill(worker.identity)  # not connected yet: it cannot hear a goodbye
        procs = list(self._procs.values())
        deadline = time.monotonic() + SHUTDOWN_GRACE
        pending = {p.pidfd: p for p in procs}
        while pending and time.monotonic() < deadline:
            ready, _, _ = select.select(
                list(pending), [], [], max(0.0, deadline - time.monotonic())
            )
            for fd in ready:
                pending.pop(fd, None)
        for proc in pending.values():
            log.warning("worker pid %d did not exit in time; killing it", proc.popen.pid)
            proc.kill()
        for proc in procs:
            proc.reap()
        self._procs.clear()
        self._router.close(linger=0)
        self._ctx.term()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        self.finished.set()


class WorkerPoolHandle:
    """The thread-safe front of the pool; it outlives pool restarts.

    ``submit`` never raises: its future resolves to a WorkerResult in every
    case. The job's own ``deadline`` field is not used; the ``timeout`` given
    to ``submit`` (seconds, counted from submission) bounds the call.
    """

    def __init__(self) -> None:
        self._broker: Broker | None = None
        self._lock = threading.Lock()

    def _bind(self, broker: Broker) -> None:
        with self._lock:
            self._broker = broker

    def _unbind(self, broker: Broker) -> None:
        with self._lock:
            if self._broker is broker:
                self._broker = None

    def submit(
        self,
        job: WorkerJob,
        *,
        timeout: float,
        on_done: Callable[[WorkerFuture], object] | None = None,
    ) -> WorkerFuture:
        """Queue ``job``; ``on_done(future)`` is registered before the broker can answer."""
        future: WorkerFuture = Reply()
        if on_done is not None:
            future.add_done_callback(on_done)
        if not isinstance(job, WorkerJob):
            _resolve(
                future,
                error_result(
                    str(getattr(job, "job_id", "")),
                    "internal-error",
                    f"A worker job must be a WorkerJob, not {type(job).__name__}.",
                ),
            )
            return future
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            _resolve(
                future,
                error_result(
                    job.job_id,
                    "internal-error",
                    f"A worker job needs a positive timeout, not {timeout!r}.",
                ),
            )
            return future
        broker = self._broker
        if broker is None:
            _resolve(future, _stopped(job.job_id))
        else:
            broker.submit(job, float(timeout), future)
        return future

    def cancel(self, job_id: str) -> None:
        """Withdraw a call: it resolves as cancelled and its worker is killed and replaced."""
        broker = self._broker
        if broker is not None:
            broker.cancel(job_id)

    def status(self) -> dict[str, Any]:
        """Workers (slot, pid, state, jobs done, restarts), pending and running counts."""
        broker = self._broker
        if broker is None:
            return dict(_NOT_RUNNING)
        try:
            return broker.query()
        except concurrent.futures.TimeoutError:
            return {**_NOT_RUNNING, "running_pool": True, "error": "the broker did not answer"}


class WorkerPoolActor(SupervisedActor):
    """Supervised owner of the broker thread and its worker processes.

    ``WorkerPoolActor.start(home, *, workers=2, handle=None, **tuning)``. Besides
    the ``workers`` that serve calls, the pool keeps ``spares`` (default 1)
    started and ready, so a dead worker's slot is taken over at once instead
    of after an interpreter start-up. The other tuning keywords (heartbeat,
    liveness, startup_grace, broker_timeout, max_frame, max_pending) exist
    for tests and benchmarks.
    """

    def __init__(
        self,
        home: Path,
        *,
        workers: int = 2,
        handle: WorkerPoolHandle | None = None,
        **tuning: Any,
    ) -> None:
        super().__init__()
        _check_workers(workers)
        self.home = Path(home)
        self.workers = workers
        self.handle = handle if handle is not None else WorkerPoolHandle()
        # Built and bound here, in the starting thread, so a job submitted right
        # after start() waits in the broker's queue instead of being refused.
        self._broker: Broker | None = Broker(self.home, workers, **tuning)
        self.handle._bind(self._broker)

    def on_start(self) -> None:
        if self._broker is not None:
            self.spawn_thread(self._broker.run, "worker-broker")

    def on_end(self) -> None:
        self._close()

    def _close(self) -> None:
        broker, self._broker = self._broker, None
        if broker is not None:
            self.handle._unbind(broker)
            broker.close()

    def status(self) -> dict[str, Any]:
        return self.handle.status()


class HostedPool:
    """The worker pool run on its host actor's thread: no broker thread of its own.

    The dispatcher hosts it (``DispatcherActor(..., pool=HostedPool(...))``):
    its inbox waits on the broker's socket and pidfds beside its mailbox
    (:meth:`actors.timers.TimerInbox.watch`), a job the dispatcher submits is
    sent to a worker before the dispatcher's handler returns, and a worker's
    result is read, turned into the call's result and handled on the same
    thread. That removes two thread hand-offs from every worker call (the
    dispatcher waking the broker thread, and the broker thread waking the
    dispatcher); ``tools/bench/bench_dispatch.py`` measures both ways.

    Built in the host's constructor, begun in its ``on_start`` and stopped in its
    ``on_end``, all on the host's thread. Other threads use :attr:`handle` as
    with :class:`WorkerPoolActor` (their commands wake the host). Keywords as for
    :class:`WorkerPoolActor`.
    """

    def __init__(
        self,
        home: Path,
        *,
        workers: int = 2,
        handle: WorkerPoolHandle | None = None,
        **tuning: Any,
    ) -> None:
        _check_workers(workers)
        self.home = Path(home)
        self.workers = workers
        self.tuning = tuning
        self.handle = handle if handle is not None else WorkerPoolHandle()
        self._broker: Broker | None = None
        self._inbox: TimerInbox | None = None  # the host's, while it watches the broker

    def begin(self, inbox: TimerInbox) -> None:
        """Bind, start the workers and have ``inbox`` wait on the broker (host's thread)."""
        broker = Broker(self.home, self.workers, **self.tuning)
        broker.begin()
        self._broker, self._inbox = broker, inbox
        inbox.watch(broker.poller, broker.wait_ms)
        self.handle._bind(broker)

    def on_events(self, events: list[tuple[Any, int]]) -> None:
        """The inbox's :class:`~actors.timers.Ready`: one turn of the broker."""
        broker = self._broker
        if broker is not None and not broker.on_events(events):
            self.end()

    def status(self) -> dict[str, Any]:
        return self.handle.status()

    def end(self) -> None:
        """Stop the workers and release the socket (host's thread; safe to repeat); the
        host's inbox stops watching the broker, however the end came."""
        broker, self._broker = self._broker, None
        inbox, self._inbox = self._inbox, None
        if inbox is not None:
            inbox.unwatch()
        if broker is None:
            return
        self.handle._unbind(broker)
        broker.close()

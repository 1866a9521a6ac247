"""The ability worker process: ``python -m chalie.workers.worker_process --endpoint ipc://...``.

Lifecycle, in order:

0. The worker reads its identity and a secret from its stdin, a pipe only
   the broker that spawned it holds (never its command line, which any local
   process can read in /proc); its WorkerReady proves the secret with an HMAC.
1. Two DEALERs connect to the broker, each with this incarnation's unique
   identity: the runner thread's job socket (``ID``), which sends WorkerReady,
   and the main thread's control socket (``ID.c``).
2. The runner thread receives a job, runs it and sends the result on its own
   socket; meanwhile the main thread sends a Heartbeat every interval whether
   or not a job is running, so a long call is not mistaken for a hang.
3. Each job loads its ability by import reference (never pickled code),
   builds a fresh instance with the turn context, coerces the parameters and
   runs it through ``chalie.calls.invoke.invoke``: every outcome is a WorkerResult.
4. The worker exits on WorkerShutdown, on a WorkerCancel for its running job,
   when its parent process is gone, or when the broker has been silent for
   ``--broker-timeout`` seconds: a worker never outlives its daemon.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Final

import msgspec
import zmq

from chalie.ability import Ability
from chalie.calls.invoke import coerce_params, invoke
from chalie.calls.registry import load_ref
from chalie.wire.frames import DropLog, check_sendable, decode_message
from chalie.wire.messages import (
    Heartbeat,
    WorkerCancel,
    WorkerJob,
    WorkerReady,
    WorkerResult,
    WorkerShutdown,
    encode,
)
from chalie.workers.broker_state import (
    BROKER_TIMEOUT,
    HEARTBEAT_INTERVAL,
    MAX_FRAME,
    error_result,
    from_tool_result,
    read_credentials,
    worker_proof,
)

log = logging.getLogger("chalie.worker")

# Room left in a frame for the envelope fields around a result body.
FRAME_MARGIN: Final = 4096


# The classes this worker has loaded, by reference: a drop-in file's reference costs a
# path hash and a module lookup each time it is resolved, and a worker resolves few.
_LOADED: dict[str, type[Ability]] = {}
MAX_LOADED: Final = 1024


def _load(ref: str) -> type[Ability]:
    cls = _LOADED.get(ref)
    if cls is None:
        cls = load_ref(ref)
        if len(_LOADED) >= MAX_LOADED:
            _LOADED.clear()
        _LOADED[ref] = cls
    return cls


def run_job(job: WorkerJob) -> WorkerResult:
    """Load, instantiate and run one ability; never raises."""
    try:
        cls = _load(job.ability)
    except (ImportError, AttributeError, FileNotFoundError) as exc:
        log.warning("cannot load ability %r: %s", job.ability, exc)
        return error_result(
            job.job_id,
            "unknown-tool",
            f"The ability {job.ability!r} could not be loaded in the worker.",
            "The tool is not available in a worker process; do not retry it.",
        )
    except Exception as exc:
        log.exception("loading ability %r failed", job.ability)
        return error_result(
            job.job_id,
            "internal-error",
            f"Loading {job.ability!r} failed with {type(exc).__name__}.",
            "This is a fault in the tool's module; details are in the worker log.",
        )
    try:
        params = coerce_params(cls, job.params)
    except msgspec.ValidationError as exc:
        return error_result(
            job.job_id,
            "invalid-param",
            f"Invalid parameters for {cls.name}: {exc}.",
            "Fix the named parameter and call again.",
        )
    try:
        instance = cls(job.context)
    except Exception as exc:
        log.exception("constructing %s failed", cls.name)
        return error_result(
            job.job_id,
            "internal-error",
            f"{cls.name} could not be set up ({type(exc).__name__}).",
            "This is a fault in the tool; details are in the worker log.",
        )
    return from_tool_result(job.job_id, invoke(instance, params))


def encode_result(result: WorkerResult, max_frame: int) -> bytes:
    """The frame for a result; one that cannot be sent becomes an internal-error result."""
    try:
        data = encode(result)
        too_deep = check_sendable(data)
        if too_deep:
            raise ValueError(too_deep)
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
        log.error("result of job %s cannot be encoded: %s", result.job_id, exc)
        return encode(
            error_result(
                result.job_id,
                "internal-error",
                "The tool returned a payload that cannot be sent between processes.",
                "This is a fault in the tool; do not retry the same call.",
            )
        )
    if len(data) > max_frame - FRAME_MARGIN:
        log.error("result of job %s is %d bytes, over the frame limit", result.job_id, len(data))
        return encode(
            error_result(
                result.job_id,
                "internal-error",
                f"The tool's result is too large ({len(data)} bytes).",
                "Ask for a smaller part of the data.",
            )
        )
    return data


def run_frame(frame: bytes, max_frame: int = MAX_FRAME) -> bytes:
    """One job where another engine runs the process (a Ray task): the WorkerJob frame in,
    its WorkerResult frame out, exactly as a worker process answers it; never raises."""
    try:
        job = decode_message(frame)
    except msgspec.DecodeError as exc:
        job = None
        why = f"malformed ({exc})"
    else:
        why = f"a {type(job).__name__}, not a WorkerJob"
    if not isinstance(job, WorkerJob):
        log.error("an engine handed this worker a job it cannot run: %s", why)
        return encode(error_result("", "internal-error", "The worker was sent a malformed job."))
    return encode_result(run_job(job), max_frame)


CONTROL_SUFFIX: Final = ".c"


class Runner(threading.Thread):
    """Owns the job socket: receives a job, runs it, sends its result, in one thread.

    Running the ability here, off the main thread, lets the main thread (which
    owns the control socket) keep heartbeating however long a call takes, and
    a job needs no hand-off between threads on its way in or out.
    """

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        identity: str,
        secret: bytes,
        max_frame: int,
    ) -> None:
        super().__init__(name="ability-runner", daemon=True)
        self.ctx = ctx
        self.endpoint = endpoint
        self.identity = identity
        self.proof = worker_proof(secret, identity, os.getpid())
        self.max_frame = max_frame
        self.current: str | None = None  # read by the heartbeating thread
        self.drops = DropLog(log, "worker job socket")

    def run(self) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.identity.encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_frame)
        sock.connect(self.endpoint)
        sock.send(encode(WorkerReady(worker_id=self.identity, pid=os.getpid(), proof=self.proof)))

        while True:
            frame = sock.recv()
            try:
                msg = decode_message(frame)
            except msgspec.DecodeError as exc:
                self.drops.drop("broker", f"malformed ({exc})")
                continue
            if not isinstance(msg, WorkerJob):
                self.drops.drop("broker", f"unexpected {type(msg).__name__} on the job socket")
                continue
            self.current = msg.job_id
            try:
                result = run_job(msg)
            except BaseException as exc:  # run_job never raises; this is a last line
                log.exception("job %s broke the runner", msg.job_id)
                result = error_result(
                    msg.job_id, "internal-error", f"The worker failed: {type(exc).__name__}."
                )
            self.current = None
            sock.send(encode_result(result, self.max_frame))


def serve(
    endpoint: str,
    identity: str,
    secret: bytes,
    *,
    heartbeat: float = HEARTBEAT_INTERVAL,
    broker_timeout: float = BROKER_TIMEOUT,
    max_frame: int = MAX_FRAME,
) -> int:
    """The worker's main loop (the control socket); returns the process exit status.

    Jobs arrive on the runner's socket (identity ``identity``); heartbeats,
    cancels and shutdowns on this one (identity ``identity + ".c"``).
    """
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    control = ctx.socket(zmq.DEALER)
    control.setsockopt(zmq.IDENTITY, (identity + CONTROL_SUFFIX).encode())
    control.setsockopt(zmq.LINGER, 0)
    control.setsockopt(zmq.MAXMSGSIZE, 64 * 1024)
    control.connect(endpoint)
    runner = Runner(ctx, endpoint, identity, secret, max_frame)
    drops = DropLog(log, "worker control socket")
    runner.start()

    parent = os.getppid()
    beat = encode(Heartbeat(worker_id=identity, busy=0))
    beat_busy = encode(Heartbeat(worker_id=identity, busy=1))
    control.send(beat)
    heard = time.monotonic()
    next_beat = heard + heartbeat

    while True:
        timeout_ms = max(0, math.ceil((next_beat - time.monotonic()) * 1000))
        if control.poll(timeout_ms, zmq.POLLIN):
            while True:
                try:
                    frame = control.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                heard = time.monotonic()
                try:
                    msg = decode_message(frame)
                except msgspec.DecodeError as exc:
                    drops.drop("broker", f"malformed ({exc})")
                    continue
                if isinstance(msg, WorkerShutdown):
                    return 0
                if isinstance(msg, WorkerCancel):
                    if msg.job_id == runner.current:
                        # A Python thread cannot be stopped; the process ends instead.
                        return 3
                elif not isinstance(msg, Heartbeat):
                    drops.drop("broker", f"unexpected {type(msg).__name__}")
        now = time.monotonic()
        if now >= next_beat:
            control.send(beat_busy if runner.current else beat)
            next_beat = now + heartbeat
            if now - heard > broker_timeout:
                log.warning("broker silent for %.1f s; worker %s exits", now - heard, identity)
                return 2
            if os.getppid() != parent:
                log.warning("parent process gone; worker %s exits", identity)
                return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chalie.workers.worker_process")
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--heartbeat", type=float, default=HEARTBEAT_INTERVAL)
    parser.add_argument("--broker-timeout", type=float, default=BROKER_TIMEOUT)
    parser.add_argument("--max-frame", type=int, default=MAX_FRAME)
    args = parser.parse_args(argv)
    # The broker ends a worker (its stop message, or SIGKILL); an interrupt is the
    # terminal's, meant for the daemon, and must not print a traceback here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s %(levelname)s worker[{os.getpid()}] %(name)s: %(message)s",
    )
    try:
        identity, secret = read_credentials(sys.stdin.buffer)
    except (ValueError, OSError) as exc:
        log.error("no usable credentials on stdin (%s); a worker is started by its broker", exc)
        raise SystemExit(2) from None
    status = serve(
        args.endpoint,
        identity,
        secret,
        heartbeat=args.heartbeat,
        broker_timeout=args.broker_timeout,
        max_frame=args.max_frame,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    # The runner thread may be stuck inside an ability: end without joining it.
    os._exit(status)


if __name__ == "__main__":
    main()

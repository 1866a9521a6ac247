"""The worker broker's bookkeeping, with no sockets, threads or processes.

``BrokerState`` holds what the broker knows about its worker processes and jobs
and decides what happens next; ``actors.workers.worker_pool`` does the I/O. Every
decision takes ``now`` as an argument, so timeouts, hang detection and
crash-loop backoff are tested with an injected clock.

Lifecycle of a worker slot:

1. ``add_worker``: a process was spawned for the slot (state ``starting``).
2. ``on_ready``: it said WorkerReady from the expected identity and pid, with
   the proof that it holds the secret it was given on its stdin (``idle``).
   Until then it is sent no job.
3. ``assignments``: a queued job goes to an idle worker (``busy``).
4. ``on_result``: the result for that job came back (``idle`` again).
5. ``remove_worker``: the process exited or is being killed; the job it was
   running, if any, is returned so the broker can fail it. A ready spare, if
   there is one, takes over the slot at once; the empty slot is spawned again
   at once, or after a backoff when its worker never became ready.

Also here: where the broker's ipc socket lives, how a worker learns its
identity and secret (a pipe on its stdin, never its command line) and proves
them, and mapping between a ``WorkerResult`` and the ``ToolResult`` the rest
of the runtime uses.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, Literal

from chalie.process.supervision import backoff_delay
from chalie.result import ToolResult
from chalie.wire.messages import WorkerJob, WorkerResult

# libzmq's ipc endpoints are Unix socket paths: sun_path holds 107 characters.
IPC_PATH_MAX: Final = 107
HEARTBEAT_INTERVAL: Final = 0.2
# Missed heartbeat intervals before a worker running a call is declared hung.
LIVENESS: Final = 3
# An idle worker's late heartbeat on a loaded host is not a death (a process that died is
# found by its pidfd at once): an idle one is declared hung only after this much silence.
IDLE_SILENCE: Final = 30.0
# A spawned interpreter gets this long to say WorkerReady.
STARTUP_GRACE: Final = 15.0
# A worker exits when it has heard nothing from its broker for this long.
BROKER_TIMEOUT: Final = 3.0
MAX_FRAME: Final = 16 * 1024 * 1024
MAX_PENDING: Final = 10_000
SPAWN_BACKOFF_BASE: Final = 0.05
SPAWN_BACKOFF_CAP: Final = 2.0
# Bytes of randomness in a worker's identity and in its secret.
IDENTITY_BYTES: Final = 16
SECRET_BYTES: Final = 32
# The most a worker reads from its stdin for its credentials.
CREDENTIALS_MAX: Final = 1024

WorkerStateName = Literal["starting", "idle", "busy"]


def broker_endpoint(home: Path) -> tuple[str, Path | None]:
    """The broker's ipc endpoint inside ``home`` (a 0700 directory), and a temp dir to remove.

    When the socket path would exceed the ipc limit, the socket goes into a
    fresh 0700 directory under the system temp dir instead; the caller removes
    that directory (the second value) when it stops.
    """
    home = Path(home)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock_dir = home / "workers"
    sock_dir.mkdir(mode=0o700, exist_ok=True)
    # mkdir's mode is filtered by the umask and ignored for an existing directory.
    os.chmod(sock_dir, 0o700)
    path = sock_dir / "broker.sock"
    if len(str(path)) <= IPC_PATH_MAX:
        return f"ipc://{path}", None
    short = Path(tempfile.mkdtemp(prefix="chalie-"))  # mkdtemp makes it 0700
    return f"ipc://{short / 'broker.sock'}", short


def new_credentials(slot: int) -> tuple[str, bytes]:
    """A fresh (identity, secret) for a worker about to be spawned into ``slot``."""
    return f"w{slot}-{secrets.token_hex(IDENTITY_BYTES)}", secrets.token_bytes(SECRET_BYTES)


def encode_credentials(identity: str, secret: bytes) -> bytes:
    """What the broker writes on a new worker's stdin."""
    return f"{identity}\n{secret.hex()}\n".encode()


def read_credentials(stream: IO[bytes]) -> tuple[str, bytes]:
    """The (identity, secret) a worker reads from its stdin; ValueError when malformed."""
    lines = stream.read(CREDENTIALS_MAX).decode("ascii", "strict").split("\n")
    if len(lines) < 2 or not lines[0] or not lines[1]:
        raise ValueError("expected an identity line and a secret line on stdin")
    identity, secret = lines[0], bytes.fromhex(lines[1])
    if len(identity) > 200 or not identity.isprintable() or len(secret) < 16:
        raise ValueError("malformed worker credentials on stdin")
    return identity, secret


def worker_proof(secret: bytes, identity: str, pid: int) -> str:
    """What a worker sends in WorkerReady to show it holds ``secret`` (the secret never travels)."""
    return hmac.new(secret, f"{identity}:{pid}".encode(), hashlib.sha256).hexdigest()


def error_result(job_id: str, code: str, message: str, hint: str = "") -> WorkerResult:
    """A WorkerResult carrying an error, as the broker and the worker both build them."""
    return WorkerResult(job_id=job_id, status="error", body=message, code=code, hint=hint or None)


def from_tool_result(job_id: str, result: ToolResult) -> WorkerResult:
    return WorkerResult(
        job_id=job_id,
        status=result.status,
        body=result.body,
        rich=dict(result.rich) if result.rich is not None else None,
        meta=dict(result.meta),
        code=result.code,
        hint=result.hint,
        valid_values=list(result.valid_values) if result.valid_values is not None else None,
    )


def to_tool_result(result: WorkerResult) -> ToolResult:
    """The ToolResult a WorkerResult stands for; a malformed one becomes internal-error."""
    try:
        if result.status == "success":
            return ToolResult.success(result.body, rich=result.rich, meta=result.meta)
        return ToolResult.error(
            result.code or "internal-error",
            result.body or "The worker reported an error without a message.",
            hint=result.hint or "",
            valid_values=result.valid_values,
            meta=result.meta,
        )
    except (TypeError, ValueError) as exc:
        return ToolResult.error(
            "internal-error",
            f"A worker returned a result the runtime could not accept ({exc}).",
            hint="This is a fault in the tool or the runtime; details are in the log.",
        )


@dataclass
class WorkerRecord:
    identity: bytes
    slot: int
    pid: int
    spawned_at: float
    state: WorkerStateName = "starting"
    last_seen: float = 0.0
    job: str | None = None
    jobs_done: int = 0
    secret: bytes = field(default=b"", repr=False)


@dataclass
class JobRecord:
    job: WorkerJob
    deadline: float
    future: Any  # opaque to the book: the broker resolves it
    worker: bytes | None = None
    frame: bytes = b""  # the encoded job, as sent to the worker


@dataclass
class Expired:
    """What one look at the clock found."""

    queued: list[JobRecord] = field(default_factory=list)  # timed out before a worker took them
    running: list[tuple[JobRecord, WorkerRecord]] = field(
        default_factory=list
    )  # timed out in a worker
    hung: list[tuple[WorkerRecord, JobRecord | None]] = field(
        default_factory=list
    )  # stopped heartbeating


@dataclass
class SlotRecord:
    restarts: int = 0
    early_deaths: int = 0  # consecutive workers that died before saying ready
    spawn_at: float | None = None
    spawned_once: bool = False


class BrokerState:
    """Workers, queued jobs and jobs in flight; every method is called from one thread."""

    def __init__(
        self,
        slots: int,
        *,
        spares: int = 0,
        heartbeat: float = HEARTBEAT_INTERVAL,
        liveness: int = LIVENESS,
        startup_grace: float = STARTUP_GRACE,
        max_pending: int = MAX_PENDING,
        idle_silence: float = IDLE_SILENCE,
    ) -> None:
        if slots < 1:
            raise ValueError("a worker pool needs at least one worker")
        if spares < 0:
            raise ValueError("spares must be >= 0")
        # Slots [0, active) serve jobs; the rest hold warm spares, started and
        # ready, that take over a dead worker's slot at once.
        self.active = slots
        self.heartbeat = heartbeat
        self.silence_limit = heartbeat * liveness
        self.idle_silence = max(idle_silence, self.silence_limit)
        self.startup_grace = startup_grace
        self.max_pending = max_pending
        self.slots = [SlotRecord() for _ in range(slots + spares)]
        self.workers: dict[bytes, WorkerRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.pending: deque[str] = deque()
        self.idle: deque[bytes] = deque()
        self.completed = 0

    # -- workers ----------------------------------------------------------------
    def add_worker(
        self, identity: bytes, slot: int, pid: int, now: float, *, secret: bytes
    ) -> WorkerRecord:
        """A process was spawned for ``slot``; ``secret`` is what its Ready must prove."""
        record = WorkerRecord(identity, slot, pid, now, last_seen=now, secret=secret)
        self.workers[identity] = record
        s = self.slots[slot]
        if s.spawned_once:
            s.restarts += 1
        s.spawned_once = True
        s.spawn_at = None
        return record

    def on_ready(self, identity: bytes, pid: int, now: float, proof: str) -> bool:
        """A worker announced itself; False for a stranger or an impostor.

        An impostor has the wrong pid or cannot prove the secret its slot's
        process was given; an empty secret never proves anything.
        """
        record = self.workers.get(identity)
        if record is None or record.state != "starting" or record.pid != pid:
            return False
        expected = worker_proof(record.secret, identity.decode("ascii", "replace"), pid)
        # Bytes: compare_digest refuses str with non-ASCII characters.
        if not record.secret or not hmac.compare_digest(
            expected.encode(), proof.encode("utf-8", "replace")
        ):
            return False
        record.state = "idle"
        record.last_seen = now
        self.slots[record.slot].early_deaths = 0
        if record.slot < self.active:
            self.idle.append(identity)
        else:
            self._fill_empty_active_slot(now)
        return True

    def _fill_empty_active_slot(self, now: float) -> None:
        """Promote a ready spare into an active slot that has no worker."""
        occupied = {w.slot for w in self.workers.values()}
        for slot in range(self.active):
            if slot in occupied:
                continue
            spare = next(
                (w for w in self.workers.values() if w.slot >= self.active and w.state == "idle"),
                None,
            )
            if spare is None:
                return
            self.slots[spare.slot].spawn_at = now
            spare.slot = slot
            self.slots[slot].restarts += 1
            self.slots[slot].spawn_at = None
            self.idle.append(spare.identity)

    def heard(self, identity: bytes, now: float) -> bool:
        record = self.workers.get(identity)
        if record is None:
            return False
        record.last_seen = now
        return True

    def remove_worker(self, identity: bytes, now: float) -> JobRecord | None:
        """Forget a worker (it exited or is being killed); return the job it was running."""
        record = self.workers.pop(identity, None)
        if record is None:
            return None
        slot = self.slots[record.slot]
        if record.state == "starting":
            slot.early_deaths += 1
        slot.spawn_at = now + (
            backoff_delay(slot.early_deaths - 1, base=SPAWN_BACKOFF_BASE, cap=SPAWN_BACKOFF_CAP)
            if slot.early_deaths
            else 0.0
        )
        if record.slot < self.active:
            self._fill_empty_active_slot(now)
        if record.job is None:
            return None
        return self.jobs.pop(record.job, None)

    def slots_to_spawn(self, now: float) -> list[int]:
        occupied = {w.slot for w in self.workers.values()}
        return [
            i
            for i, s in enumerate(self.slots)
            if i not in occupied and (s.spawn_at is None or s.spawn_at <= now)
        ]

    # -- jobs -------------------------------------------------------------------
    def submit(
        self, job: WorkerJob, timeout: float, future: Any, now: float, frame: bytes = b""
    ) -> str | None:
        """Queue a job (``frame`` is its encoding); the error code when refused, else None."""
        if job.job_id in self.jobs:
            return "duplicate"
        if len(self.pending) >= self.max_pending:
            return "overloaded"
        self.jobs[job.job_id] = JobRecord(job, now + timeout, future, frame=frame)
        self.pending.append(job.job_id)
        return None

    def assignments(self) -> list[tuple[JobRecord, WorkerRecord]]:
        """Pair queued jobs with idle workers, oldest first, marking both busy."""
        out: list[tuple[JobRecord, WorkerRecord]] = []
        while self.pending and self.idle:
            identity = self.idle.popleft()
            worker = self.workers.get(identity)
            if worker is None or worker.state != "idle":
                continue
            job = None
            while self.pending and job is None:
                job = self.jobs.get(self.pending.popleft())
            if job is None:
                self.idle.appendleft(identity)
                break
            worker.state = "busy"
            worker.job = job.job.job_id
            job.worker = identity
            out.append((job, worker))
        return out

    def requeue(self, job: JobRecord, worker: WorkerRecord) -> None:
        """A send to the worker failed: the job goes back to the front of the queue."""
        job.worker = None
        worker.job = None
        self.pending.appendleft(job.job.job_id)

    def on_result(self, identity: bytes, job_id: str) -> JobRecord | None:
        """The result of the job this worker runs; None when it does not match (dropped)."""
        worker = self.workers.get(identity)
        if worker is None or worker.state != "busy" or worker.job != job_id:
            return None
        worker.state = "idle"
        worker.job = None
        worker.jobs_done += 1
        self.completed += 1
        self.idle.append(identity)
        return self.jobs.pop(job_id, None)

    def cancel(self, job_id: str) -> tuple[JobRecord | None, WorkerRecord | None]:
        """Withdraw a job: (the job, the worker running it, which must be killed)."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return None, None
        if job.worker is None:
            return job, None  # still queued: its id left in ``pending`` is skipped later
        worker = self.workers.get(job.worker)
        if worker is not None:
            worker.job = None
        return job, worker

    def expire(self, now: float) -> Expired:
        """Jobs past their deadline and workers silent for too long, removed from the book."""
        found = Expired()
        for job_id, job in list(self.jobs.items()):
            if job.deadline > now:
                continue
            del self.jobs[job_id]
            if job.worker is None:
                found.queued.append(job)
            else:
                worker = self.workers.get(job.worker)
                if worker is not None:
                    worker.job = None
                    found.running.append((job, worker))
        for worker in list(self.workers.values()):
            if worker.state == "starting":
                limit = self.startup_grace
            elif worker.job:
                limit = self.silence_limit
            else:
                limit = self.idle_silence
            if now - worker.last_seen > limit:
                running = self.jobs.pop(worker.job, None) if worker.job else None
                worker.job = None
                found.hung.append((worker, running))
        return found

    def drain(self) -> list[JobRecord]:
        """Every job still known, removed: the broker is stopping."""
        jobs = list(self.jobs.values())
        self.jobs.clear()
        self.pending.clear()
        return jobs

    def status(self) -> dict[str, Any]:
        by_slot = {w.slot: w for w in self.workers.values()}
        rows = []
        for i, slot in enumerate(self.slots):
            w = by_slot.get(i)
            rows.append(
                {
                    "slot": i,
                    "pid": w.pid if w else None,
                    "state": w.state if w else "down",
                    "jobs_done": w.jobs_done if w else 0,
                    "restarts": slot.restarts,
                }
            )
        running = sum(1 for j in self.jobs.values() if j.worker is not None)
        return {
            "workers": rows[: self.active],
            "spares": rows[self.active :],
            "pending": len(self.jobs) - running,
            "running": running,
            "completed": self.completed,
        }

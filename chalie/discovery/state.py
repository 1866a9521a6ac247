"""What the discovery index is doing right now, readable from any thread without asking its actor.

The DiscoveryActor writes it (loading, ready, failed, rebuilding with progress);
``chalie status`` and the rebuild command's progress polls read it. A read
never waits behind a build in the actor's mailbox, which is the point: while
a rebuild runs, the actor is busy, but its progress is still visible.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Final, Literal

IndexPhase = Literal["loading", "ready", "failed", "rebuilding"]
RebuildPhase = Literal["running", "done", "failed"]


@dataclass
class RebuildJob:
    """One rebuild: its id, how far it is, and how it ended."""

    job_id: str
    reuse: bool
    phase: RebuildPhase = "running"
    done: int = 0
    total: int = 0
    started: float = field(default_factory=time.time)
    finished: float | None = None
    error: str | None = None
    tools: int = 0
    skills: int = 0

    def view(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "reuse": self.reuse,
            "phase": self.phase,
            "done": self.done,
            "total": self.total,
            "started": self.started,
            "finished": self.finished,
            "error": self.error,
            "tools": self.tools,
            "skills": self.skills,
        }


# Seconds a find is told to wait before retrying while the index is built: the estimate
# from the build's progress, bounded; BUILD_GUESS before any progress is known.
MIN_RETRY_AFTER: Final = 2.0
MAX_RETRY_AFTER: Final = 120.0
BUILD_GUESS: Final = 10.0


class IndexState:
    """Thread-safe: the index phase, its counts, its last error and the current or last rebuild."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phase: IndexPhase = "loading"
        self._error: str | None = None
        self._facts: dict[str, Any] = {}
        self._job: RebuildJob | None = None

    # -- written by the DiscoveryActor -------------------------------------
    def loading(self) -> None:
        with self._lock:
            self._phase = "rebuilding" if self._running() else "loading"

    def ready(self, **facts: Any) -> None:
        with self._lock:
            self._phase, self._error, self._facts = "ready", None, dict(facts)

    def failed(self, error: str) -> None:
        with self._lock:
            self._phase, self._error, self._facts = "failed", error, {}

    def indexing(self, waiting: int) -> None:
        """How many tools wait to be embedded and indexed (added in batches)."""
        with self._lock:
            self._facts["to_index"] = int(waiting)

    def begin_rebuild(self, reuse: bool) -> tuple[RebuildJob, bool]:
        """The job to run (new) or the one already running; the flag says which."""
        with self._lock:
            if self._running():
                assert self._job is not None
                return self._job, False
            self._job = RebuildJob(job_id=uuid.uuid4().hex[:12], reuse=reuse)
            return self._job, True

    def progress(self, job_id: str, done: int, total: int) -> None:
        with self._lock:
            if self._job is not None and self._job.job_id == job_id:
                self._job.done, self._job.total = done, total

    def end_rebuild(self, job_id: str, *, error: str | None = None) -> None:
        with self._lock:
            job = self._job
            if job is None or job.job_id != job_id:
                return
            job.phase = "failed" if error else "done"
            job.error = error
            job.finished = time.time()
            job.tools = int(self._facts.get("tools", 0))
            job.skills = int(self._facts.get("skills", 0))

    def _running(self) -> bool:
        return self._job is not None and self._job.phase == "running"

    # -- read by anyone ----------------------------------------------------
    def building(self) -> tuple[int, int, float] | None:
        """While the index is first built or loaded (nothing can be found yet): (done,
        total, seconds until a retry is likely to find it ready); None otherwise."""
        with self._lock:
            if self._phase != "loading" and not self._running():
                return None
            job = self._job
            done, total = (job.done, job.total) if job is not None else (0, 0)
            started = job.started if job is not None else time.time()
        elapsed = max(0.0, time.time() - started)
        if done and total > done:
            left = elapsed / done * (total - done)
        else:
            left = BUILD_GUESS
        return done, total, min(MAX_RETRY_AFTER, max(MIN_RETRY_AFTER, left))

    def job(self) -> dict[str, Any] | None:
        with self._lock:
            return None if self._job is None else self._job.view()

    def snapshot(self) -> dict[str, Any]:
        """``{"state", "error", facts..., "rebuild": job or None}``, for status and polls."""
        with self._lock:
            phase: IndexPhase = "rebuilding" if self._running() else self._phase
            return {
                "state": phase,
                "error": self._error,
                **self._facts,
                "rebuild": None if self._job is None else self._job.view(),
            }


def describe(state: Any) -> str:
    """``chalie status``'s line for the index (a :meth:`IndexState.snapshot`): its state."""
    if not isinstance(state, dict) or "state" not in state:
        return "discovery index: unknown"
    phase = state["state"]
    if phase == "ready":
        line = (
            f"discovery index: ready  {state.get('tools', 0)} tools  {state.get('skills', 0)} "
            f"skills  model {state.get('model_id')}  ceiling {state.get('ceiling')}"
        )
    elif phase == "failed":
        line = (
            f"discovery index: FAILED ({state.get('error')}); "
            "every find answers discovery-index-error"
        )
    else:
        line = f"discovery index: {phase}"
    if state.get("to_index"):
        line += f"  ({state['to_index']} tools being indexed)"
    job = state.get("rebuild")
    if isinstance(job, dict) and job.get("phase") == "running":
        line += f"  (rebuild {job.get('done', 0)}/{job.get('total', 0)})"
    elif isinstance(job, dict) and job.get("phase") == "failed":
        line += f"  (last rebuild failed: {job.get('error')})"
    return line

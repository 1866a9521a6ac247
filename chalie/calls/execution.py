"""The Executor seam: how the dispatcher hands one allowed call to whatever runs it.

An executor runs a :class:`Job` and reports its :class:`~chalie.result.ToolResult`
through ``done``, exactly once, from any thread. The dispatcher chooses the
executor by the ability's declared ``isolation`` through one registration
table (``actors/calls/executors/__init__.py``), turns ``done`` into a message to
itself, and owns everything else: the deadline, the trail, the envelope.

The contract an executor keeps:

1. ``start(job, done)`` never blocks and never raises; a failure to start is
   reported through ``done`` as an error result. An executor that ends the job
   inside ``start`` (the immediate executor: abilities that compute and return
   at once, on the dispatcher's thread) returns its result instead, and then
   never calls ``done``; every other ``start`` returns None.
2. ``done`` is called exactly once per started job, also after ``cancel``
   (with whatever result the executor has then, e.g. ``cancelled``); the
   dispatcher ignores a result for a call it has already ended.
3. ``cancel(job_id)`` is best effort and idempotent: an unknown or finished
   job is no error.
4. ``close()`` releases the executor's threads and connections; jobs still
   running may be abandoned (their calls were ended by the dispatcher first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from chalie.ability import Ability
from chalie.calls.faults import FAULTS  # re-exported: executors report runtime faults with it
from chalie.calls.registry import Entry
from chalie.result import ToolResult
from chalie.wire.messages import TurnContext

__all__ = ["FAULTS", "Done", "Executor", "Job"]


class Job(msgspec.Struct, frozen=True):
    """One allowed call, ready to run (a Struct: built on every call, ~10x cheaper)."""

    job_id: str  # unique per call
    call_id: str
    entry: Entry  # registry entry (cls, source, ref)
    instance: Ability  # fresh per-call instance (the inline executor runs it)
    # Validated, defaults applied, framework fields removed: exactly what the gate saw.
    params: dict[str, Any]
    value: Any  # what run() receives (the Params struct or the dict)
    context: TurnContext
    timeout: float

    @property
    def tool(self) -> str:
        return self.entry.name


Done = Callable[[ToolResult], None]


class Executor(Protocol):
    """A way to run tools: inline lanes, worker processes, MCP proxies."""

    def start(self, job: Job, done: Done) -> ToolResult | None:
        """Run the job; call ``done`` once with its result, or return the result when the job
        ended inside ``start``. Never blocks, never raises."""

    def cancel(self, job_id: str) -> None:
        """Stop the job if it is still queued or running (best effort)."""

    def close(self) -> None:
        """Release the executor's resources."""

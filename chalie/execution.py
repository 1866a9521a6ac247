"""The Executor seam: how the dispatcher hands one allowed call to whatever runs it.

An executor runs a :class:`Job` and reports its :class:`~chalie.result.ToolResult`
through ``done``, exactly once, from any thread. The dispatcher chooses the
executor by the ability's declared ``isolation`` through one registration
table (``actors/executors/__init__.py``), turns ``done`` into a message to
itself, and owns everything else: the deadline, the trail, the envelope.

The contract an executor keeps:

1. ``start(job, done)`` never blocks and never raises; a failure to start is
   reported through ``done`` as an error result.
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
from dataclasses import dataclass
from typing import Any, Final, Protocol

from chalie.ability import Ability
from chalie.messages import TurnContext
from chalie.registry import Entry
from chalie.result import ToolResult

__all__ = ["FAULTS", "Done", "Executor", "Job"]


@dataclass(frozen=True)
class Job:
    """One allowed call, ready to run."""

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

    def start(self, job: Job, done: Done) -> None:
        """Run the job; call ``done`` once with its result. Never blocks, never raises."""

    def cancel(self, job_id: str) -> None:
        """Stop the job if it is still queued or running (best effort)."""

    def close(self) -> None:
        """Release the executor's resources."""


class _Faults:
    """The runtime-fault results, each text written once (dispatcher and executors use them)."""

    RUNTIME_HINT: Final = "this is a fault in the runtime, not in your call; try again."

    def dispatcher_restarting(self) -> ToolResult:
        return ToolResult.error(
            "internal-error",
            "The dispatcher is restarting; the call did not run.",
            hint="it is safe to retry the call.",
        )

    def dispatch_failed(self) -> ToolResult:
        return ToolResult.error(
            "internal-error",
            "The runtime failed while dispatching the call.",
            hint=self.RUNTIME_HINT,
        )

    def start_failed(self) -> ToolResult:
        return ToolResult.error(
            "internal-error",
            "The runtime could not start the call.",
            hint=self.RUNTIME_HINT,
        )

    def stopped(self, reason: str) -> ToolResult:
        return ToolResult.error(
            "internal-error",
            f"{reason[:1].upper()}{reason[1:]}.",
            hint="the call did not complete; it is safe to retry it.",
        )

    def no_executor(self, tool: str, isolation: str) -> ToolResult:
        return ToolResult.error(
            "internal-error",
            f"{tool} runs with isolation {isolation!r} and no such executor is available.",
            hint="this is a fault in the runtime's set-up, not in your call.",
        )

    def executor_failed(self, tool: str, why: str) -> ToolResult:
        return ToolResult.error(
            "internal-error",
            f"The runtime failed running {tool} ({why[:100]}).",
            hint=self.RUNTIME_HINT,
        )

    def overloaded(self, tool: str) -> ToolResult:
        return ToolResult.error(
            "overloaded",
            f"Too many calls to {tool} are waiting.",
            hint="wait for earlier calls to finish before calling it again.",
        )

    def timeout(self, tool: str, seconds: float) -> ToolResult:
        return ToolResult.error(
            "tool-timeout",
            f"{tool} did not finish within {seconds:g} s.",
            hint="try a smaller request, or do without this tool.",
        )

    def cancelled(self, tool: str) -> ToolResult:
        return ToolResult.error(
            "cancelled",
            f"The call to {tool} was cancelled.",
            hint="the turn was cancelled; do not continue with this call's result.",
        )

    def construct_failed(self, tool: str, exc: BaseException) -> ToolResult:
        return ToolResult.error(
            "unhandled-exception",
            f"{tool} failed to start ({type(exc).__name__}).",
            hint="This is a fault in the tool, not in your call; try another way or report it.",
        )

    def render_failed(self, tool: str) -> ToolResult:
        return ToolResult.error(
            "internal-error",
            f"The result of {tool} could not be rendered.",
            hint="this is a fault in the tool or the runtime; try another way.",
        )


FAULTS: Final = _Faults()

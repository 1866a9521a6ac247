"""The runtime-fault results: every text the runtime says about its own failures, written once.

The dispatcher, the executors and the supervisor build their error results
here, so a fault reads the same wherever it happens and the codes stay the
ones the error table lists.
"""

from __future__ import annotations

from typing import Final

from chalie.result import ToolResult

__all__ = ["FAULTS"]


class _Faults:
    """The runtime-fault results, each text written once (dispatcher and executors use them)."""

    RUNTIME_HINT: Final = "this is a fault in the runtime, not in your call; try again."

    def component_restarted(self, child_id: str) -> ToolResult:
        return ToolResult.error(
            "internal-error",
            f"The runtime component {child_id!r} restarted during the call.",
            hint="The call did not complete; it is safe to retry it.",
        )

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

    def worker_crashed(self) -> ToolResult:
        return ToolResult.error(
            "worker-crashed",
            "The worker process running the call died.",
            hint="The call may not have completed; retry it if it is safe to.",
        )

    def engine_unavailable(self, tool: str, engine: str, why: str) -> ToolResult:
        return ToolResult.error(
            "service-unavailable",
            f"{tool} runs on the {engine} workers, which are not reachable ({why[:120]}).",
            hint="the call did not run; try again later or do without this tool.",
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

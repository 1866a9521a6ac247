"""Process-isolated abilities for the worker tests: echo, sleep, crash, hang, misbehave."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import msgspec

from chalie.ability import Ability
from chalie.result import ToolResult

_EXAMPLES = (
    "run the test ability",
    "exercise the worker pool",
    "call the sample tool",
    "check process isolation",
    "try the worker path",
    "measure a worker call",
)


class _Sample(Ability):
    abstract = True
    isolation = "process"
    discoverable = False
    tooltip = "test ability for the worker pool"
    examples = _EXAMPLES


class EchoParams(msgspec.Struct, forbid_unknown_fields=True):
    text: str = ""


class Echo(_Sample):
    """Returns its text, the worker's pid and the calling conversation."""

    name = "sample_echo"
    summary = "Echo the text back with the pid of the process that ran it."
    Params = EchoParams

    def run(self, params: Any) -> ToolResult:
        conversation = self.context.conversation_id if self.context else ""
        return ToolResult.success(
            params.text, meta={"pid": os.getpid(), "conversation": conversation}
        )


class Noop(_Sample):
    name = "sample_noop"
    summary = "Do nothing and succeed."

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success("ok")


class SleepParams(msgspec.Struct):
    seconds: float = 1.0


class Sleep(_Sample):
    """Sleeps in the worker (the worker keeps heartbeating) and reports its pid first."""

    name = "sample_sleep"
    summary = "Sleep for some seconds, then succeed."
    Params = SleepParams

    def run(self, params: Any) -> ToolResult:
        time.sleep(params.seconds)
        return ToolResult.success(f"slept {params.seconds}", meta={"pid": os.getpid()})


class Pid(_Sample):
    name = "sample_pid"
    summary = "Report the worker's pid."

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success(str(os.getpid()))


class Exit(_Sample):
    """Ends its own worker process at once, like a crash in native code."""

    name = "sample_exit"
    summary = "Exit the worker process abruptly."

    def run(self, params: Any) -> ToolResult:
        os._exit(13)


class KillSelf(_Sample):
    name = "sample_kill_self"
    summary = "SIGKILL the worker process."

    def run(self, params: Any) -> ToolResult:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(5)
        return ToolResult.success("unreachable")


class Freeze(_Sample):
    """Stops its whole worker process (SIGSTOP), so no heartbeat leaves it."""

    name = "sample_freeze"
    summary = "Freeze the worker process."

    def run(self, params: Any) -> ToolResult:
        # Stopped again if anything outside sends SIGCONT: it stays frozen until killed.
        while True:
            os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(0.01)


class Raises(_Sample):
    name = "sample_raises"
    summary = "Raise an exception inside run."

    def run(self, params: Any) -> ToolResult:
        raise RuntimeError("broken on purpose")


class Unsendable(_Sample):
    name = "sample_unsendable"
    summary = "Return a rich payload that cannot cross a process boundary."

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success("x", rich={"thing": object()})


class Huge(_Sample):
    name = "sample_huge"
    summary = "Return a result body larger than a frame."

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success("x" * (20 * 1024 * 1024))


class Deep(_Sample):
    name = "sample_deep"
    summary = "Return a rich payload nested deeper than a frame may be."

    def run(self, params: Any) -> ToolResult:
        value: Any = "bottom"
        for _ in range(100):
            value = {"down": value}
        return ToolResult.success("x", rich=value)


class RichCard(_Sample):
    name = "sample_rich_card"
    summary = "Return a text body and a rich card payload."

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success("a card", rich={"card": {"title": "hi", "n": 2}})

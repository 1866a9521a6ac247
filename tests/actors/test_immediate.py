"""The immediate executor: a declared-quick ability runs on the dispatcher's thread, and one
that turns out slow is moved to inline lanes, where its deadline and cancel work again."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pykka
import pytest

from actors.calls.executors import EXECUTORS
from actors.calls.executors.immediate import SLOW_RUN, ImmediateExecutor
from actors.calls.executors.inline import InlineExecutor
from chalie.ability import Ability
from chalie.calls.envelope import parse
from chalie.calls.execution import Job
from chalie.calls.registry import Registry
from chalie.result import ToolResult
from chalie.wire.messages import TurnContext
from tests.actors.rig import EX, Rig, attrs
from tools.waiting import wait_until


@pytest.fixture(autouse=True)
def _no_leftover_actors() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all()


class Where(Ability):
    """Answers with the name of the thread it ran on."""

    name = "where"
    summary = "Where it ran."
    tooltip = "where"
    examples = EX
    discoverable = False
    isolation = "immediate"

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success(threading.current_thread().name)


class Sluggish(Ability):
    """Declared immediate, but busy for 20 ms on its first run and waiting on later ones."""

    name = "sluggish"
    summary = "Sluggish."
    tooltip = "sluggish"
    examples = EX
    discoverable = False
    isolation = "immediate"
    timeout = 0.3
    runs: ClassVar[list[str]] = []

    def run(self, params: Any) -> ToolResult:
        Sluggish.runs.append(threading.current_thread().name)
        if len(Sluggish.runs) == 1:
            end = time.perf_counter() + 0.02  # computing, not waiting: holds the thread
            while time.perf_counter() < end:
                pass
            return ToolResult.success("done, slowly")
        self.cancelled.wait(10)  # past its timeout: only the lanes can end it in time
        return ToolResult.success("woke")


def _rig(tmp_path: Path, **kw: Any) -> Rig:
    rig = Rig(tmp_path, **kw)
    for cls in (Where, Sluggish):
        rig.registry.add(cls, source="tests")
        rig.policy.proxy().set("chat", cls.name, "allow").get()
    return rig


def _dispatcher_thread(rig: Rig) -> str:
    """The dispatcher actor's thread (pykka names it after the class)."""
    (name,) = [t.name for t in threading.enumerate() if t.name.startswith("DispatcherActor-")]
    return name


def test_an_immediate_ability_runs_on_the_dispatchers_thread(tmp_path: Path) -> None:
    rig = _rig(tmp_path)
    out = rig.run("where")
    assert out.status == "success", out.envelope
    (envelope,) = parse(out.envelope)
    ran_on = envelope.content.strip()
    assert ran_on == _dispatcher_thread(rig)
    assert not ran_on.startswith("chalie-inline")
    # Everything else a call pays still happens: one complete trail row.
    (row,) = rig.rows(tool="where")
    assert row.status == "success" and row.decision == "allow" and row.ended_at is not None


def test_a_slow_run_moves_the_tool_to_the_lanes_where_its_deadline_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Sluggish.runs.clear()
    rig = _rig(tmp_path)
    with caplog.at_level(logging.WARNING, logger="chalie.calls.dispatch"):
        first = rig.run("sluggish")
    assert first.status == "success"
    assert Sluggish.runs == [_dispatcher_thread(rig)]
    assert any("declared immediate" in r.getMessage() for r in caplog.records)
    # The second call waits on its cancelled event: on the dispatcher's thread it would
    # hold every other call; in a lane the deadline ends it and the dispatcher answers.
    pending = rig.call("sluggish", call_id="c2")
    wait_until(lambda: len(Sluggish.runs) == 2, timeout=5)
    assert Sluggish.runs[1].startswith("chalie-inline")
    assert rig.run("where", call_id="c3").status == "success"  # the dispatcher is free
    late = pending.result(10)
    assert late.status == "error" and attrs(late)["code"] == "tool-timeout"


def test_a_cancelled_job_does_not_run() -> None:
    ran: list[str] = []

    class Once(Where):
        name = "once"

        def run(self, params: Any) -> ToolResult:
            ran.append("ran")
            return ToolResult.success("ran")

    registry = Registry()
    registry.add(Once, source="tests")
    entry = registry.get("once")
    assert entry is not None
    instance = Once()
    instance.cancelled.set()
    job = Job(
        job_id="j1",
        call_id="c1",
        entry=entry,
        instance=instance,
        params={},
        value={},
        context=TurnContext(conversation_id="c", turn_id="t", channel="chat"),
        timeout=1.0,
    )
    results: list[ToolResult] = []
    executor = ImmediateExecutor(InlineExecutor(1))
    ended = executor.start(job, results.append)
    assert ran == [] and results == []  # the result is returned, done is not called
    assert ended is not None and ended.code == "cancelled"
    assert executor.moved() == frozenset()
    executor.close()


@pytest.mark.parametrize("bad", [0, -1.0, True, "5ms", None])
def test_slow_run_must_be_a_positive_number(bad: Any) -> None:
    with pytest.raises(ValueError, match="slow_run"):
        ImmediateExecutor(InlineExecutor(1), slow_run=bad)


def test_the_table_runs_immediate_abilities_with_the_immediate_executor() -> None:
    from actors.calls.executors import ExecutorEnv, build

    executors = build(ExecutorEnv(inline_threads=2), EXECUTORS)
    try:
        assert isinstance(executors["immediate"], ImmediateExecutor)
        assert isinstance(executors["inline"], InlineExecutor)
        assert SLOW_RUN <= 0.01  # a run on the dispatcher's thread is short by declaration
    finally:
        for executor in executors.values():
            executor.close()

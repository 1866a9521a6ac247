"""Dispatcher overhead: an inline no-op ability, from tool call to rendered envelope.

The figure includes everything a real call pays: the hop into the dispatcher
actor, pre-validation (action map + JSON Schema + Params), classify, the gate
(an ``allow`` entry, served from the PolicyActor's view), the trail row
(SQLite WAL, synchronous=NORMAL, a real file; for a call this quick the
deferred start and the end are one insert, committed before the reply), the
hop onto the inline pool, rendering, and the reply.
A breakdown of the parts is printed after the figure.

Run: ``python tools/bench/bench_dispatch.py [calls]``
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Literal

import msgspec
import pykka

from actors.dispatcher import DispatcherActor, submit
from actors.policy import PolicyActor
from chalie import dispatch as steps
from chalie.ability import Ability
from chalie.events import EventBus
from chalie.messages import ToolCall, TurnContext
from chalie.registry import Registry
from chalie.result import ToolResult
from chalie.services import Services
from chalie.trail import CallRecord, Trail


class NoopParams(msgspec.Struct, forbid_unknown_fields=True):
    """Do nothing."""

    action: Literal["ping"] = "ping"
    note: str = ""


class Noop(Ability):
    name = "noop"
    summary = "Does nothing; measures the dispatcher."
    tooltip = "Nothing"
    examples = ("a", "b", "c", "d", "e", "f")
    Params = NoopParams
    actions = {"ping": ()}

    def run(self, params: NoopParams) -> ToolResult:
        return ToolResult.success("ok")


class ProcNoop(Ability):
    name = "proc_noop"
    summary = "Does nothing in a worker process; measures the dispatcher's process path."
    tooltip = "Nothing, elsewhere"
    examples = ("a", "b", "c", "d", "e", "f")
    isolation = "process"

    def run(self, params: dict[str, object]) -> ToolResult:
        return ToolResult.success("ok")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter_ns() - t) / 1000)
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    home = Path(tempfile.mkdtemp(prefix="chalie-bench-"))
    registry = Registry()
    registry.add(Noop, source="bench")
    bus = EventBus()
    policy = PolicyActor.start(home / "chalie.db", bus)
    policy.proxy().set("chat", "noop", "allow").get()
    dispatcher = DispatcherActor.start(
        registry, Services(registry=registry), home / "chalie.db", lambda: policy, None, bus
    )
    ctx = TurnContext(conversation_id="bench", turn_id="t1", channel="chat")
    call = ToolCall(call_id="c1", tool="noop", arguments={"act_summary": "bench", "note": "x"},
                    context=ctx)
    try:
        for _ in range(500):  # warm-up; also lets the dispatcher fetch the policy view
            submit(dispatcher, call).result(5)
        outcome = submit(dispatcher, call).result(5)
        assert outcome.status == "success", outcome.envelope
        samples = timed(lambda: submit(dispatcher, call).result(5), n)
        print(f"dispatcher overhead, inline no-op, gate (allow) + trail included, n={n}:")
        print(f"  p50 {statistics.median(samples):.1f} us   p90 {pct(samples, 0.9):.1f} us   "
              f"p99 {pct(samples, 0.99):.1f} us")

        # The parts, each measured alone on this thread.
        trail = Trail(home / "parts.db")

        def record() -> CallRecord:
            return trail.record_for(call_id="c", turn_id="t", conversation_id="b", channel="chat",
                                    tool="noop", permission="noop.ping", params='{"note":"x"}',
                                    act_summary="bench")

        recs = [record() for _ in range(2000)]
        it = iter(recs)

        def coalesced() -> None:  # the hot path: a quick call's start and end, one insert
            rec = next(it)
            trail.defer_start(rec)
            trail.finish(rec, status="success", code=None, decision="allow", decided_by="policy")

        one_row = timed(coalesced, 2000)
        recs = [record() for _ in range(2000)]
        it = iter(recs)

        def two_writes() -> None:  # a start written at once, then its end
            rec = next(it)
            trail.start(rec)
            trail.finish(rec, status="success", code=None, decision="allow", decided_by="policy")

        both = timed(two_writes, 2000)
        params = {"note": "x"}
        pre = timed(lambda: steps.prevalidate(Noop, params), 5000)
        result = ToolResult.success("ok")
        rend = timed(lambda: steps.render_outcome("noop", result, "ping"), 5000)
        hop = timed(lambda: policy.ask(_Ping()), 2000)
        print("  parts (p50): "
              f"trail row of a quick call (one insert) {statistics.median(one_row):.1f} us "
              f"[start+end as two writes: {statistics.median(both):.1f} us], "
              f"pre-validation {statistics.median(pre):.1f} us, "
              f"render {statistics.median(rend):.1f} us, "
              f"one pykka ask round trip {statistics.median(hop):.1f} us")
        print("  a call crosses three threads (caller -> dispatcher actor -> inline pool -> "
              "caller); the hand-offs and the trail insert dominate")
        trail.close()

        callers = 4
        per = max(1, n // callers)

        def caller() -> None:
            for _ in range(per):
                submit(dispatcher, call).result(5)

        threads = [threading.Thread(target=caller) for _ in range(callers)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rate = callers * per / (time.perf_counter() - began)
        print(f"throughput, inline no-op, {callers} concurrent callers: {rate:,.0f} calls/s")
        worker_path(home, registry, bus, policy)
        print(f"load average while measuring: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    finally:
        pykka.ActorRegistry.stop_all()


def worker_path(home: Path, registry: Registry, bus: EventBus, policy: pykka.ActorRef[Any]) -> None:
    """The same call to an ability in a worker process, through the dispatcher (2 workers)."""
    from actors.worker_pool import WorkerPool, WorkerPoolHandle

    registry.add(ProcNoop, source="bench", ref=f"{Path(__file__).resolve()}:ProcNoop")
    policy.proxy().set("chat", "proc_noop", "allow").get()
    handle = WorkerPoolHandle()
    pool = WorkerPool.start(home / "pool", workers=2, handle=handle)
    dispatcher = DispatcherActor.start(
        registry, Services(), home / "chalie.db", lambda: policy, handle, bus
    )
    ctx = TurnContext(conversation_id="bench", turn_id="t2", channel="chat")
    call = ToolCall(call_id="w", tool="proc_noop", arguments={}, context=ctx)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if submit(dispatcher, call).result(10).status == "success":
            break
        time.sleep(0.05)
    for _ in range(300):
        submit(dispatcher, call).result(10)
    samples = timed(lambda: submit(dispatcher, call).result(10), 2000)
    print(f"worker-process no-op through the dispatcher, n=2000: p50 "
          f"{statistics.median(samples):.1f} us   p99 {pct(samples, 0.99):.1f} us")
    dispatcher.stop()
    pool.stop()


class _Ping:
    pass


if __name__ == "__main__":
    main()

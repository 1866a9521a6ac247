"""The store's figures: an immediate no-op through the dispatcher on PostgreSQL beside SQLite.

Issue 33 §1: the dispatch overhead of an immediate no-op (run on the dispatcher's thread,
gate and trail row included: for a call this quick the trail writes one row, committed
before the reply) with the PostgreSQL store must stay within 2x the SQLite store's. Both
run in this process, in alternating rounds (SQLite, PostgreSQL, SQLite, ...), each round's
p50 printed beside the other's and the ratio; the floor of both is a bare pykka ask,
printed too. PostgreSQL is a throw-away cluster on loopback (tools/pg_cluster.py, Debian's
PostgreSQL 15, ``fsync=off`` as every test cluster here: the figure is the round trip and
the commit's CPU, not a disk's flush).

Second figure: the propagation of a policy change between two daemons on one PostgreSQL
(LISTEN/NOTIFY): the time from ``PolicyStore.set`` returning on A to the new decision being
in B's table (what B's gate reads), p50 and p99 of ``--changes`` changes, beside the
target (p99 <= 1 s). Both stores are in this process, each with its own connections and
its own listening thread, as two daemons have.

Run: ``python tools/bench/bench_store.py [calls] [--rounds N] [--changes N]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from actors.calls.dispatcher import DispatcherActor, submit
from actors.gate.policy import PolicyActor
from chalie.calls.registry import Registry
from chalie.gate.policy import PolicyStore
from chalie.services import Services
from chalie.store.store_place import Place, Postgres
from chalie.wire.bus import EventBus
from chalie.wire.messages import ToolCall, TurnContext
from tools.bench.bench_dispatch import Echo, QuickNoop, _Ping, pct, rounds, timed
from tools.pg_cluster import PgCluster

TARGET = 2.0
PROPAGATION_TARGET = 1.0  # seconds, p99


def propagation(url: str, changes: int) -> None:
    a, b = PolicyStore(Postgres(url)), PolicyStore(Postgres(url))
    took: list[float] = []
    try:
        for i in range(changes):
            decision = ("allow", "deny")[i % 2]
            a.set("chat", "bench_tool", decision)
            started = time.perf_counter()
            while b.table.get(("chat", "bench_tool")) != decision:
                if time.perf_counter() - started > 10:
                    raise AssertionError("a change did not arrive within 10 s")
                time.sleep(0.0001)
            took.append((time.perf_counter() - started) * 1000)
    finally:
        a.close()
        b.close()
    p99 = pct(took, 0.99)
    verdict = "within" if p99 <= PROPAGATION_TARGET * 1000 else "ABOVE"
    print(
        f"policy change A -> B (LISTEN/NOTIFY), {changes} changes: p50 "
        f"{statistics.median(took):.2f} ms   p99 {p99:.2f} ms   max {max(took):.2f} ms   "
        f"(target p99 <= {PROPAGATION_TARGET * 1000:.0f} ms: {verdict}, "
        f"ratio {p99 / (PROPAGATION_TARGET * 1000):.4f})"
    )


def dispatcher_on(place: Place) -> tuple[Any, Any, ToolCall]:
    registry = Registry()
    registry.add(QuickNoop, source="bench")
    bus = EventBus()
    policy = PolicyActor.start(place, bus)
    policy.proxy().set("chat", "quick_noop", "allow").get()
    dispatcher = DispatcherActor.start(registry, Services(), place, policy, None, bus)
    ctx = TurnContext(
        conversation_id="bench", turn_id="t1", channel="chat", injected=("quick_noop",)
    )
    call = ToolCall(
        call_id="c0", tool="quick_noop", arguments={"act_summary": "bench"}, context=ctx
    )
    for _ in range(500):  # warm-up; also lets the dispatcher fetch the policy view
        outcome = submit(dispatcher, call).result(5)
        assert outcome.status == "success", outcome.envelope
    return dispatcher, policy, call


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("calls", nargs="?", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--changes", type=int, default=300)
    args = parser.parse_args()
    n, count = args.calls, args.rounds
    home = Path(tempfile.mkdtemp(prefix="chalie-bench-store-"))
    with PgCluster() as cluster:
        sqlite_d, sqlite_p, call = dispatcher_on(home / "chalie.db")
        pg_d, pg_p, _ = dispatcher_on(Postgres(cluster.new_database()))
        echo = Echo.start()
        try:
            print(
                f"immediate no-op through the dispatcher (gate + trail row), n={n} a round; "
                f"PostgreSQL {cluster.bin.parent.name} on loopback:"
            )
            ratio = rounds(
                "postgresql",
                "sqlite",
                lambda: submit(pg_d, call).result(5),
                lambda: submit(sqlite_d, call).result(5),
                n,
                count,
                TARGET,
            )
            print("  (the floor of both, a bare pykka ask round trip: ", end="")
            floor = statistics.median(timed(lambda: echo.ask(_Ping()), n))
            print(f"p50 {floor:.1f} us)")
            for label, ref in (("sqlite", sqlite_d), ("postgresql", pg_d)):
                samples = timed(lambda ref=ref: submit(ref, call).result(5), n)
                print(
                    f"  {label:10s} last run: p50 {statistics.median(samples):7.1f} us   "
                    f"p90 {pct(samples, 0.9):7.1f} us   p99 {pct(samples, 0.99):7.1f} us"
                )
            print(f"=> dispatch overhead PostgreSQL / SQLite: {ratio:.2f} (target <= {TARGET:g})")
            propagation(cluster.new_database(), args.changes)
        finally:
            echo.stop()
            for ref in (sqlite_d, sqlite_p, pg_d, pg_p):
                ref.stop()


if __name__ == "__main__":
    main()

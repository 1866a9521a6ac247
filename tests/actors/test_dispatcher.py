"""The DispatcherActor with real threads, PolicyActor, SQLite trail and worker processes."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pykka
import pytest

from actors.calls.dispatcher import DispatcherActor, submit
from actors.child_ref import ChildRef
from actors.gate.policy import PolicyActor
from chalie.calls.envelope import parse
from chalie.calls.registry import Registry
from chalie.calls.trail import Trail
from chalie.services import Services
from chalie.wire.bus import EventBus
from chalie.wire.events import BackgroundResult
from chalie.wire.messages import CancelTurn, ToolCall
from chalie.wire.principals import LOCAL_ID, LOCAL_OWNER, Principal
from tests.actors.rig import (
    ARGS,
    Rig,
    Slow,
    attrs,
    ctx,
)
from tools.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_leftover_actors() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all()


# -- the path of one call --------------------------------------------------------------


def test_each_trail_row_carries_the_principal_of_its_turn(rig: Rig) -> None:
    agent = Principal(scope="gateway", id="tok-42", name="gw")
    rig.run("fast", call_id="by-owner")
    rig.run("fast", call_id="by-local", context=ctx(principal=LOCAL_OWNER))
    rig.run("fast", call_id="by-agent", context=ctx(principal=agent))
    rig.run("no_such_tool", call_id="early-agent", context=ctx(principal=agent))
    rig.run(
        "fast", call_id="unknown-agent", context=ctx(channel="external_agent", human_present=False)
    )
    by_call = {r.call_id: r.principal for r in rig.rows()}
    # No principal on the turn is the owner's local call.
    assert by_call == {
        "by-owner": LOCAL_ID,
        "by-local": LOCAL_ID,
        "by-agent": "tok-42",
        "early-agent": "tok-42",
        # An agent turn without a principal is never recorded as the owner's.
        "unknown-agent": "",
    }
    assert {r.call_id for r in rig.rows(principal="tok-42")} == {"by-agent", "early-agent"}


def test_a_call_returns_one_envelope_and_is_recorded(rig: Rig) -> None:
    outcome = rig.run(
        "mail", {"action": "send", "to": "bob", "act_summary": "mailing bob"}, call_id="call-1"
    )
    assert (outcome.call_id, outcome.tool, outcome.status, outcome.code) == (
        "call-1",
        "mail",
        "success",
        None,
    )
    (env,) = parse(outcome.envelope)
    assert env.attrs == {"status": "success", "action": "send"} and env.content == "mail send"
    (row,) = rig.rows()
    assert (row.call_id, row.turn_id, row.conversation_id, row.channel) == (
        "call-1",
        "t1",
        "conv",
        "chat",
    )
    assert (row.tool, row.permission, row.decision, row.decided_by) == (
        "mail",
        "mail.send",
        "allow",
        "policy",
    )
    assert (row.status, row.act_summary) == ("success", "mailing bob")
    assert msgspec.json.decode(row.params) == {"action": "send", "to": "bob"}


def test_invalid_calls_bounce_before_the_gate(rig: Rig) -> None:
    rig.policy.proxy().reset().get()  # nothing allowed: a gated call would ask
    cases = {
        "unknown-tool": ("../../bin/sh", {}),
        "unknown-action": ("mail", {"action": "delete_all"}),
        "missing-params": ("mail", {"action": "send"}),
        "invalid-param": ("mail", {"action": "read", "cc": "eve"}),
    }
    for code, (tool, args) in cases.items():
        outcome = rig.run(tool, args)
        assert (outcome.status, outcome.code) == ("error", code), outcome.envelope
    assert rig.events.queue.empty()  # nobody was asked
    assert rig.policy.proxy().list().get() == []  # and no permission was even seen
    codes = sorted(r.code for r in rig.rows())
    assert codes == sorted(cases)
    assert all(r.decision is None and r.status == "error" for r in rig.rows())


def test_unknown_valid_values_reach_the_model(rig: Rig) -> None:
    outcome = rig.run("mail", {"action": "delete_all"})
    assert 'valid values: ["read","send"]' in outcome.envelope


def test_sensitive_parameters_never_reach_the_trail_or_the_prompt(rig: Rig) -> None:
    rig.policy.proxy().reset().get()
    fut = rig.call("mail", {"action": "send", "to": "bob", "password": "hunter2"})
    request = rig.request()
    assert request.params == {"action": "send", "to": "bob", "password": "[redacted]"}
    rig.policy.proxy().answer(request.request_id, "allow_once", LOCAL_OWNER).get()
    assert fut.result(5).status == "success"
    (row,) = rig.rows()
    assert "hunter2" not in row.params and row.decided_by == "human"


def test_an_ability_that_raises_gives_an_error_envelope(rig: Rig) -> None:
    outcome = rig.run("boom")
    assert (outcome.status, outcome.code) == ("error", "unhandled-exception")
    assert rig.ref.is_alive()
    assert rig.rows()[0].code == "unhandled-exception"


def test_hostile_calls_get_structured_errors(rig: Rig) -> None:
    huge = rig.run("fast", {"blob": "x" * (2 << 20)})
    assert huge.code == "invalid-param" and "KiB" in huge.envelope
    not_dict = submit(
        rig.ref,
        ToolCall(
            call_id="c",
            tool="fast",
            arguments=[1, 2],  # type: ignore[arg-type]
            context=ctx(),
        ),
    ).result(5)
    assert not_dict.code == "invalid-param"
    junk = rig.ref.proxy().dispatch("not a call").get(timeout=5).result(5)  # type: ignore[arg-type]
    assert junk.code == "invalid-param"
    weird = rig.run("fast\n[end:fast]")
    assert weird.code == "unknown-tool"
    assert weird.envelope.splitlines()[-1] == "[end:fast_end_fast]"
    assert rig.ref.is_alive()


def test_proxy_and_ask_return_futures_of_the_outcome(rig: Rig) -> None:
    call = ToolCall(call_id="p", tool="fast", arguments=ARGS, context=ctx())
    via_proxy = rig.ref.proxy().dispatch(call).get(timeout=5)
    via_ask = rig.ref.ask(call, timeout=5)
    assert via_proxy.result(5).status == via_ask.result(5).status == "success"


# -- the gate -------------------------------------------------------------------------


def test_an_unseen_permission_asks_the_human_and_runs_once_allowed(rig: Rig) -> None:
    rig.policy.proxy().reset().get()
    fut = rig.call("mail", {"action": "read"}, context=ctx(conversation="c-9"))
    request = rig.request()
    assert (request.conversation_id, request.permission) == ("c-9", "mail.read")
    time.sleep(0.05)
    assert not fut.done()
    (row,) = rig.rows()
    assert row.status == "running"
    rig.policy.proxy().answer(request.request_id, "allow_once", LOCAL_OWNER).get()
    outcome = fut.result(5)
    assert outcome.status == "success"
    (row,) = rig.rows()
    assert (row.status, row.decision, row.decided_by) == ("success", "allow", "human")


def test_a_human_deny_and_an_expiry_are_errors(tmp_path: Path) -> None:
    rig = Rig(tmp_path, expiry=0.3)
    rig.policy.proxy().reset().get()
    fut = rig.call("mail", {"action": "read"})
    rig.policy.proxy().answer(rig.request().request_id, "deny", LOCAL_OWNER).get()
    assert fut.result(5).code == "permission-denied"
    expired = rig.run("mail", {"action": "read"})
    assert expired.code == "approval-expired"
    assert [r.code for r in rig.rows()] == ["approval-expired", "permission-denied"]


@pytest.mark.parametrize("channel", ["subconscious", "external_agent"])
def test_ask_without_a_human_is_denied_with_a_hint(rig: Rig, channel: str) -> None:
    # An external agent's turn has no human unless it loops one in (chalie.gate.policy.decide).
    outcome = rig.run(
        "fast", context=ctx(channel=channel, human_present=channel != "external_agent")
    )
    assert outcome.code == "permission-denied"
    assert "human must approve" in outcome.envelope
    assert "hint: do not retry" in outcome.envelope
    assert rig.events.queue.empty()
    assert [
        (r.channel, r.permission) for r in rig.policy.proxy().list().get() if r.origin == "seen"
    ] == [(channel, "fast")]


def test_a_deny_entry_refuses_and_tool_entries_cover_actions(rig: Rig) -> None:
    rig.policy.proxy().set("chat", "mail.send", "deny").get()
    assert rig.run("mail", {"action": "send", "to": "x"}).code == "permission-denied"
    assert rig.run("mail", {"action": "read"}).status == "success"  # the tool entry allows
    assert rig.rows()[1].decided_by == "policy"


def test_internal_abilities_bypass_the_gate(rig: Rig) -> None:
    outcome = rig.run("lookup", context=ctx(channel="external_agent"))
    assert outcome.status == "success"
    assert rig.rows()[0].decided_by == "internal"
    assert rig.policy.proxy().list(True).get() == [
        r for r in rig.policy.proxy().list(True).get() if r.permission != "lookup"
    ]


def test_the_gate_fails_closed_when_the_policy_actor_is_gone(rig: Rig) -> None:
    rig.policy.stop()
    outcome = rig.run("fast")
    assert outcome.code == "permission-denied"
    assert rig.rows()[0].decided_by == "fail-closed"
    rig.policy_ref = None
    assert rig.run("fast").code == "permission-denied"


def test_a_classify_that_raises_fails_closed(rig: Rig) -> None:
    outcome = rig.run("bad_classify")
    assert outcome.code == "permission-denied"
    assert rig.rows()[0].decided_by == "fail-closed"


def test_a_pending_approval_delays_no_other_call(rig: Rig) -> None:
    rig.run("fast")  # warm: the policy view is in place
    rig.policy.proxy().reset("chat", "mail").get()  # mail now asks
    waiting = rig.call("mail", {"action": "send", "to": "x"}, call_id="w")
    request = rig.request()
    start = time.monotonic()
    assert rig.run("fast").status == "success"
    assert (
        rig.run("mail", {"action": "send", "to": "y"}, context=ctx(channel="subconscious")).code
        == "permission-denied"
    )
    assert time.monotonic() - start < 0.25
    assert not waiting.done()
    rig.policy.proxy().answer(request.request_id, "allow_once", LOCAL_OWNER).get()
    assert waiting.result(5).status == "success"


# -- execution ---------------------------------------------------------------------------


def test_fifty_slow_calls_do_not_delay_a_fast_one(rig: Rig) -> None:
    rig.run("fast")  # warm: the policy view is in place
    slow = [
        rig.call("slow", {"seconds": 2.0}, call_id=f"s{i}", context=ctx("slow-turn"))
        for i in range(50)
    ]
    wait_until(lambda: rig.ref.proxy().in_flight().get()["calls"] == 50)
    start = time.monotonic()
    fast = rig.run("fast", context=ctx("fast-turn"))
    elapsed = time.monotonic() - start
    assert fast.status == "success"
    assert elapsed < 0.25, f"the fast call took {elapsed * 1000:.0f} ms"
    assert not any(f.done() for f in slow)
    assert rig.ref.proxy().cancel_turn("slow-turn").get() == 50
    outcomes = [f.result(5) for f in slow]
    assert {o.code for o in outcomes} == {"cancelled"}


def test_a_timeout_is_tool_timeout_and_signals_the_ability(rig: Rig) -> None:
    Slow.woke_early.clear()
    start = time.monotonic()
    outcome = rig.run("hang", {"seconds": 10}, context=ctx("timeout-turn"))
    assert outcome.code == "tool-timeout"
    assert 0.25 < time.monotonic() - start < 2.0
    wait_until(lambda: "timeout-turn" in Slow.woke_early)
    assert rig.rows()[0].code == "tool-timeout"


def test_cancelling_a_turn_cancels_only_its_calls_and_stops_the_work(rig: Rig) -> None:
    Slow.woke_early.clear()
    mine = rig.call("slow", {"seconds": 10}, call_id="a", context=ctx("t-cancel"))
    other = rig.call("slow", {"seconds": 0.3}, call_id="b", context=ctx("t-other"))
    wait_until(lambda: rig.ref.proxy().in_flight().get()["running"] == 2)
    rig.ref.tell(CancelTurn(turn_id="t-cancel"))
    assert mine.result(2).code == "cancelled"
    wait_until(lambda: "t-cancel" in Slow.woke_early)
    assert other.result(5).status == "success"
    assert rig.ref.proxy().cancel_turn("t-cancel").get() == 0
    codes = {r.call_id: r.code for r in rig.rows()}
    assert codes == {"a": "cancelled", "b": None}


def test_an_async_call_answers_at_once_and_delivers_its_result_later(rig: Rig) -> None:
    sub = rig.bus.subscribe_queue("conv-bg")
    context = ctx(conversation="conv-bg", allow_async=True)
    rig.run("fast", call_id="warm", context=context)  # the gate's view fetched: decided at once
    reader = Trail(rig.db)
    try:
        start = time.monotonic()
        outcome = rig.run(
            "slow",
            {"seconds": 0.5, "async": True, "act_summary": "napping"},
            call_id="bg-1",
            context=context,
        )
        # The promise is on disk before it is made (a SIGKILL now still gives the
        # conversation its interrupted result at the next start): read at once, from
        # another connection, not through the dispatcher.
        on_disk = [(r.call_id, r.status) for r in reader.query(call_id="bg-1")]
    finally:
        reader.close()
    assert on_disk == [("bg-1", "running")]
    assert time.monotonic() - start < 0.4
    assert outcome.background and outcome.status == "success"
    assert attrs(outcome)["call_id"] == "bg-1"
    event = sub.queue.get(timeout=5)
    assert isinstance(event, BackgroundResult)
    assert (event.call_id, event.conversation_id, event.status) == ("bg-1", "conv-bg", "success")
    assert "slept" in event.envelope
    (row,) = rig.rows(call_id="bg-1")
    assert (row.status, row.background) == ("success", True)
    # The turn's cancel does not reach a background call; cancel_call does.
    rig.run("slow", {"seconds": 10, "async": True}, call_id="bg-2", context=context)
    assert rig.ref.proxy().cancel_turn("t1").get() == 0
    assert rig.ref.proxy().cancel_call("bg-2").get() == 1
    late = sub.queue.get(timeout=5)
    assert isinstance(late, BackgroundResult) and "code=cancelled" in late.envelope


def test_async_is_ignored_on_a_channel_that_does_not_allow_it(rig: Rig) -> None:
    outcome = rig.run("slow", {"seconds": 0.05, "async": True})
    assert not outcome.background and "slept" in outcome.envelope


def test_a_full_lane_is_overloaded_not_queued_forever(tmp_path: Path) -> None:
    rig = Rig(tmp_path, inline_threads=2, lane_limit=1, lane_queue=2)
    rig.run("fast")
    futs = [
        rig.call("slow", {"seconds": 5}, call_id=f"s{i}", context=ctx("busy")) for i in range(4)
    ]
    assert futs[3].result(5).code == "overloaded"
    assert rig.run("fast").status == "success"  # another tool's lane is free
    rig.ref.proxy().cancel_turn("busy").get()


def test_stopping_the_dispatcher_fails_its_calls_in_flight(rig: Rig) -> None:
    fut = rig.call("slow", {"seconds": 10})
    wait_until(lambda: rig.ref.proxy().in_flight().get()["calls"] == 1)
    rig.ref.stop()
    outcome = fut.result(5)
    assert outcome.code == "internal-error"
    assert submit(
        rig.ref, ToolCall(call_id="x", tool="fast", arguments=ARGS, context=ctx())
    ).result(5).code == ("internal-error")
    book = Trail(rig.db)
    assert book.query()[0].code == "internal-error"
    book.close()


def test_a_restarted_dispatcher_marks_calls_left_running_interrupted(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.policy.proxy().reset().get()
    rig.call("mail", {"action": "read"})  # waits for a human
    rig.request()
    # A dispatcher that dies without its cleanup: the row stays running on disk.
    book = Trail(rig.db)
    assert book.query()[0].status == "running"
    book.close()
    again = DispatcherActor.start(rig.registry, Services(), rig.db, rig.policy, None, rig.bus)
    rows = again.proxy().trail().get()
    assert (rows[0].status, rows[0].code) == ("interrupted", "interrupted")


# -- worker processes ---------------------------------------------------------------------


def _idle(handle: Any) -> bool:
    return sum(w["state"] == "idle" for w in handle.status()["workers"]) == 2


def hosted_rig(tmp_path: Path, **tuning: Any) -> tuple[Rig, Any]:
    """A dispatcher hosting a pool of two workers on its thread, as the daemon runs it,
    once both workers are idle; and the pool's handle."""
    from actors.workers.worker_pool import HostedPool, WorkerPoolHandle

    handle = WorkerPoolHandle()
    pool = HostedPool(tmp_path / "home", handle=handle, **tuning)
    rig = Rig(tmp_path, workers=handle, pool=pool)
    wait_until(lambda: _idle(handle), 10)
    return rig, handle


@pytest.fixture(params=["hosted", "own-thread"])
def worker_rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Rig, Any]]:
    """A dispatcher and a pool of two workers: hosted on the dispatcher's thread (as the
    daemon runs it), or a WorkerPoolActor with a broker thread of its own."""
    from actors.workers.worker_pool import WorkerPoolActor, WorkerPoolHandle

    if request.param == "hosted":
        yield hosted_rig(tmp_path)
        return
    handle = WorkerPoolHandle()
    ref = WorkerPoolActor.start(tmp_path / "home", workers=2, handle=handle)
    wait_until(lambda: _idle(handle), 10)
    yield Rig(tmp_path, workers=handle), handle
    ref.stop()


def test_a_process_ability_runs_in_a_worker(worker_rig: tuple[Rig, Any]) -> None:
    rig, _ = worker_rig
    outcome = rig.run("sample_echo", {"text": "hello"}, context=ctx(conversation="conv-w"))
    (env,) = parse(outcome.envelope)
    assert env.content == "hello" and env.attrs["conversation"] == "conv-w"
    assert env.attrs["pid"] != os.getpid()
    assert rig.rows()[0].status == "success"


def test_a_worker_killed_mid_call_is_worker_crashed(worker_rig: tuple[Rig, Any]) -> None:
    rig, pool = worker_rig
    assert rig.run("sample_kill_self").code == "worker-crashed"
    assert rig.rows()[0].code == "worker-crashed"
    wait_until(lambda: _idle(pool), 10)  # its slot was filled again
    assert rig.run("sample_echo", {"text": "again"}).status == "success"


def test_cancel_and_timeout_reach_the_worker(worker_rig: tuple[Rig, Any]) -> None:
    rig, pool = worker_rig
    fut = rig.call("sample_sleep", {"seconds": 30}, context=ctx("w-turn"))
    wait_until(lambda: pool.status()["running"] == 1)
    assert not fut.done(), fut.result().envelope
    assert rig.ref.proxy().cancel_turn("w-turn").get() == 1
    assert fut.result(5).code == "cancelled"
    wait_until(lambda: pool.status()["running"] == 0)
    assert rig.run("sample_short_sleep", {"seconds": 30}).code == "tool-timeout"


def test_a_hosted_pool_runs_on_the_dispatchers_thread_and_is_reaped_with_it(
    tmp_path: Path,
) -> None:
    rig, handle = hosted_rig(tmp_path)
    assert not [t for t in threading.enumerate() if t.name == "worker-broker"]
    # status from the dispatcher's own thread (a direct read) and from this one (a command)
    mine = rig.ref.proxy().workers_status().get(timeout=5)
    assert [w["pid"] for w in mine["workers"]] == [w["pid"] for w in handle.status()["workers"]]
    pids = [w["pid"] for w in mine["workers"] + mine["spares"]]
    assert len(pids) == 3 and all(pids)
    # many calls in a row, from several threads at once
    outcomes: list[str] = []

    def caller(n: int) -> None:
        for i in range(20):
            out = rig.run("sample_echo", {"text": f"{n}-{i}"}, call_id=f"h{n}-{i}")
            outcomes.append(out.status)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes == ["success"] * 60
    rig.ref.stop()
    for pid in pids:  # reaped by the dispatcher's stop: no process left
        assert not os.path.exists(f"/proc/{pid}")
    assert handle.status()["running_pool"] is False
    # a call after the stop is refused at once, not queued forever
    from chalie.wire.messages import WorkerJob

    late = handle.submit(WorkerJob(job_id="late", ability="x:Y", params={}), timeout=5)
    assert late.result(5).code == "internal-error"


def test_a_hosted_pool_that_refuses_a_job_inside_start_ends_the_call_once(
    tmp_path: Path,
) -> None:
    """The refusal is reported on the dispatcher's thread while it starts the job: it is
    handled after that handler, as a message, and the call ends exactly once."""
    rig, _ = hosted_rig(tmp_path, max_pending=0)
    outcomes = [rig.run("sample_echo", {"text": "x"}, call_id=f"o{i}") for i in range(3)]
    assert [o.code for o in outcomes] == ["overloaded"] * 3
    assert [r.code for r in rig.rows()] == ["overloaded"] * 3
    now = rig.ref.proxy().in_flight().get()
    assert now["calls"] == 0 and now["timers"] == 0  # no deadline armed for an ended call


def test_a_hosted_pool_closed_from_another_thread_leaves_the_dispatcher_serving(
    tmp_path: Path,
) -> None:
    rig, handle = hosted_rig(tmp_path)
    pids = [w["pid"] for w in handle.status()["workers"]]
    broker = handle._broker
    assert broker is not None
    assert rig.ref.actor_inbox.watching
    broker.close(timeout=10)  # a command: the dispatcher's thread ends the pool
    assert broker.finished.is_set()
    # the dispatcher's inbox stops watching the closed socket and the reaped workers' pidfds
    # (left watched, they would be ready at once and for ever: a spinning thread)
    wait_until(lambda: not rig.ref.actor_inbox.watching, 5, what="the inbox unwatched")
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")
    # its inbox no longer waits on the closed socket: calls go on (more than the inbox hands
    # out between two looks at a watched poller), a worker's is refused
    assert [rig.run("fast").status for _ in range(40)] == ["success"] * 40
    assert rig.run("sample_echo", {"text": "x"}).code == "internal-error"
    assert rig.ref.proxy().workers_status().get(timeout=5)["running_pool"] is False


def test_a_dispatcher_without_a_pool_reports_no_workers(rig: Rig) -> None:
    assert rig.ref.proxy().workers_status().get(timeout=5) is None


def test_without_a_worker_pool_a_process_ability_is_an_internal_error(rig: Rig) -> None:
    assert rig.run("sample_echo", {"text": "x"}).code == "internal-error"


def test_concurrent_callers_each_get_their_own_outcome(rig: Rig) -> None:
    results: dict[str, str] = {}

    def caller(n: int) -> None:
        for i in range(25):
            out = rig.run("mail", {"action": "read"}, call_id=f"{n}-{i}")
            results[out.call_id] = out.status

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 100 and set(results.values()) == {"success"}
    assert len(rig.rows(limit=1000)) == 100


def test_a_long_inline_call_is_on_disk_as_running_within_milliseconds(rig: Rig) -> None:
    fut = rig.call("slow", {"seconds": 10}, context=ctx("long"))
    reader = Trail(rig.db)
    try:
        wait_until(lambda: [r.status for r in reader.query()] == ["running"], timeout=2)
    finally:
        reader.close()
    rig.ref.proxy().cancel_turn("long").get()
    assert fut.result(5).code == "cancelled"


DAEMON = """
import sys, time
from pathlib import Path
from actors.calls.dispatcher import DispatcherActor, submit
from actors.gate.policy import PolicyActor
from chalie.wire.bus import EventBus
from chalie.wire.messages import ToolCall, TurnContext
from chalie.calls.registry import Registry
from chalie.services import Services
from tests.actors.rig import Fast, Slow

db = Path(sys.argv[1])
reg = Registry()
reg.add(Fast, source="t")
reg.add(Slow, source="t")
bus = EventBus()
policy = PolicyActor.start(db, bus)
policy.proxy().set("chat", "fast", "allow").get()
policy.proxy().set("chat", "slow", "allow").get()
disp = DispatcherActor.start(reg, Services(), db, policy, None, bus)
ctx = TurnContext(conversation_id="k", turn_id="t", scope="unrestricted")
for i in range(30):
    call = ToolCall(call_id=f"c{i}", tool="fast", arguments={"act_summary": "x"}, context=ctx)
    out = submit(disp, call).result(10)
    assert out.status == "success"
    print(f"returned c{i}", flush=True)
args = {"seconds": 60, "act_summary": "x"}
submit(disp, ToolCall(call_id="in-flight", tool="slow", arguments=args, context=ctx))
time.sleep(0.2)
print("in flight", flush=True)
time.sleep(60)
"""


def test_sigkill_of_a_dispatching_process_loses_no_returned_call(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    db = tmp_path / "chalie.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", DAEMON, str(db)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert proc.stdout is not None
    returned = []
    try:
        for line in proc.stdout:
            if line.startswith("returned "):
                returned.append(line.split()[1])
            elif line.startswith("in flight"):
                break
    finally:
        proc.kill()
        proc.communicate(timeout=10)  # waits, and closes the pipe
    assert proc.returncode == -signal.SIGKILL and len(returned) == 30
    book = Trail(db)
    assert book.recover() == 1
    rows = {r.call_id: r for r in book.query(limit=100)}
    assert all(rows[c].status == "success" for c in returned)
    assert rows["in-flight"].status == "interrupted"
    book.close()


def test_cancelling_a_call_that_awaits_approval_withdraws_the_request(rig: Rig) -> None:
    rig.policy.proxy().reset().get()
    fut = rig.call("mail", {"action": "read"}, context=ctx("t-ask"))
    rig.request()
    assert rig.ref.proxy().cancel_turn("t-ask").get() == 1
    assert fut.result(5).code == "cancelled"
    wait_until(lambda: rig.policy.proxy().pending().get() == [])
    assert rig.rows()[0].code == "cancelled"


def test_timeouts_of_ended_calls_do_not_pile_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from actors.timers import TimerInbox

    monkeypatch.setattr(TimerInbox, "COMPACT_AFTER", 100)
    inbox = TimerInbox()
    handles = [inbox.add(60.0, ("late", n)) for n in range(1, 1000)]
    for handle in handles:
        inbox.cancel(handle)
    assert len(inbox._heap) < 200  # cancelled entries do not stay for a whole timeout
    assert len(inbox) == 0
    inbox.add(0.01, "due")
    assert inbox.get().message == "due"  # waits for the timer; the cancelled ones never come
    assert len(inbox) == 0 and inbox.empty()


def test_the_inbox_hands_out_messages_and_due_timers_in_time_order() -> None:
    from actors.timers import TimerInbox

    inbox = TimerInbox()
    first = inbox.add(0.0, "now")
    inbox.add(3600.0, "much later")
    inbox.put("sent")
    got = inbox.get()
    assert got.message == "now" and got.reply_to is None  # a due timer first
    assert inbox.get() == "sent"  # the queue's own envelope, untouched
    inbox.cancel(first)  # already fired: ignored
    cancelled = inbox.add(0.0, "cancelled")
    inbox.cancel(cancelled)
    inbox.cancel(cancelled)
    assert len(inbox) == 1
    sender = threading.Thread(target=inbox.put, args=("from another thread",))
    sender.start()
    assert inbox.get() == "from another thread"  # not the cancelled timer
    sender.join()


def test_the_policy_is_a_typed_child_handle_or_a_plain_ref(tmp_path: Path) -> None:
    from actors.directory import Directory

    rig = Rig(tmp_path)
    directory = Directory()
    directory.set("policy", rig.policy)
    for policy in (rig.policy, directory.ref("policy", PolicyActor), ChildRef.to(rig.policy)):
        ref = DispatcherActor.start(rig.registry, Services(), rig.db, policy, None, rig.bus)
        outcome = submit(
            ref, ToolCall(call_id="x", tool="fast", arguments=ARGS, context=ctx())
        ).result(5)
        assert outcome.status == "success"
        ref.stop()


def test_a_handle_on_an_actor_of_the_wrong_kind_fails_the_gate_closed(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    wrong = ChildRef(lambda: rig.ref, "policy", PolicyActor)  # the dispatcher is no PolicyActor
    ref = DispatcherActor.start(rig.registry, Services(), rig.db, wrong, None, rig.bus)
    outcome = submit(ref, ToolCall(call_id="x", tool="fast", arguments=ARGS, context=ctx()))
    assert outcome.result(5).code == "permission-denied"
    ref.stop()


def test_bad_pool_settings_are_refused(tmp_path: Path) -> None:
    for bad in (
        {"inline_threads": 0},
        {"lane_limit": 0},
        {"lane_queue": -1},
        {"outbox_max_age": -1},
        {"outbox_max_age": float("nan")},
    ):
        with pytest.raises(ValueError):
            DispatcherActor(
                Registry(),
                Services(),
                tmp_path / "x.db",
                ChildRef(lambda: None, "p", PolicyActor),
                None,
                EventBus(),
                **bad,
            )


def test_an_ability_that_fails_to_construct_is_an_error_on_the_trail(rig: Rig) -> None:
    outcome = rig.run("bad_init", {"act_summary": "x"})
    assert outcome.code == "unhandled-exception"
    (row,) = rig.rows()
    assert (row.tool, row.code, row.act_summary) == ("bad_init", "unhandled-exception", "x")


def test_a_turn_calls_only_its_pinned_and_injected_tools(rig: Rig) -> None:
    pinned = ctx("t-pins", injected=("lookup",), scope="restricted")
    assert rig.run("lookup", context=pinned).status == "success"
    refused = rig.run("fast", context=pinned)
    # No find_tools on this turn: the hint sends the model to what it was given.
    assert refused.code == "unknown-tool" and "tools you were given" in refused.envelope
    finding = ctx("t-find", injected=("lookup", "find_tools"), scope="restricted")
    assert "find_tools" in rig.run("fast", context=finding).envelope
    rig.services.turns.inject("t-pins", ["fast"])
    assert rig.run("fast", context=pinned).status == "success"

"""The permission policy: resolution, decisions, the SQLite store, and the PolicyActor gate."""

from __future__ import annotations

import logging
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec
import pykka
import pytest

from actors.gate.policy import PolicyActor
from chalie.gate import policy as rules
from chalie.gate.policy import PolicyError, PolicyStore
from chalie.store.store_place import Place
from chalie.wire.bus import EventBus
from chalie.wire.events import BackgroundResult, PermissionRequest
from chalie.wire.messages import GateDecision, RequestSettled, ToolCall, TurnContext, decode, encode
from chalie.wire.principals import LOCAL_OWNER
from tools.waiting import wait_until


@pytest.fixture(autouse=True)
def _no_leftover_actors() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all()


def ctx(channel: str = "chat", *, human: bool = True, conversation: str = "conv") -> TurnContext:
    return TurnContext(
        conversation_id=conversation,
        turn_id="turn",
        channel=channel,  # type: ignore[arg-type]
        human_present=human,
    )


# -- pure rules ---------------------------------------------------------------


def test_resolution_prefers_the_exact_action_entry_then_the_tool_entry() -> None:
    table = {("chat", "calendar"): "allow", ("chat", "calendar.delete_event"): "deny"}
    assert rules.resolve(table, "chat", "calendar.delete_event") == "deny"
    assert rules.resolve(table, "chat", "calendar.list_events") == "allow"
    assert rules.resolve(table, "chat", "calendar") == "allow"


def test_an_unset_permission_resolves_to_nothing_and_decides_as_ask() -> None:
    assert rules.resolve({}, "chat", "email.send") is None
    assert rules.decide(None, channel="chat", human_present=True) == "ask-human"


def test_settings_are_per_channel() -> None:
    table = {("chat", "email"): "allow"}
    assert rules.resolve(table, "subconscious", "email") is None


@pytest.mark.parametrize(
    ("channel", "human"),
    [("subconscious", True), ("subconscious", False), ("external_agent", False)],
)
def test_ask_becomes_deny_where_no_human_can_answer(channel: str, human: bool) -> None:
    assert rules.decide("ask", channel=channel, human_present=human) == "deny"
    assert rules.decide(None, channel=channel, human_present=human) == "deny"


def test_an_agent_turn_that_loops_in_a_present_human_asks_that_human() -> None:
    # Only the inbound MCP server sets human_present on external_agent (loop_in_human asks).
    assert rules.decide("ask", channel="external_agent", human_present=True) == "ask-human"
    assert rules.decide("deny", channel="external_agent", human_present=True) == "deny"


def test_ask_becomes_deny_on_chat_without_a_human_present() -> None:
    assert rules.decide("ask", channel="chat", human_present=False) == "deny"


def test_allow_internal_and_deny_decide_without_a_human() -> None:
    for channel in ("chat", "subconscious", "external_agent"):
        assert rules.decide("allow", channel=channel, human_present=False) == "allow"
        assert rules.decide("internal", channel=channel, human_present=False) == "allow"
        assert rules.decide("deny", channel=channel, human_present=True) == "deny"


def test_permission_names_a_tool_or_a_tool_action_and_refuses_junk_actions() -> None:
    assert rules.permission_for("calendar", None) == "calendar"
    assert rules.permission_for("calendar", "delete_event") == "calendar.delete_event"
    for junk in ("../x", "a.b", "DROP TABLE", "x" * 65, "a b"):
        with pytest.raises(PolicyError):
            rules.permission_for("calendar", junk)


def test_answers_map_to_decisions() -> None:
    assert rules.answer_decision("allow_once", "x").allowed
    assert rules.answer_decision("allow_always", "x").decided_by == "human"
    denied = rules.answer_decision("deny", "x")
    assert (denied.decision, denied.code, denied.decided_by) == (
        "deny",
        "permission-denied",
        "human",
    )
    with pytest.raises(PolicyError):
        rules.answer_decision("yes please", "x")


# -- the store ----------------------------------------------------------------


def test_store_persists_entries_across_reopen_in_a_private_file(store_place: Place) -> None:
    path = store_place
    store = PolicyStore(path)
    store.set("chat", "email.send", "allow")
    store.set("subconscious", "email", "deny")
    store.close()
    if isinstance(path, Path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = PolicyStore(path)
    assert again.table == {("chat", "email.send"): "allow", ("subconscious", "email"): "deny"}
    rows = {(r.channel, r.permission, r.decision, r.origin) for r in again.rows()}
    assert ("chat", "email.send", "allow", "set") in rows
    again.close()


def test_store_rejects_bad_channels_permissions_and_decisions(store_place: Place) -> None:
    store = PolicyStore(store_place)
    with pytest.raises(PolicyError, match="channel"):
        store.set("root", "email", "allow")
    with pytest.raises(PolicyError, match="permission"):
        store.set("chat", "../../etc/passwd", "allow")
    with pytest.raises(PolicyError, match="decision"):
        store.set("chat", "email", "sure")
    with pytest.raises(PolicyError):
        store.set("chat", "email'; DROP TABLE policy; --", "allow")
    assert store.rows() == []
    store.close()


def test_a_seen_row_shows_in_the_list_but_does_not_shadow_a_tool_entry(store_place: Place) -> None:
    store = PolicyStore(store_place)
    assert store.record_seen("chat", "calendar.delete_event") is True
    assert store.record_seen("chat", "calendar.delete_event") is False
    store.set("chat", "calendar", "allow")
    assert rules.resolve(store.table, "chat", "calendar.delete_event") == "allow"
    rows = [(r.permission, r.decision, r.origin) for r in store.rows()]
    assert ("calendar.delete_event", "ask", "seen") in rows
    store.close()


def test_reset_forgets_one_pair_one_permission_or_everything(store_place: Place) -> None:
    store = PolicyStore(store_place)
    store.set("chat", "a", "allow")
    store.set("subconscious", "a", "allow")
    store.set("chat", "b", "deny")
    assert store.reset("chat", "a") == 1
    assert ("subconscious", "a") in store.table
    assert store.reset(permission="a") == 1
    assert store.reset() == 1
    assert store.table == {}
    with pytest.raises(PolicyError):
        store.reset(channel="nope")
    store.close()


def test_internal_entries_are_hidden_from_the_list_unless_asked(store_place: Place) -> None:
    store = PolicyStore(store_place)
    store.set("chat", "find_tools", "internal")
    assert store.rows() == []
    assert [r.permission for r in store.rows(include_internal=True)] == ["find_tools"]
    store.close()


# -- the actor -----------------------------------------------------------------


class Gate:
    """A started PolicyActor with its event bus and a subscriber queue for all conversations."""

    def __init__(self, path: Place, expiry: float = 300.0, gate_id: str | None = None) -> None:
        self.bus = EventBus()
        self.events = self.bus.subscribe_queue(None)
        self.ref = PolicyActor.start(path, self.bus, approval_expiry=expiry, gate_id=gate_id)
        self.proxy = self.ref.proxy()

    def gate(
        self,
        permission: str,
        context: TurnContext | None = None,
        *,
        tool: str = "",
        internal: bool = False,
    ) -> Future[GateDecision]:
        fut: Future[GateDecision] = self.proxy.gate(
            "call-1",
            context or ctx(),
            tool or permission.split(".")[0],
            permission,
            internal,
            "doing it",
            {"to": "bob"},
        ).get(timeout=5)
        return fut

    def request(self) -> PermissionRequest:
        """The next permission request published (settlements of earlier ones skipped)."""
        while True:
            event = self.events.queue.get(timeout=5)
            if not isinstance(event, RequestSettled):
                assert isinstance(event, PermissionRequest), event
                return event


def test_allow_and_deny_entries_decide_at_once_by_policy(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db")
    g.proxy.set("chat", "email", "allow").get()
    g.proxy.set("chat", "email.delete", "deny").get()
    assert g.gate("email.send").result(1) == GateDecision(decision="allow", decided_by="policy")
    denied = g.gate("email.delete").result(1)
    assert (denied.decision, denied.code, denied.decided_by) == (
        "deny",
        "permission-denied",
        "policy",
    )
    assert "retry" in denied.hint


def test_internal_abilities_bypass_the_gate_and_record_nothing(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db")
    decision = g.gate("find_tools", ctx("external_agent"), internal=True).result(1)
    assert decision == GateDecision(decision="allow", decided_by="internal")
    assert g.proxy.list(True).get() == []


def test_an_internal_table_entry_allows_as_internal(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db")
    g.proxy.set("subconscious", "memory", "internal").get()
    assert g.gate("memory", ctx("subconscious")).result(1).decided_by == "internal"


@pytest.mark.parametrize(("channel", "human"), [("subconscious", True), ("external_agent", False)])
def test_unseen_permission_is_recorded_and_denied_without_a_human(
    tmp_path: Path, channel: str, human: bool
) -> None:
    g = Gate(tmp_path / "chalie.db")
    decision = g.gate("email.send", ctx(channel, human=human)).result(1)
    assert (decision.decision, decision.code) == ("deny", "permission-denied")
    assert "human must approve" in decision.hint
    assert decision.hint.startswith("do not retry")
    rows = g.proxy.list().get()
    assert [(r.channel, r.permission, r.decision) for r in rows] == [(channel, "email.send", "ask")]
    assert g.events.queue.empty()


def test_chat_without_a_human_present_denies_an_ask(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db")
    decision = g.gate("email.send", ctx("chat", human=False)).result(1)
    assert decision.code == "permission-denied"
    assert g.events.queue.empty()


def test_ask_on_chat_publishes_a_request_to_the_conversation_and_waits(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db")
    mine = g.bus.subscribe_queue("conv-7")
    other = g.bus.subscribe_queue("conv-8")
    fut = g.gate("email.send", ctx(conversation="conv-7"))
    request = mine.queue.get(timeout=5)
    assert isinstance(request, PermissionRequest)
    assert (request.permission, request.tool, request.act_summary) == (
        "email.send",
        "email",
        "doing it",
    )
    assert request.params == {"to": "bob"}
    assert other.queue.empty()
    assert not fut.done()
    assert [p.request_id for p in g.proxy.pending().get()] == [request.request_id]
    assert g.proxy.answer(request.request_id, "allow_once", LOCAL_OWNER).get() is True
    assert fut.result(2) == GateDecision(decision="allow", decided_by="human")
    assert g.proxy.pending().get() == []
    # The gate, the request's one owner, tells the conversation how it ended.
    settled = mine.queue.get(timeout=5)
    assert isinstance(settled, RequestSettled)
    assert (settled.request_id, settled.answer) == (request.request_id, "allow_once")
    # Once is once: the next call asks again.
    g.gate("email.send", ctx(conversation="conv-7"))
    assert isinstance(mine.queue.get(timeout=5), PermissionRequest)


def test_allow_always_is_persisted_as_allow(store_place: Place) -> None:
    path = store_place
    g = Gate(path)
    fut = g.gate("email.send")
    g.proxy.answer(g.request().request_id, "allow_always", LOCAL_OWNER).get()
    assert fut.result(2).allowed
    assert g.gate("email.send").result(1) == GateDecision(decision="allow", decided_by="policy")
    g.ref.stop()
    again = Gate(path)
    assert again.gate("email.send").result(1).decided_by == "policy"


def test_a_human_deny_is_permission_denied(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db")
    fut = g.gate("email.send")
    g.proxy.answer(g.request().request_id, "deny", LOCAL_OWNER).get()
    decision = fut.result(2)
    assert (decision.decision, decision.code, decision.decided_by) == (
        "deny",
        "permission-denied",
        "human",
    )


def test_no_answer_within_the_expiry_is_approval_expired(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db", expiry=0.2)
    fut = g.gate("email.send")
    request = g.request()
    assert request.expires_at <= time.time() + 0.2
    decision = fut.result(3)
    assert (decision.decision, decision.code) == ("deny", "approval-expired")
    assert g.proxy.answer(request.request_id, "allow_once", LOCAL_OWNER).get() is False


def test_answers_to_unknown_requests_are_refused_and_bad_answers_raise(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db")
    assert g.proxy.answer("no-such-request", "allow_once", LOCAL_OWNER).get() is False
    fut = g.gate("email.send")
    rid = g.request().request_id
    with pytest.raises(PolicyError):
        g.proxy.answer(rid, "maybe", LOCAL_OWNER).get()
    assert not fut.done()
    assert g.ref.is_alive()


def test_a_pending_approval_does_not_hold_up_other_decisions(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db")
    g.proxy.set("chat", "clock", "allow").get()
    waiting = g.gate("email.send")
    g.request()
    start = time.monotonic()
    assert g.gate("clock").result(1).allowed
    assert g.proxy.list().get()  # the operator surface answers too
    assert time.monotonic() - start < 1.0
    assert not waiting.done()


def test_the_gate_fails_closed_when_it_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    g = Gate(tmp_path / "chalie.db")

    def broken(*_: Any) -> bool:
        raise RuntimeError("disk on fire")

    g.ref.proxy().store.get().record_seen = broken
    with caplog.at_level(logging.ERROR, logger="chalie.gate.policy"):
        decision = g.gate("email.send").result(1)
    assert (decision.decision, decision.decided_by, decision.code) == (
        "deny",
        "fail-closed",
        "permission-denied",
    )
    assert any("denying" in r.message for r in caplog.records)
    assert g.ref.is_alive()


def test_the_gate_fails_closed_on_a_hostile_permission(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db")
    decision = g.gate("../../etc/passwd").result(1)
    assert decision.decided_by == "fail-closed" and not decision.allowed


def test_stopping_the_gate_denies_pending_requests(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db")
    fut = g.gate("email.send")
    g.request()
    g.ref.stop()
    decision = fut.result(2)
    assert decision.decided_by == "fail-closed" and not decision.allowed


def test_gate_answers_many_concurrent_callers(tmp_path: Path) -> None:
    g = Gate(tmp_path / "chalie.db")
    g.proxy.set("subconscious", "clock", "allow").get()
    results: list[bool] = []

    def caller() -> None:
        for _ in range(20):
            results.append(g.gate("clock", ctx("subconscious")).result(2).allowed)

    threads = [threading.Thread(target=caller) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 100


def test_unknown_channels_are_rejected_when_a_call_is_decoded() -> None:
    good = ToolCall(call_id="c", tool="clock", context=ctx())
    raw = msgspec.msgpack.decode(encode(good))
    raw["context"]["channel"] = "root"
    with pytest.raises(msgspec.ValidationError, match="channel"):
        decode(msgspec.msgpack.encode(raw))


# -- the event bus ---------------------------------------------------------------


def _request(conversation: str) -> PermissionRequest:
    return PermissionRequest(
        request_id="r",
        conversation_id=conversation,
        channel="chat",
        permission="x",
        tool="x",
        expires_at=0.0,
    )


def test_events_reach_their_conversation_and_catch_all_subscribers_only() -> None:
    bus = EventBus()
    mine, other, everyone = (
        bus.subscribe_queue("a"),
        bus.subscribe_queue("b"),
        bus.subscribe_queue(None),
    )
    assert bus.publish("a", _request("a")) == 2
    assert mine.queue.get_nowait().conversation_id == "a"
    assert everyone.queue.get_nowait().conversation_id == "a"
    assert other.queue.empty()
    assert bus.subscribers("a") == 2


def test_a_failing_subscriber_neither_reaches_the_publisher_nor_starves_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus()

    def broken(_: object) -> None:
        raise RuntimeError("subscriber bug")

    bus.subscribe("a", broken)
    good = bus.subscribe_queue("a")
    with caplog.at_level(logging.ERROR, logger="chalie.wire.bus"):
        assert bus.publish("a", _request("a")) == 1
    assert not good.queue.empty()
    assert any("subscriber" in r.message for r in caplog.records)


def test_closing_a_subscription_stops_delivery() -> None:
    bus = EventBus()
    with bus.subscribe_queue("a") as sub:
        pass
    sub.close()  # idempotent
    assert bus.publish("a", _request("a")) == 0
    assert sub.queue.empty() and bus.subscribers("a") == 0


def test_the_one_gate_rule_decides_every_setting() -> None:
    from chalie.gate.policy import gate_rule

    def rule(
        setting: Any, channel: str = "chat", human: bool = True, internal: bool = False
    ) -> Any:
        return gate_rule(
            setting, permission="mail.send", channel=channel, human_present=human, internal=internal
        )

    assert rule(None, internal=True).decided_by == "internal"
    assert rule("allow").allowed and rule("internal").decided_by == "internal"
    assert rule("deny").code == "permission-denied" and "policy denies" in rule("deny").message
    assert rule("ask") is None and rule(None) is None  # a human is asked
    for channel, human in (("chat", False), ("subconscious", True), ("external_agent", False)):
        denied = rule("ask", channel, human)
        assert not denied.allowed and denied.hint.startswith("do not retry")
    # An inbound agent's loop_in_human turn with a connected human: that human is asked.
    assert rule("ask", "external_agent", True) is None


@pytest.mark.slow
def test_a_policy_change_on_one_daemon_reaches_another_within_a_second(pg_cluster: Any) -> None:
    """Two daemons on one PostgreSQL: a setting made on A is in B's table (what B's gate
    reads, lock-free) within a second, by LISTEN/NOTIFY, not polling; a reset too."""
    from chalie.store.store_place import Postgres

    place = Postgres(pg_cluster.new_database())
    a, b = PolicyStore(place), PolicyStore(place)
    try:
        assert b._follower._listening.is_set()  # it listened before it read the table
        for decision in ("allow", "deny"):
            a.set("chat", "email.send", decision)
            started = time.monotonic()
            wait_until(lambda d=decision: b.table.get(("chat", "email.send")) == d, 5, "B's table")
            assert time.monotonic() - started < 1.0
        a.reset("chat", "email.send")
        wait_until(lambda: ("chat", "email.send") not in b.table, 5, "the reset on B")
    finally:
        a.close()
        b.close()


@pytest.mark.slow
def test_a_request_raised_on_one_daemon_is_answered_on_another(pg_cluster: Any) -> None:
    """Two gates (two daemons' PolicyActors) on one PostgreSQL: the owner answers on B a
    request A raised, and the call waiting on A goes on with that answer; a second answer,
    on either, finds nothing pending; an agent may not answer on B either."""
    from chalie.store.store_place import Postgres
    from chalie.wire.principals import Principal

    place = Postgres(pg_cluster.new_database())
    a = Gate(place, gate_id="a")  # type: ignore[arg-type]
    try:
        waiting = a.gate("email.send")
        asked = a.request()
        # B starts while A's request waits: B lists it (A's), and does not adopt it.
        b = Gate(place, gate_id="b")  # type: ignore[arg-type]
        assert [r.request_id for r in b.proxy.pending().get()] == [asked.request_id]
        agent = Principal(scope="agent", id="tok_x", name="x")
        with pytest.raises(PolicyError):
            b.proxy.answer(asked.request_id, "allow_once", agent).get()
        assert not waiting.done()
        assert b.proxy.answer(asked.request_id, "allow_once", LOCAL_OWNER).get() is True
        decision = waiting.result(5)
        assert decision.allowed and decision.decided_by == "human"
        # B answered a live gate's request: the call goes on on A, B runs nothing itself.
        heard_on_b = []
        while not b.events.queue.empty():
            heard_on_b.append(b.events.queue.get())
        assert not any(isinstance(e, BackgroundResult) for e in heard_on_b), heard_on_b
        assert b.proxy.answer(asked.request_id, "deny", LOCAL_OWNER).get() is False
        assert a.proxy.answer(asked.request_id, "deny", LOCAL_OWNER).get() is False
        denied = a.gate("email.send")
        b.proxy.answer(a.request().request_id, "deny", LOCAL_OWNER).get()
        assert denied.result(5).decision == "deny"
        assert b.proxy.pending().get() == [] and a.proxy.pending().get() == []
        # A request of a gate that is gone (its daemon stopped) is answered on B as left open.
        a.gate("email.send")
        left = a.request()
        a.ref.stop()
        assert [r.request_id for r in b.proxy.pending().get()] == [left.request_id]
        c = Gate(place, gate_id="c")  # type: ignore[arg-type]
        assert [r.request_id for r in c.proxy.pending().get()] == [left.request_id]
        assert b.proxy.answer(left.request_id, "deny", LOCAL_OWNER).get() is True
        c.ref.stop()
    finally:
        a.ref.stop()
        b.ref.stop()

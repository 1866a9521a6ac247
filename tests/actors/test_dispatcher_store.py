"""The dispatcher's trail rows on either store engine (tests/store_engines.py): every call
replied to is in the shared store, and on PostgreSQL, where an end is sent without waiting
for the round trip, the dispatcher reads the store's answers itself when no other call
comes (its settle timer), so nothing stays unconfirmed."""

from __future__ import annotations

import pytest

from actors.dispatcher import DispatcherActor, submit
from actors.policy import PolicyActor
from chalie.bus import EventBus
from chalie.messages import ToolCall, TurnContext
from chalie.registry import Registry
from chalie.services import Services
from chalie.store_place import Place, Postgres
from chalie.trail import Trail
from tools.bench.bench_dispatch import QuickNoop
from tools.waiting import wait_until


def test_calls_replied_to_are_recorded_and_confirmed_without_another_call(
    store_place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    confirmed: list[Trail] = []  # trails whose dispatcher confirmed all it sent, unasked
    settle = Trail.settle

    def watched(self: Trail, *, wait: bool = True) -> bool:
        done = settle(self, wait=wait)
        if done and not wait:
            confirmed.append(self)
        return done

    monkeypatch.setattr(Trail, "settle", watched)
    registry = Registry()
    registry.add(QuickNoop, source="test")
    bus = EventBus()
    policy = PolicyActor.start(store_place, bus)
    policy.proxy().set("chat", "quick_noop", "allow").get()
    dispatcher = DispatcherActor.start(registry, Services(), store_place, policy, None, bus)
    try:
        ctx = TurnContext(
            conversation_id="k", turn_id="t", channel="chat", injected=("quick_noop",)
        )
        for i in range(30):
            call = ToolCall(
                call_id=f"c{i}", tool="quick_noop", arguments={"act_summary": "x"}, context=ctx
            )
            assert submit(dispatcher, call).result(10).status == "success"
        if isinstance(store_place, Postgres):
            # No other call comes: the dispatcher confirms what it sent on its own.
            wait_until(lambda: confirmed, timeout=10, what="the rows confirmed")
            assert not confirmed[-1].unsettled()
        reader = Trail(store_place)
        rows = {r.call_id: r.status for r in reader.query(limit=100)}
        reader.close()
        assert rows == {f"c{i}": "success" for i in range(30)}
    finally:
        dispatcher.stop()
        policy.stop()

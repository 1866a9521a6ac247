"""The dispatcher's trail rows on either store engine (tests/store_engines.py): every call
replied to is in the shared store, and on PostgreSQL, where an end is sent without waiting
for the round trip, the dispatcher reads the store's answers itself when no other call
comes (its settle timer), so nothing stays unconfirmed."""

from __future__ import annotations

import msgspec
import pytest

from actors.calls.dispatcher import submit
from chalie.calls.trail import Trail
from chalie.store.store_place import Place, Postgres
from tools.bench.bench_store import dispatcher_on
from tools.waiting import wait_until


def test_calls_replied_to_are_recorded_and_confirmed_without_another_call(
    store_place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    settling: list[Trail] = []  # the trail its dispatcher settles unasked (its timer)
    settle = Trail.settle

    def watched(self: Trail, *, wait: bool = True) -> bool:
        if not wait:
            settling.append(self)
        return settle(self, wait=wait)

    monkeypatch.setattr(Trail, "settle", watched)
    dispatcher, policy, warm = dispatcher_on(store_place)  # 500 calls "c0" to warm up
    try:
        for i in range(1, 31):
            call = msgspec.structs.replace(warm, call_id=f"c{i}")
            assert submit(dispatcher, call).result(10).status == "success"
        if isinstance(store_place, Postgres):
            # No other call comes: the dispatcher confirms what it sent on its own.
            wait_until(
                lambda: settling and not settling[-1].unsettled(),
                timeout=10,
                what="the rows confirmed",
            )
        reader = Trail(store_place)
        rows = {r.call_id: r.status for r in reader.query(limit=1000)}
        reader.close()
        assert len(rows) == 31 and set(rows.values()) == {"success"}
    finally:
        dispatcher.stop()
        policy.stop()

"""The permission_requests table: requests kept across restarts, today's and older ones."""

from __future__ import annotations

import json
import time

from chalie.gate.approvals import ApprovalStore
from chalie.store.store_place import Place
from chalie.wire.events import PermissionRequest
from chalie.wire.principals import Principal


def request(request_id: str = "r1") -> PermissionRequest:
    return PermissionRequest(
        request_id=request_id,
        conversation_id="c1",
        ts=time.time(),
        channel="chat",
        tool="shell",
        permission="shell.run",
        act_summary="listing files",
        params={"command": "ls"},
        expires_at=time.time() + 300,
        principal=Principal(scope="agent", id="tok1", name="claude"),
        asked_by="agent claude",
        reach="ls",
        prompt="Allow shell.run?",
    )


def test_a_stored_request_reads_back_as_the_same_value(store_place: Place) -> None:
    store = ApprovalStore(store_place)
    try:
        made = request()
        store.put(made)
        assert store.left_open() == [made]
        assert not made.recorded  # the gate's, unnumbered: its turn records it
    finally:
        store.close()


def test_a_request_stored_by_an_earlier_version_is_still_pending_after_an_upgrade(
    store_place: Place,
) -> None:
    """Before requests were conversation events they were stored as a wire message:
    tagged ``kind``, with ``origin`` for who asked. Such a row is not lost."""
    store = ApprovalStore(store_place)
    try:
        store.put(request("new"))
        old = {
            "kind": "permission_request",
            "request_id": "old",
            "conversation_id": "c1",
            "channel": "external_agent",
            "permission": "email.send",
            "tool": "email",
            "act_summary": "mailing bob",
            "params": {"to": "bob@example.org"},
            "expires_at": time.time() + 300,
            "principal": {"scope": "agent", "id": "tok1", "name": "claude"},
            "origin": "agent claude",
            "reach": None,
            "prompt": "Allow email.send?",
        }
        with store._lock:
            store._conn.execute(
                "INSERT INTO permission_requests (request_id, conversation_id, permission, "
                "body, created, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
                ("old", "c1", "email.send", json.dumps(old).encode(), 0.0, old["expires_at"]),
            )
        by_id = {r.request_id: r for r in store.left_open()}
        assert set(by_id) == {"old", "new"}
        legacy = by_id["old"]
        assert (legacy.channel, legacy.permission, legacy.asked_by) == (
            "external_agent",
            "email.send",
            "agent claude",
        )
        assert legacy.principal == Principal(scope="agent", id="tok1", name="claude")
    finally:
        store.close()


def test_an_unreadable_row_is_skipped_and_the_others_are_kept(store_place: Place) -> None:
    store = ApprovalStore(store_place)
    try:
        store.put(request("good"))
        with store._lock:
            store._conn.execute(
                "INSERT INTO permission_requests (request_id, conversation_id, permission, "
                "body, created, expires_at) VALUES ('bad', 'c1', 'x', ?, 1.0, 1.0)",
                (b'{"kind": "something_else"}',),
            )
        assert [r.request_id for r in store.left_open()] == ["good"]
    finally:
        store.close()


def test_two_daemons_on_one_store_never_both_take_one_answer(store_place: Place) -> None:
    """An answer raised on daemon A and settled on daemon B is taken once, by one of them;
    an outcome is told once."""
    a, b = ApprovalStore(store_place), ApprovalStore(store_place)
    try:
        made = request("r1")
        a.put(made, parked=True, binding="digest")
        assert [r.request_id for r in b.left_open()] == ["r1"]
        assert b.settle("r1", "allow_once", "owner") is True
        assert a.settle("r1", "deny", "owner") is False  # ended already, on the other one
        assert a.state("r1") == ("allow_once", "owner")
        taken = [s.take_grant("c1", made.permission, "digest") for s in (a, b, a)]
        assert taken == ["r1", None, None]
        told = [s.outcomes("c1") for s in (b, a)]
        assert told == [[("r1", made.permission, "allow_once")], []]
    finally:
        a.close()
        b.close()

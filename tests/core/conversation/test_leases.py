"""A conversation's lease: one daemon at a time runs its turns (chalie.conversation.leases).

Two ConversationLeases on one store play two daemons (each its own connection, as each
daemon has); on both engines.
"""

from __future__ import annotations

import threading

from chalie.conversation.leases import ConversationLeases
from chalie.store.store_place import Place, Postgres
from tools.waiting import wait_until


def test_one_daemon_at_a_time_holds_a_conversation_and_the_other_hears_when_it_is_free(
    store_place: Place,
) -> None:
    a, b = ConversationLeases(store_place), ConversationLeases(store_place)
    try:
        assert a.hold("c1") and a.hold("c1")  # held already: still this daemon's
        assert not b.hold("c1")
        assert b.hold("c2")  # another conversation is free
        wanted: list[str] = []
        follower = a.follow(wanted.append)
        freed = threading.Event()
        b.want("c1", freed.set)
        if isinstance(store_place, Postgres):
            wait_until(lambda: wanted == ["c1"], 10, "A hears that B waits for c1")
        assert not freed.wait(0.3)  # A still holds it
        a.drop("c1")
        assert freed.wait(10)
        assert b.hold("c1") and not a.hold("c1")
        follower.close()
    finally:
        a.close()
        b.close()


def test_a_dead_holders_lease_is_free_at_once_and_a_waiter_hears_of_it(
    store_place: Place,
) -> None:
    """Closing the holder's connection is what a kill -9 does to its session."""
    a, b = ConversationLeases(store_place), ConversationLeases(store_place)
    try:
        assert a.hold("c1") and not b.hold("c1")
        freed = threading.Event()
        b.want("c1", freed.set)
        a.close()
        assert freed.wait(10)
        assert b.hold("c1")
    finally:
        b.close()


def _waiting(conversation_id: str) -> bool:
    return any(t.name == f"lease-wait-{conversation_id}" for t in threading.enumerate())


def test_a_closed_wait_never_calls_back(store_place: Place) -> None:
    a, b = ConversationLeases(store_place), ConversationLeases(store_place)
    try:
        assert a.hold("c1")
        freed = threading.Event()
        b.want("c1", freed.set)
        b.close()
        # The wait's own thread ends without calling back (on PostgreSQL within its 2 s
        # slice); the lease freed afterwards reaches nobody.
        wait_until(lambda: not _waiting("c1"), 30, "the closed wait's thread ending")
        a.drop("c1")
        assert not freed.is_set()
    finally:
        a.close()

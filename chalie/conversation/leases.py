"""Which daemon runs a conversation's turns: one lease a conversation (issue 33 §1).

Several daemons on one store may each get messages for one conversation. Only the
daemon that holds the conversation's lease runs its turns: its TurnActor keeps the
conversation in memory (the history, the next event number, the queue) and writes as
its one writer. The lease is :meth:`chalie.store.sql.Connection.lease`: on PostgreSQL a
session advisory lock, so it goes with the holder's session; a daemon killed mid-turn
lets go of it at once, and the daemon that takes it next closes the turn it left
(:meth:`~chalie.conversation.store.ConversationStore.recover`). On SQLite (one daemon a
file) it is always this daemon's, and nothing here changes what a daemon does.

A message for a conversation leased elsewhere is stored as a queued turn, as behind a
running turn on one daemon. The daemon that got it asks the holder to hand the
conversation over once its turns are done (:data:`WANTED`, a notice every daemon
follows) and waits for the lease (:func:`chalie.store.sql.wait_for_lease`, no polling); once
it is free it takes it, and its TurnActor runs the queued turns from the store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

from chalie.store.sql import Follower, LeaseWait, follow, open_connection, wait_for_lease
from chalie.store.store_place import Place

# The notice "a daemon waits for this conversation" (payload: the conversation id).
WANTED: Final = "chalie_conversation_wanted"
PREFIX: Final = "conversation:"


class ConversationLeases:
    """This daemon's conversation leases, on one connection of their own (the leases live
    as long as it does: closing it lets go of them all). Safe from any thread."""

    def __init__(self, place: Place) -> None:
        self.place = place
        self._conn = open_connection(place)
        self._lock = threading.Lock()
        self._waits: dict[str, LeaseWait] = {}

    def hold(self, conversation_id: str) -> bool:
        """Take the conversation's lease (True also when this daemon holds it already);
        False: another daemon holds it."""
        with self._lock:
            return self._conn.lease(PREFIX + conversation_id)

    def drop(self, conversation_id: str) -> None:
        """Let go of the conversation's lease (its TurnActor has stopped)."""
        with self._lock:
            self._conn.release(PREFIX + conversation_id)

    def want(self, conversation_id: str, free: Callable[[], None]) -> None:
        """Ask the daemon holding the conversation to hand it over once its turns are done,
        and call ``free()`` (on a thread of its own) when the lease is free; one wait a
        conversation (asking again only repeats the notice)."""
        with self._lock:
            if conversation_id not in self._waits:

                def freed() -> None:
                    with self._lock:
                        self._waits.pop(conversation_id, None)
                    free()

                self._waits[conversation_id] = wait_for_lease(
                    self.place, PREFIX + conversation_id, freed
                )
            self._conn.notify(WANTED, conversation_id)

    def follow(self, wanted: Callable[[str], None]) -> Follower:
        """Call ``wanted(conversation_id)`` when another daemon waits for a conversation."""

        def told(payload: str) -> None:
            if payload:  # "" is a resync after a lost connection: nothing to hand over
                wanted(payload)

        return follow(self.place, WANTED, told)

    def close(self) -> None:
        with self._lock:
            waits, self._waits = list(self._waits.values()), {}
            self._conn.close()
        for wait in waits:
            wait.close()

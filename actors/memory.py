"""MemoryKeeper: the supervised owner of the memory book's index lifecycle.

Lifecycle, in order:

1. The composition root hands the book to the abilities once, before the tree
   starts (``Services.memory``, a :class:`chalie.memory.turns.TurnMemory`:
   ``chalie_app/memory_part.py``); nothing is loaded until the first memory
   call (the index opens, or is rebuilt from chalie.db).
2. ``on_start``: on a shared store the index follows the other daemons'
   writes while this actor runs (``MemoryBook.follow``, LISTEN/NOTIFY).
3. Calls go straight to the thread-safe book from the dispatcher's inline
   threads and the control socket's handlers; this actor's mailbox carries
   none of them, so a restart of this actor interrupts none.
4. ``on_stop`` stops following and saves the index with the generation it reflects, so the next
   start opens it without a rebuild (a call after that opens the saved index
   again; what it writes is in the table, and a stale index is rebuilt).
"""

from __future__ import annotations

import logging
from typing import Any

from actors.actor import SupervisedActor
from chalie.memory.book import MemoryBook
from chalie.store.sql import Follower

log = logging.getLogger("chalie.memory")


class MemoryKeeper(SupervisedActor):
    def __init__(self, book: MemoryBook) -> None:
        super().__init__()
        self._book = book
        self._following: Follower | None = None

    def on_start(self) -> None:
        # On a shared store the index follows the other daemons' writes while this runs.
        self._following = self._book.follow()

    def on_end(self) -> None:
        if self._following is not None:
            self._following.close()
            self._following = None
        try:
            self._book.close()
        except Exception:
            log.exception("saving the memory index failed; it is rebuilt at the next start")

    def status(self) -> dict[str, Any]:
        return self._book.status()

"""MemoryKeeper: the supervised owner of the memory book's lifecycle.

Lifecycle, in order:

1. ``on_start`` hands the book to the abilities (``Services.memory``, a
   :class:`chalie.memory.turns.TurnMemory`); nothing is loaded until the
   first memory call (the index opens, or is rebuilt from chalie.db).
2. Calls go straight to the thread-safe book from the dispatcher's inline
   threads and the control socket's handlers; this actor's mailbox carries
   none of them.
3. ``on_stop`` withdraws the book from the abilities and saves the index with
   the generation it reflects, so the next start opens it without a rebuild.
"""

from __future__ import annotations

import logging
from typing import Any

from actors.actor import SupervisedActor
from chalie.memory.book import MemoryBook
from chalie.memory.turns import TurnMemory
from chalie.services import Services
from chalie.sql import Follower
from chalie.store_place import Place

log = logging.getLogger("chalie.memory")


class MemoryKeeper(SupervisedActor):
    def __init__(
        self,
        book: MemoryBook,
        services: Services,
        db_path: Place,
        owner_readers: Any = (),
        zone: str | None = None,
    ) -> None:
        super().__init__()
        self._book = book
        self._services = services
        self._desk = TurnMemory(book, db_path, owner_readers=owner_readers, zone=zone)
        self._following: Follower | None = None

    def on_start(self) -> None:
        # On a shared store the index follows the other daemons' writes while this runs.
        self._following = self._book.follow()
        self._services.memory = self._desk

    def on_end(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._following is not None:
            self._following.close()
            self._following = None
        if self._services.memory is self._desk:
            self._services.memory = None
        try:
            self._book.close()
        except Exception:
            log.exception("saving the memory index failed; it is rebuilt at the next start")
        self._desk.close()

    def status(self) -> dict[str, Any]:
        return self._book.status()

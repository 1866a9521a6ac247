"""What a turn's memory call needs from the runtime: whose memory it is, and what the turn has read.

:class:`TurnMemory` is handed to the ``memory`` ability through
``Services.memory``. It answers three questions about the calling turn, from
the runtime and never from the model:

- what time it is for the person (their zone, ``[accounts] zone``): relative
  times in a memory call are read in it;
- whose memories the turn reads and writes (:mod:`chalie.memory.whose`, from
  the channel and the conversation's origin);
- which untrusted sources the conversation has read: tools whose results
  come from outside (MCP servers, the web, mail; anything not in
  :data:`TRUSTED_TOOLS`). A memory stored after such a result is marked with
  them, so a prompt-injected page cannot pass its words off as the person's.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Final

from chalie.memory import when
from chalie.memory.book import MemoryBook
from chalie.memory.whose import principal_of, readable_by
from chalie.store.sql import Connection, StoreError, open_connection
from chalie.store.store_place import Place
from chalie.wire.messages import TurnContext

# Tools whose results carry no outside content: the meta-tools, memory itself,
# pure computations and the scheduler. Everything else is an untrusted source.
TRUSTED_TOOLS: Final = frozenset(
    {"find_tools", "find_skills", "memory", "clock", "calculator", "reminder"}
)
# The trail has no index on conversation_id (its insert is on the hot path):
# only the newest rows are looked at.
TRAIL_WINDOW: Final = 20_000
ORIGINS_KEPT: Final = 10_000


class TurnMemory:
    """The book plus the two questions above; thread-safe."""

    def __init__(
        self,
        book: MemoryBook,
        db_path: Place,
        *,
        owner_readers: Collection[str] = (),
        zone: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.book = book
        self.owner_readers = frozenset(owner_readers)
        # The person's time zone: relative times ("last week") are read in it.
        self.zone = when.zone(zone)
        self._clock = clock
        self._conn: Connection = open_connection(db_path)
        self._lock = threading.Lock()
        self._origins: OrderedDict[str, str] = OrderedDict()

    def now(self) -> dt.datetime:
        """The person's clock: now, in their zone."""
        return dt.datetime.fromtimestamp(self._clock(), self.zone)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _origin(self, conversation_id: str) -> str:
        with self._lock:
            found = self._origins.get(conversation_id)
            if found is not None:
                return found
            try:
                row = self._conn.execute(
                    "SELECT origin FROM conversations WHERE id = ?", (conversation_id,)
                ).fetchone()
            except StoreError:  # no conversations table yet (a bare test home)
                row = None
            origin = str(row[0]) if row else ""
            if row:  # an origin never changes once the conversation exists
                self._origins[conversation_id] = origin
                if len(self._origins) > ORIGINS_KEPT:
                    self._origins.popitem(last=False)
            return origin

    def principal(self, context: TurnContext) -> str:
        origin = "" if context.principal is not None else self._origin(context.conversation_id)
        return principal_of(context.channel, origin, context.principal)

    def readable(self, context: TurnContext) -> tuple[str, ...]:
        who = context.principal
        name = who.name if who is not None and not who.is_owner else None
        return readable_by(self.principal(context), self.owner_readers, name)

    def untrusted_sources(self, context: TurnContext) -> tuple[str, ...]:
        """The untrusted tools whose results this conversation's model has seen, by name."""
        return self.untrusted_in(context.conversation_id)

    def untrusted_in(self, conversation_id: str) -> tuple[str, ...]:
        with self._lock:
            try:
                rows = self._conn.execute(
                    "SELECT DISTINCT tool FROM trail WHERE id > "
                    "(SELECT COALESCE(MAX(id), 0) FROM trail) - ? "
                    "AND conversation_id = ? AND status = 'success'",
                    (TRAIL_WINDOW, conversation_id),
                ).fetchall()
            except StoreError:  # no trail table yet
                rows = []
        return tuple(sorted(str(r[0]) for r in rows if str(r[0]) not in TRUSTED_TOOLS))

"""Kept ``loop_in_human`` exchanges: what agents asked Chalie, for owners who were not there.

Every :class:`~chalie.mcp_server.exchange.AgentExchange` surfaced to the people is
first written here (:meth:`KeptExchanges.keep`), numbered (its ``kept`` id), then
published to the owners connected at that moment. One an owner client received is
``seen``. Lifecycle of an exchange, in order:

1. kept, unseen;
2. seen: published while an owner client was connected, or handed to the first owner
   client that connects later (:meth:`KeptExchanges.backlog`, what a chat session gets
   first). A ``permission`` exchange is handed to every owner client that connects while
   its request is pending (``permission_requests``, chalie.gate.approvals), seen or not: an
   owner who connects later answers it there; once its request has ended it is not;
3. dropped once more than :data:`MAX_KEPT` newer ones are kept.

``chalie mcp exchanges`` and the Brain's Approvals page list the kept ones, seen or not.
A kept ``permission`` exchange is answered as its request is (``chalie policy answer``,
the Brain, a chat client's ``answer`` frame) while that request is pending.
"""

from __future__ import annotations

import time
from typing import Final

import msgspec

from chalie.mcp_server.exchange import AgentExchange
from chalie.store.sql import Store
from chalie.store.store_place import Place

MAX_KEPT: Final = 2000
# At most this many unseen exchanges are handed to an owner client that connects.
BACKLOG: Final = 200

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS agent_exchanges (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    phase           TEXT NOT NULL,
    request_id      TEXT NOT NULL DEFAULT '',  -- phase permission: its request
    body            BLOB NOT NULL,
    ts              REAL NOT NULL,
    seen            INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS agent_exchanges_unseen ON agent_exchanges (seen, id);
CREATE INDEX IF NOT EXISTS agent_exchanges_request ON agent_exchanges (request_id);
"""

_decoder: Final = msgspec.json.Decoder(AgentExchange)


class Kept(msgspec.Struct, frozen=True, kw_only=True):
    """A kept exchange as the listings show it."""

    exchange: AgentExchange
    seen: bool


class KeptExchanges(Store):
    """The ``agent_exchanges`` table; one connection, safe from any thread."""

    def __init__(self, path: Place) -> None:
        super().__init__(path, _SCHEMA, racing=True)

    def keep(self, exchange: AgentExchange) -> AgentExchange:
        """Store it, unseen; the exchange with its ``kept`` id."""
        with self._lock, self._conn.transaction() as tx:
            row = tx.execute(
                "INSERT INTO agent_exchanges (conversation_id, phase, request_id, body, ts) "
                "VALUES (?, ?, ?, ?, ?) RETURNING id",
                (exchange.conversation_id, exchange.phase, exchange.request_id, b"", exchange.ts),
            ).fetchone()
            kept = msgspec.structs.replace(exchange, kept=int(row[0]))
            tx.execute(
                "UPDATE agent_exchanges SET body = ? WHERE id = ?",
                (msgspec.json.encode(kept), kept.kept),
            )
            tx.execute("DELETE FROM agent_exchanges WHERE id <= ?", (kept.kept - MAX_KEPT,))
        return kept

    def seen(self, kept_id: int) -> None:
        with self._lock:
            self._conn.execute("UPDATE agent_exchanges SET seen = 1 WHERE id = ?", (kept_id,))

    def backlog(self, now: float | None = None) -> list[AgentExchange]:
        """What an owner client that connects gets, oldest first (at most :data:`BACKLOG`):
        the unseen exchanges, now seen, and every ``permission`` one whose request is
        still pending and unexpired (answerable there)."""
        now = time.time() if now is None else now
        with self._lock, self._conn.transaction():
            asks_kept = bool(self._conn.columns("permission_requests"))
            unseen = self._conn.execute(
                "SELECT id, body FROM agent_exchanges WHERE seen = 0 AND phase != 'permission' "
                "ORDER BY id LIMIT ?",
                (BACKLOG,),
            ).fetchall()
            self._conn.executemany(
                "UPDATE agent_exchanges SET seen = 1 WHERE id = ?", [(r[0],) for r in unseen]
            )
            open_asks = (
                self._conn.execute(
                    "SELECT e.id, e.body FROM agent_exchanges e JOIN permission_requests r "
                    "ON r.request_id = e.request_id WHERE e.phase = 'permission' "
                    "AND r.state = 'pending' AND r.expires_at > ? ORDER BY e.id LIMIT ?",
                    (now, BACKLOG),
                ).fetchall()
                if asks_kept  # else no request was ever stored in this store
                else []
            )
            self._conn.executemany(
                "UPDATE agent_exchanges SET seen = 1 WHERE id = ?", [(r[0],) for r in open_asks]
            )
        rows = sorted([*unseen, *open_asks])[:BACKLOG]
        return [_decoder.decode(body) for _, body in rows]

    def recent(self, limit: int = 50, conversation_id: str | None = None) -> list[Kept]:
        """The newest kept exchanges first, seen or not (of one conversation if given)."""
        where, args = (
            ("WHERE conversation_id = ?", [conversation_id]) if conversation_id else ("", [])
        )
        with self._lock:
            rows = self._conn.execute(
                f"SELECT body, seen FROM agent_exchanges {where} ORDER BY id DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [Kept(exchange=_decoder.decode(body), seen=bool(seen)) for body, seen in rows]

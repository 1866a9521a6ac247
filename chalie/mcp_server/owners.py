"""Which token started which conversation, so an agent continues only its own exchanges.

One table in ``chalie.db``, keyed by the token's stable id (never its name: a
new token reusing a revoked token's name inherits nothing). A conversation id
an agent sends back is accepted only for the token that received it; any other
token gets ``unknown-conversation`` (the same answer as for an id that never
existed).

Migration of a table made before token ids: a row gets the id of the token of
its name only when that token was created before the conversation (the token
that started it); otherwise (a name since reused) no token owns it.

An owner never changes once recorded (first owner wins), so owners already
seen are answered from memory (bounded): the MCP server asks on its event
loop for every continued exchange, and a known one costs no database read.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from typing import Final

from chalie.store.sql import Connection, StoreError, open_connection
from chalie.store.store_place import Place

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mcp_conversations (
    conversation_id TEXT PRIMARY KEY,
    token_name TEXT NOT NULL,
    agent_name TEXT NOT NULL,
    project TEXT NOT NULL,
    created REAL NOT NULL,
    token_id TEXT
)
"""
_MIGRATE: Final = "ALTER TABLE mcp_conversations ADD COLUMN token_id TEXT"
# Needs the tokens table (chalie.gate.tokens) migrated first: the daemon opens it before.
_FILL: Final = """
UPDATE mcp_conversations SET token_id = (
    SELECT t.id FROM tokens t
    WHERE t.name = mcp_conversations.token_name AND t.created <= mcp_conversations.created
) WHERE token_id IS NULL
"""
KNOWN_MAX: Final = 100_000  # owners kept in memory


class ConversationOwners:
    """conversation id → the id of the token that owns it (one connection, any thread)."""

    def __init__(self, db_path: Place) -> None:
        self._conn: Connection = open_connection(db_path)
        self._lock = threading.Lock()
        self._known: OrderedDict[str, str] = OrderedDict()  # guarded by _lock
        self._conn.script(_SCHEMA)
        if "token_id" not in self._conn.columns("mcp_conversations"):
            with contextlib.suppress(StoreError):  # another process won
                self._conn.script(_MIGRATE)
            if self._conn.columns("tokens"):  # no tokens table: no owner
                self._conn.execute(_FILL)

    def known(self, conversation_id: str) -> str | None:
        """The owner if it is in memory (no database access, never waits on a write)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._known.get(conversation_id)
        finally:
            self._lock.release()

    def owner(self, conversation_id: str) -> str | None:
        with self._lock:
            found = self._known.get(conversation_id)
            if found is not None:
                return found
            row = self._conn.execute(
                "SELECT token_id FROM mcp_conversations WHERE conversation_id = ?",
                (conversation_id,),
            ).fetchone()
            if row is None or row[0] is None:
                return None
            self._remember(conversation_id, str(row[0]))
            return str(row[0])

    def _remember(self, conversation_id: str, token_id: str) -> None:
        self._known[conversation_id] = token_id
        if len(self._known) > KNOWN_MAX:
            self._known.popitem(last=False)

    def record(
        self,
        conversation_id: str,
        token_id: str,
        agent_name: str,
        project: str,
        token_name: str = "",
    ) -> None:
        # First owner wins: an id is never handed from one token to another.
        with self._lock:
            self._conn.execute(
                "INSERT INTO mcp_conversations "
                "(conversation_id, token_name, agent_name, project, created, token_id) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (conversation_id, token_name, agent_name, project, time.time(), token_id),
            )
            row = self._conn.execute(
                "SELECT token_id FROM mcp_conversations WHERE conversation_id = ?",
                (conversation_id,),
            ).fetchone()
            if row is not None and row[0] is not None:
                self._remember(conversation_id, str(row[0]))

    def close(self) -> None:
        with self._lock:
            self._conn.close()

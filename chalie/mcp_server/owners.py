"""Which token started which conversation, so an agent continues only its own exchanges.

One table in ``chalie.db``. A conversation id an agent sends back is accepted
only for the token that received it; any other token gets
``unknown-conversation`` (the same answer as for an id that never existed).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from chalie.db import connect

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mcp_conversations (
    conversation_id TEXT PRIMARY KEY,
    token_name TEXT NOT NULL,
    agent_name TEXT NOT NULL,
    project TEXT NOT NULL,
    created REAL NOT NULL
)
"""


class ConversationOwners:
    """conversation id → the token name that owns it (one connection, any thread)."""

    def __init__(self, db_path: Path) -> None:
        self._conn: sqlite3.Connection = connect(db_path)
        self._lock = threading.Lock()
        self._conn.execute(_SCHEMA)

    def owner(self, conversation_id: str) -> str | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT token_name FROM mcp_conversations WHERE conversation_id = ?",
                (conversation_id,),
            ).fetchone()
        return str(row[0]) if row else None

    def record(self, conversation_id: str, token_name: str, agent_name: str, project: str) -> None:
        # First owner wins: an id is never handed from one token to another.
        with self._lock:
            self._conn.execute(
                "INSERT OR IGNORE INTO mcp_conversations VALUES (?, ?, ?, ?, ?)",
                (conversation_id, token_name, agent_name, project, time.time()),
            )

    def close(self) -> None:
        with self._lock:
            self._conn.close()

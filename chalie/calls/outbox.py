"""The background-result outbox: final envelopes of ``async`` calls, kept until acknowledged.

Lifecycle of one result:

1. :meth:`Outbox.put`: stored (committed) when the call ends, before it is
   published on the EventBus; the stored id travels as
   ``BackgroundResult.outbox_id``.
2. The conversation code delivers it (live from the EventBus, or later from
   :meth:`Outbox.pending` after a restart or a reconnect) and calls
   :meth:`Outbox.ack` with the ids it has taken into the conversation.
3. An acknowledged row is marked delivered and never handed out again.

Bounds: a row older than ``max_age`` seconds is dropped, delivered or not;
past ``max_rows`` undelivered rows the oldest are dropped first (both are
logged). Pruning runs at open and on every :data:`PRUNE_EVERY`-th put.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Iterable
from typing import Final

import msgspec

from chalie.process.config import OUTBOX_MAX_AGE, OUTBOX_MAX_ROWS
from chalie.store.sql import open_connection
from chalie.store.store_place import Place
from chalie.wire.events import BackgroundResult

log = logging.getLogger("chalie.calls.outbox")

DEFAULT_MAX_AGE: Final = OUTBOX_MAX_AGE
DEFAULT_MAX_ROWS: Final = OUTBOX_MAX_ROWS
MAX_PENDING: Final = 1000
MAX_ACK: Final = 10_000
PRUNE_EVERY: Final = 100

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS outbox (
    id              INTEGER PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    call_id         TEXT NOT NULL,
    tool            TEXT NOT NULL,
    status          TEXT NOT NULL,
    code            TEXT,
    envelope        TEXT NOT NULL,
    rich            BLOB,
    created_at      REAL NOT NULL,
    delivered_at    REAL
)
"""
_INDEX: Final = (
    "CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (conversation_id, id) "
    "WHERE delivered_at IS NULL"
)

_json = msgspec.json.Encoder()


class OutboxError(ValueError):
    """A bad argument to the outbox; the message names it."""


def check_limits(max_age: float, max_rows: int = DEFAULT_MAX_ROWS) -> None:
    """Raise OutboxError naming a bad limit."""
    if (
        isinstance(max_age, bool)
        or not isinstance(max_age, int | float)
        or not (math.isfinite(max_age) and max_age > 0)
    ):
        raise OutboxError(f"max_age must be a positive number of seconds, not {max_age!r}")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise OutboxError(f"max_rows must be a positive integer, not {max_rows!r}")


class Outbox:
    """The outbox table in the daemon's SQLite file; safe to share between threads."""

    def __init__(
        self,
        path: Place,
        *,
        max_age: float = DEFAULT_MAX_AGE,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> None:
        check_limits(max_age, max_rows)
        self._max_age = float(max_age)
        self._max_rows = max_rows
        self._lock = threading.Lock()
        self._conn = open_connection(path)
        self._conn.script(_SCHEMA + ";\n" + _INDEX)
        self._puts = 0
        self.prune()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def put(self, result: BackgroundResult) -> BackgroundResult:
        """Store one result (committed on return); returns it with its ``outbox_id``."""
        rich = _json.encode(result.rich) if result.rich is not None else None
        with self._lock:
            cur = self._conn.execute(
                "INSERT INTO outbox (conversation_id, call_id, tool, status, code, envelope, "
                "rich, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (
                    result.conversation_id,
                    result.call_id,
                    result.tool,
                    result.status,
                    result.code,
                    result.envelope,
                    rich,
                    time.time(),
                ),
            )
            row_id = cur.fetchone()[0]
            self._puts += 1
            due = self._puts % PRUNE_EVERY == 0
        if due:
            self.prune()
        return msgspec.structs.replace(result, outbox_id=int(row_id or 0))

    def pending(self, conversation_id: str, *, limit: int = MAX_PENDING) -> list[BackgroundResult]:
        """The conversation's undelivered results, oldest first."""
        if not isinstance(conversation_id, str) or not conversation_id:
            raise OutboxError("conversation_id must be a non-empty string")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PENDING:
            raise OutboxError(f"limit must be an integer from 1 to {MAX_PENDING}")
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, conversation_id, call_id, tool, status, code, envelope, rich "
                "FROM outbox WHERE conversation_id = ? AND delivered_at IS NULL "
                "AND created_at >= ? ORDER BY id LIMIT ?",
                (conversation_id, time.time() - self._max_age, limit),
            ).fetchall()
        return [
            BackgroundResult(
                outbox_id=i,
                conversation_id=c,
                call_id=call,
                tool=tool,
                status=status,
                code=code,
                envelope=env,
                rich=msgspec.json.decode(rich) if rich else None,
            )
            for i, c, call, tool, status, code, env, rich in rows
        ]

    def waiting(self) -> list[str]:
        """The conversations with an undelivered result, oldest result first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT conversation_id FROM outbox WHERE delivered_at IS NULL "
                "AND created_at >= ? GROUP BY conversation_id ORDER BY MIN(id)",
                (time.time() - self._max_age,),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def ack(self, ids: Iterable[int]) -> int:
        """Mark results delivered; returns how many were newly marked."""
        try:
            items = list(itertools.islice(iter(ids), MAX_ACK + 1))
        except TypeError:
            raise OutboxError("ids must be a list of outbox ids") from None
        if len(items) > MAX_ACK:
            raise OutboxError(f"at most {MAX_ACK} ids may be acknowledged at once")
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 < i < 2**63 for i in items):
            raise OutboxError("every id must be a positive integer (an outbox_id)")
        wanted = sorted(set(items))
        if not wanted:
            return 0
        now = time.time()
        marked = 0
        with self._lock, self._conn.transaction() as tx:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                cur = tx.execute(
                    f"UPDATE outbox SET delivered_at = ? WHERE delivered_at IS NULL "
                    f"AND id IN ({','.join('?' * len(chunk))})",
                    (now, *chunk),
                )
                marked += cur.rowcount
        return marked

    def prune(self) -> int:
        """Drop rows past the age limit and undelivered rows past the count limit."""
        with self._lock:
            old = self._conn.execute(
                "DELETE FROM outbox WHERE created_at < ?", (time.time() - self._max_age,)
            ).rowcount
            over = self._conn.execute(
                "DELETE FROM outbox WHERE delivered_at IS NULL AND id NOT IN (SELECT id FROM "
                "outbox WHERE delivered_at IS NULL ORDER BY id DESC LIMIT ?)",
                (self._max_rows,),
            ).rowcount
            delivered = self._conn.execute(
                "DELETE FROM outbox WHERE delivered_at IS NOT NULL AND id NOT IN (SELECT id "
                "FROM outbox WHERE delivered_at IS NOT NULL ORDER BY id DESC LIMIT ?)",
                (self._max_rows,),
            ).rowcount
        if old or over:
            log.warning(
                "outbox dropped %d result(s) past the age limit and %d past the row limit",
                old,
                over,
            )
        return old + over + delivered


__all__ = ["DEFAULT_MAX_AGE", "DEFAULT_MAX_ROWS", "Outbox", "OutboxError", "check_limits"]

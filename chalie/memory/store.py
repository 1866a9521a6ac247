"""The ``memories`` table in the store: every memory with its provenance and its vector.

The vector (float16, the embedder's model id beside it) is kept so the
indexes can be rebuilt without embedding everything again. ``generation``
in ``memory_meta`` is bumped in the same transaction as every change: an
index saved at generation N is current only while the table is at N.

Several daemons on one store: every change also sends a notice (:data:`CHANGED`, sent
when its transaction commits) naming the store that wrote it and the memories it changed,
so each daemon's own indexes follow the shared table while it runs
(:meth:`chalie.memory.book.MemoryBook.follow`).
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import numpy as np

from chalie.memory.records import KINDS, SOURCES, Kind, Memory, Source
from chalie.store.sql import Connection, Store, open_connection
from chalie.store.store_place import Place

# The notice of a change: "<writer>:<id>,<id>..." (":*" when too many to name: all of them).
CHANGED: Final = "chalie_memories"
# PostgreSQL's notice payloads stop short of 8000 bytes.
_NAMED_IDS: Final = 500

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS memories (
    id              INTEGER PRIMARY KEY,
    principal       TEXT NOT NULL,
    kind            TEXT NOT NULL,
    text            TEXT NOT NULL,
    place           TEXT,
    at              TEXT,
    people          TEXT NOT NULL DEFAULT '[]',
    tags            TEXT NOT NULL DEFAULT '[]',
    skill           TEXT,
    source          TEXT NOT NULL,
    untrusted       TEXT NOT NULL DEFAULT '[]',
    conversation_id TEXT,
    created         REAL NOT NULL,
    updated         REAL NOT NULL,
    merged          INTEGER NOT NULL DEFAULT 0,
    model_id        TEXT NOT NULL,
    vector          BLOB NOT NULL,
    forgotten       REAL,
    superseded_by   INTEGER,
    forgotten_after TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS memories_by_principal ON memories (principal, updated);
CREATE INDEX IF NOT EXISTS memories_by_skill ON memories (skill) WHERE skill IS NOT NULL;
CREATE TABLE IF NOT EXISTS memory_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_COLUMNS: Final = (
    "id, principal, kind, text, place, at, people, tags, skill, source, untrusted, "
    "conversation_id, created, updated, merged, forgotten, superseded_by, forgotten_after"
)
# Columns a table made by an older version lacks.
_ADDED: Final = {
    "forgotten": "ALTER TABLE memories ADD COLUMN forgotten REAL",
    "superseded_by": "ALTER TABLE memories ADD COLUMN superseded_by INTEGER",
    "forgotten_after": "ALTER TABLE memories ADD COLUMN forgotten_after TEXT NOT NULL DEFAULT '[]'",
}
# Only live memories: a forgotten one waits apart (restorable) until it is purged.
LIVE: Final = "forgotten IS NULL"


def _names(column: str) -> tuple[str, ...]:
    """A JSON list column (most are empty: no decoding for those)."""
    return () if column == "[]" else tuple(json.loads(column))


def _row(r: Sequence[Any]) -> Memory:
    kind: Kind = r[2] if r[2] in KINDS else "fact"
    source: Source = r[9] if r[9] in SOURCES else "person"
    return Memory(
        id=int(r[0]),
        principal=str(r[1]),
        kind=kind,
        text=str(r[3]),
        place=r[4],
        time=r[5],
        people=_names(r[6]),
        tags=_names(r[7]),
        skill=r[8],
        source=source,
        untrusted=_names(r[10]),
        conversation_id=r[11],
        created=float(r[12]),
        updated=float(r[13]),
        merged=int(r[14]),
        forgotten=None if r[15] is None else float(r[15]),
        superseded_by=None if r[16] is None else int(r[16]),
        forgotten_after=_names(r[17]),
    )


def _written(memory: Memory) -> tuple[Any, ...]:
    """A memory's columns from ``principal`` to ``conversation_id``, as stored (lists as JSON)."""
    return (
        memory.principal,
        memory.kind,
        memory.text,
        memory.place,
        memory.time,
        json.dumps(list(memory.people)),
        json.dumps(list(memory.tags)),
        memory.skill,
        memory.source,
        json.dumps(list(memory.untrusted)),
        memory.conversation_id,
    )


def pack(vector: np.ndarray[Any, Any]) -> bytes:
    return np.asarray(vector, dtype=np.float16).tobytes()


def unpack(blob: bytes, dim: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    out = np.frombuffer(blob, dtype=np.float16)
    if out.shape != (dim,):
        raise ValueError(f"stored vector has {out.size} values, expected {dim}")
    return out.astype(np.float32)


class MemoryStore(Store):
    """One connection; callers may use it from any thread (a lock serialises it)."""

    def __init__(self, db_path: Place) -> None:
        super().__init__(db_path, SCHEMA)
        with self._lock:
            self._add_columns("memories", _ADDED)
            # A commit that fills the WAL past SQLite's threshold copies it into the file
            # (tens of ms): this connection's never do, so a store stays short.
            # :meth:`checkpoint` does it instead, off the write path (the memory index's
            # committer thread); chalie.db's other connections keep checkpointing as before.
            self._conn.defer_checkpoints()
        self._spare: Connection | None = None
        self._spare_lock = threading.Lock()
        # Who wrote a change (its notice): a daemon's book skips its own.
        self.writer = secrets.token_hex(8)

    def close(self) -> None:
        super().close()
        with self._spare_lock:
            if self._spare is not None:
                self._spare.close()
                self._spare = None

    def checkpoint(self) -> None:
        """Copy the WAL into the database file as far as readers allow (PASSIVE: blocks no
        reader and no writer), on a connection of its own."""
        with self._spare_lock:
            if self._spare is None:
                self._spare = open_connection(self.place)
            self._spare.checkpoint()

    # -- generation -----------------------------------------------------------------
    def generation(self) -> int:
        with self._lock:
            row = self._conn.execute(
                "SELECT value FROM memory_meta WHERE key = 'generation'"
            ).fetchone()
        return int(row[0]) if row else 0

    def _bump(self, ids: Sequence[int] = ()) -> None:
        """A change (in the caller's transaction): the generation moves on, and every daemon
        following the table hears which memories changed once it commits."""
        self._conn.execute(
            "INSERT INTO memory_meta (key, value) VALUES ('generation', '1') ON CONFLICT(key) "
            "DO UPDATE SET value = CAST(CAST(memory_meta.value AS BIGINT) + 1 AS TEXT)"
        )
        named = ",".join(str(i) for i in ids) if 0 < len(ids) <= _NAMED_IDS else "*"
        self._conn.notify(CHANGED, f"{self.writer}:{named}")

    # -- writes -----------------------------------------------------------------------
    def insert(self, memory: Memory, model_id: str, vector: np.ndarray[Any, Any]) -> int:
        """A new row; its id is above every id this table ever gave (a purged memory's
        included: ``last_id`` in ``memory_meta`` remembers the highest). ``last_id`` is
        counted up first, in the transaction: its row lock makes two daemons on one store
        take two ids."""
        with self._lock, self._conn.transaction():
            self._conn.execute(
                "INSERT INTO memory_meta (key, value) VALUES ('last_id', '0') "
                "ON CONFLICT DO NOTHING"
            )
            counted = self._conn.execute(
                "UPDATE memory_meta SET value = CAST(CAST(value AS BIGINT) + 1 AS TEXT) "
                "WHERE key = 'last_id' RETURNING value"
            ).fetchone()[0]
            top = self._conn.execute("SELECT COALESCE(MAX(id), 0) FROM memories").fetchone()[0]
            new_id = max(int(counted), int(top) + 1)
            self._conn.execute(
                f"INSERT INTO memories ({_COLUMNS}, model_id, vector) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, '[]', ?, ?)",
                (
                    new_id,
                    *_written(memory),
                    memory.created,
                    memory.updated,
                    memory.merged,
                    model_id,
                    pack(vector),
                ),
            )
            self._conn.execute(
                "UPDATE memory_meta SET value = ? WHERE key = 'last_id'", (str(new_id),)
            )
            self._bump((new_id,))
            return new_id

    def replace(
        self,
        memory: Memory,
        model_id: str | None = None,
        vector: np.ndarray[Any, Any] | None = None,
    ) -> bool:
        """Rewrite a memory's fields (and its vector when given); False if it is gone."""
        sets = (
            "principal = ?, kind = ?, text = ?, place = ?, at = ?, people = ?, tags = ?, "
            "skill = ?, source = ?, untrusted = ?, conversation_id = ?, updated = ?, merged = ?"
        )
        args: list[Any] = [*_written(memory), memory.updated, memory.merged]
        if vector is not None and model_id is not None:
            sets += ", model_id = ?, vector = ?"
            args += [model_id, pack(vector)]
        with self._lock, self._conn.transaction():
            cur = self._conn.execute(f"UPDATE memories SET {sets} WHERE id = ?", (*args, memory.id))
            if cur.rowcount:
                self._bump((memory.id,))
        return cur.rowcount > 0

    def _set(self, sql: str, args: Sequence[Any], memory_id: int) -> bool:
        with self._lock, self._conn.transaction():
            cur = self._conn.execute(sql, args)
            if cur.rowcount:
                self._bump((memory_id,))
        return cur.rowcount > 0

    def forget(self, memory_id: int, at: float, after: Sequence[str] = ()) -> bool:
        """Set a live memory apart (restorable until :meth:`purge` removes it); ``after``: the
        untrusted sources the forgetting conversation had read."""
        return self._set(
            f"UPDATE memories SET forgotten = ?, forgotten_after = ? WHERE id = ? AND {LIVE}",
            (at, json.dumps(list(after)), memory_id),
            memory_id,
        )

    def restore(self, memory_id: int) -> bool:
        return self._set(
            "UPDATE memories SET forgotten = NULL, forgotten_after = '[]' "
            "WHERE id = ? AND forgotten IS NOT NULL",
            (memory_id,),
            memory_id,
        )

    def supersede(self, memory_id: int, by: int) -> bool:
        """Mark a memory as no longer true: ``by`` (a newer memory) replaced it."""
        return self._set(
            "UPDATE memories SET superseded_by = ? WHERE id = ?", (by, memory_id), memory_id
        )

    def purge(self, before: float) -> list[int]:
        """Remove for good the memories forgotten before ``before``; their ids."""
        with self._lock, self._conn.transaction():
            rows = self._conn.execute(
                "DELETE FROM memories WHERE forgotten IS NOT NULL AND forgotten < ? RETURNING id",
                (before,),
            ).fetchall()
            if rows:
                self._conn.execute(
                    "UPDATE memories SET superseded_by = NULL WHERE superseded_by IN "
                    f"({','.join('?' * len(rows))})",
                    [int(r[0]) for r in rows],
                )
                self._bump([int(r[0]) for r in rows])
        return [int(r[0]) for r in rows]

    def delete(self, memory_id: int) -> bool:
        return self._set("DELETE FROM memories WHERE id = ?", (memory_id,), memory_id)

    # -- reads ------------------------------------------------------------------------
    def get(self, memory_id: int) -> Memory | None:
        with self._lock:
            r = self._conn.execute(
                f"SELECT {_COLUMNS} FROM memories WHERE id = ?", (memory_id,)
            ).fetchone()
        return None if r is None else _row(r)

    def many(self, ids: Iterable[int]) -> dict[int, Memory]:
        wanted = list(dict.fromkeys(int(i) for i in ids))
        out: dict[int, Memory] = {}
        with self._lock:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for r in self._conn.execute(
                    f"SELECT {_COLUMNS} FROM memories WHERE id IN ({marks})", chunk
                ):
                    out[int(r[0])] = _row(r)
        return out

    def recent(
        self,
        principals: Sequence[str] | None,
        limit: int,
        *,
        place: str | None = None,
        skill: str | None = None,
        linked: bool = False,
        since: str | None = None,
        until: str | None = None,
        offset: int = 0,
    ) -> list[Memory]:
        """Newest first; ``None`` principals: everyone's (the operator's view). ``since`` and
        ``until``: inclusive ISO prefixes of when it happened (``at``, else when it was
        stored, ``offset`` seconds from UTC)."""
        where, args = _whose(principals, LIVE)
        if place:
            # the place field, or the text naming it ("dinner in Lisbon"), in any case (both
            # lowered: SQLite's LIKE ignores ASCII case, PostgreSQL's does not)
            where.append(
                "(lower(place) LIKE lower(?) ESCAPE '\\' OR lower(text) LIKE lower(?) ESCAPE '\\')"
            )
            args += ["%" + _like(place) + "%"] * 2
        if skill:
            where.append("skill = ?")
            args.append(skill)
        elif linked:
            where.append("skill IS NOT NULL")
        happened = f"COALESCE(at, {self._conn.utc_minute('created + ?')})"
        shift = int(offset)
        if since:
            where.append(f"substr({happened}, 1, ?) >= ?")
            args += [shift, len(since), since]
        if until:
            where.append(f"substr({happened}, 1, ?) <= ?")
            args += [shift, len(until), until]
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM memories WHERE {' AND '.join(where)} "
                "ORDER BY updated DESC, id DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_row(r) for r in rows]

    def vector(self, memory_id: int, model_id: str, dim: int) -> Any:
        """A memory's stored vector (None: gone, or embedded by another model)."""
        with self._lock:
            r = self._conn.execute(
                "SELECT model_id, vector FROM memories WHERE id = ?", (memory_id,)
            ).fetchone()
        return None if r is None or r[0] != model_id else unpack(r[1], dim)

    def forgotten(self, principals: Sequence[str] | None, limit: int) -> list[Memory]:
        """The forgotten memories not yet purged, the latest forgotten first."""
        where, args = _whose(principals, "forgotten IS NOT NULL")
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {_COLUMNS} FROM memories WHERE {' AND '.join(where)} "
                "ORDER BY forgotten DESC, id DESC LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [_row(r) for r in rows]

    def principals(self) -> list[str]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT DISTINCT principal FROM memories WHERE {LIVE}"
            ).fetchall()
        return sorted(str(r[0]) for r in rows)

    def counts(self) -> dict[str, int]:
        """How many memories each principal has."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT principal, COUNT(*) FROM memories WHERE {LIVE} GROUP BY principal"
            ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def count(self) -> int:
        with self._lock:
            return int(
                self._conn.execute(f"SELECT COUNT(*) FROM memories WHERE {LIVE}").fetchone()[0]
            )

    def vectors(self, model_id: str, dim: int, page: int = 2000) -> Iterator[tuple[Memory, Any]]:
        """Every memory with its stored vector (None: embedded by another model), page by page."""
        last = 0
        while True:
            with self._lock:
                rows = self._conn.execute(
                    f"SELECT {_COLUMNS}, model_id, vector, {LIVE} FROM memories WHERE id > ? "
                    "ORDER BY id LIMIT ?",
                    (last, page),
                ).fetchall()
            if not rows:
                return
            for r in rows:
                if r[-1]:  # forgotten rows are not indexed
                    vec = unpack(r[-2], dim) if r[-3] == model_id else None
                    yield _row(r[:-3]), vec
            last = int(rows[-1][0])


def _whose(principals: Sequence[str] | None, first: str) -> tuple[list[str], list[Any]]:
    """A WHERE clause's parts: ``first``, and the principals' rows only (None: everyone's)."""
    where, args = [first], []  # type: list[str], list[Any]
    if principals is not None:
        where.append(f"principal IN ({','.join('?' * len(principals))})")
        args += list(principals)
    return where, args


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")

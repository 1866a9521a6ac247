"""Calendar objects kept on disk, so a restarted daemon revalidates instead of refetching.

One SQLite file in the data directory's cache folder (0600, like ``chalie.db``):
per calendar collection its CTag and sync token, per object its ETag and text,
and where each account lists its collections. Rows are keyed by the account's
identity (kind, name, URL, user): an account removed and added again with the
same name on another server never sees the old rows. What the file holds is
what the user's server already holds; ``chalie accounts remove`` drops an
account's rows, and a file that cannot be used is set aside (it is a cache).

Nothing here talks to a server; :mod:`.calendars` decides what to fetch.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from chalie.accounts.spec import Account
from chalie.store.db import DatabaseUnusable, connect, transaction

SCHEMA_VERSION: Final = 1
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS cal_collections (
    identity TEXT NOT NULL, account TEXT NOT NULL, href TEXT NOT NULL,
    ctag TEXT NOT NULL, sync_token TEXT NOT NULL, PRIMARY KEY (identity, href));
CREATE TABLE IF NOT EXISTS cal_objects (
    identity TEXT NOT NULL, collection TEXT NOT NULL, href TEXT NOT NULL,
    etag TEXT NOT NULL, text TEXT NOT NULL, PRIMARY KEY (identity, collection, href));
CREATE TABLE IF NOT EXISTS listings (
    identity TEXT NOT NULL, account TEXT NOT NULL, kind TEXT NOT NULL, url TEXT NOT NULL,
    depth INTEGER NOT NULL, found_at REAL NOT NULL, PRIMARY KEY (identity, kind));
"""


def identity(account: Account) -> str:
    """Who the rows belong to: the account's name and what it points at."""
    raw = "\0".join((account.kind, account.name, account.url, account.username))
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Snapshot:
    """One collection as last synced: its CTag, sync token and objects (href -> (ETag, text))."""

    ctag: str
    sync_token: str
    objects: dict[str, tuple[str, str]]


class CalendarStore:
    """The cache file, opened on first use (a home without calendars never gets one); any
    thread (one lock)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    @property
    def _conn(self) -> sqlite3.Connection:
        # Called with self._lock held.
        if self._db is None:
            try:
                self._db = self._open()
            except (DatabaseUnusable, sqlite3.DatabaseError):
                # A cache: set the broken file aside and start empty.
                for suffix in ("", "-wal", "-shm"):
                    p = self.path.with_name(self.path.name + suffix)
                    if p.exists():
                        p.replace(p.with_name(p.name + ".broken"))
                self._db = self._open()
        return self._db

    def _open(self) -> sqlite3.Connection:
        conn = connect(self.path)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                conn.executescript(
                    "DROP TABLE IF EXISTS cal_collections; DROP TABLE IF EXISTS cal_objects;"
                    "DROP TABLE IF EXISTS listings;"
                )
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- collections ------------------------------------------------------------------
    def load(self, account: Account, collection: str) -> Snapshot | None:
        who = identity(account)
        with self._lock:
            row = self._conn.execute(
                "SELECT ctag, sync_token FROM cal_collections WHERE identity = ? AND href = ?",
                (who, collection),
            ).fetchone()
            if row is None:
                return None
            objects = {
                href: (etag, text)
                for href, etag, text in self._conn.execute(
                    "SELECT href, etag, text FROM cal_objects "
                    "WHERE identity = ? AND collection = ?",
                    (who, collection),
                ).fetchall()
            }
        return Snapshot(row[0], row[1], objects)

    def save(
        self,
        account: Account,
        collection: str,
        *,
        ctag: str,
        sync_token: str,
        changed: Mapping[str, tuple[str, str]],
        gone: Iterable[str] = (),
        complete: bool = False,
    ) -> None:
        """Record a sync: ``changed`` objects written, ``gone`` ones dropped.

        ``complete``: ``changed`` is the whole collection (every other row goes).
        """
        who = identity(account)
        with self._lock, transaction(self._conn):
            if complete:
                self._conn.execute(
                    "DELETE FROM cal_objects WHERE identity = ? AND collection = ?",
                    (who, collection),
                )
            self._conn.executemany(
                "DELETE FROM cal_objects WHERE identity = ? AND collection = ? AND href = ?",
                [(who, collection, h) for h in gone],
            )
            self._conn.executemany(
                "INSERT OR REPLACE INTO cal_objects VALUES (?, ?, ?, ?, ?)",
                [(who, collection, h, etag, text) for h, (etag, text) in changed.items()],
            )
            self._conn.execute(
                "INSERT OR REPLACE INTO cal_collections VALUES (?, ?, ?, ?, ?)",
                (who, account.name, collection, ctag, sync_token),
            )

    # -- where collections are listed ---------------------------------------------------
    def listing(self, account: Account, kind: str, ttl: float) -> tuple[str, int] | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT url, depth, found_at FROM listings WHERE identity = ? AND kind = ?",
                (identity(account), kind),
            ).fetchone()
        if row is None or not 0 <= time.time() - float(row[2]) < ttl:
            return None
        return str(row[0]), int(row[1])

    def put_listing(self, account: Account, kind: str, where: tuple[str, int]) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO listings VALUES (?, ?, ?, ?, ?, ?)",
                (identity(account), account.name, kind, where[0], where[1], time.time()),
            )

    # -- forgetting ---------------------------------------------------------------------
    def forget(self, name: str) -> None:
        """Every row of the account named ``name`` (whatever it pointed at)."""
        with self._lock, transaction(self._conn):
            whos = [
                r[0]
                for r in self._conn.execute(
                    "SELECT identity FROM cal_collections WHERE account = ? UNION "
                    "SELECT identity FROM listings WHERE account = ?",
                    (name, name),
                ).fetchall()
            ]
            for table in ("cal_objects", "cal_collections", "listings"):
                self._conn.executemany(
                    f"DELETE FROM {table} WHERE identity = ?", [(w,) for w in whos]
                )

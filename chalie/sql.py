"""The store interface: one connection type that SQLite and PostgreSQL both implement.

A store module opens its connection with :func:`open_connection` from a *place*
(:data:`Place`): a :class:`~pathlib.Path` is the daemon's SQLite file, a
:class:`Postgres` is a PostgreSQL database (``[store] url``). What it gets is a
:class:`Connection`; the module never learns which engine is behind it.

One dialect for every store module, the common part of the two engines:

- ``?`` placeholders (PostgreSQL's connection turns them into ``%s``);
- upserts as ``INSERT ... ON CONFLICT (...) DO UPDATE SET col = excluded.col`` or
  ``... ON CONFLICT DO NOTHING`` (never SQLite's ``INSERT OR IGNORE/REPLACE``: refused);
- new ids with ``RETURNING`` (never ``lastrowid``);
- a transaction with :meth:`Connection.transaction`; the columns a table has with
  :meth:`Connection.columns` (no ``PRAGMA``);
- a schema (:meth:`Connection.script`) in SQLite's column types: ``INTEGER``, ``REAL``,
  ``TEXT``, ``BLOB``, ``INTEGER PRIMARY KEY``; on PostgreSQL they become ``BIGINT``,
  ``DOUBLE PRECISION`` (a ``REAL`` there is 4 bytes: a timestamp would lose its
  seconds), ``TEXT``, ``BYTEA`` and an identity column;
- errors as :class:`StoreError`, a broken constraint as :class:`IntegrityError`.

PostgreSQL's driver (psycopg 3, the extra ``chalie[postgres]``) is imported only when a
:class:`Postgres` place is opened: a SQLite daemon never imports it.

Where a store lives (the place, the credentials, the stores not ported yet) is
:mod:`chalie.store_place`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from chalie.db import connect, connect_retrying
from chalie.db import transaction as sqlite_transaction
from chalie.store_place import (
    IntegrityError,
    Place,
    Postgres,
    StoreError,
    StoreUnavailable,
)

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("chalie.store")

Engine = Literal["sqlite", "postgresql"]
INSTALL_HINT: Final = "pip install 'chalie[postgres]'"
# Two processes creating one schema at once race in PostgreSQL's catalog (a unique
# violation on pg_type); every schema script takes this transaction-level advisory lock.
_SCHEMA_LOCK: Final = 0x63_68_61_6C_69_65  # "chalie"


class Cursor(Protocol):
    """What a statement gives back, on either engine."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """One connection to the store; callers serialise its use (a lock per store)."""

    engine: Engine
    place: Place

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    def script(self, ddl: str) -> None: ...

    def columns(self, table: str) -> set[str]: ...

    def lease(self, name: str) -> bool:
        """Hold the lease ``name`` for as long as this connection lives (released when its
        process dies, however it dies); False when another holds it."""
        ...

    def leased(self, name: str) -> bool:
        """Whether a live connection (this one included) holds the lease ``name``."""
        ...

    def release(self, name: str) -> None:
        """Let go of the lease ``name`` (nothing when this connection does not hold it)."""
        ...

    def tables(self) -> set[str]:
        """The store's tables (SQLite's own excluded)."""
        ...

    def text_columns(self, table: str) -> set[str]:
        """The table's columns of a text type."""
        ...

    def ids_follow(self, table: str, column: str) -> None:
        """After rows were copied in with their ids: new ids continue past them (PostgreSQL
        moves the identity's sequence; SQLite finds its own)."""
        ...

    def notify(self, channel: str, payload: str = "") -> None:
        """Tell every daemon following ``channel`` (:func:`follow`) that something changed;
        on PostgreSQL a ``NOTIFY`` (sent when the transaction commits), on SQLite nothing
        (one daemon a file: its own writes are all there is)."""
        ...

    def utc_minute(self, seconds: str) -> str:
        """SQL for ``YYYY-MM-DDTHH:MM`` (UTC) of the epoch seconds SQL ``seconds`` gives."""
        ...

    def defer_checkpoints(self) -> None:
        """This connection's commits never copy the write-ahead log into the store (SQLite:
        :meth:`checkpoint` does it, off the write path); nothing to do on PostgreSQL."""
        ...

    def checkpoint(self) -> None:
        """Copy SQLite's write-ahead log into its file as far as readers allow (PASSIVE);
        nothing to do on PostgreSQL (the server checkpoints)."""
        ...

    def transaction(self) -> AbstractContextManager[Connection]: ...

    def close(self) -> None: ...


def open_connection(place: Place, *, racing: bool = False) -> Connection:
    """A connection to ``place``: the SQLite file, or the PostgreSQL database."""
    if isinstance(place, Postgres):
        return PostgresConnection(place)
    raw = (connect_retrying if racing else connect)(Path(place))
    return SqliteConnection(raw, Path(place))


def add_columns(conn: Connection, table: str, later: Mapping[str, str]) -> None:
    """Columns added after a table's first release (name → ``ALTER TABLE ... ADD COLUMN``),
    each made once; another process adding it first is no error."""
    have = conn.columns(table)
    for name, ddl in later.items():
        if name not in have:
            with contextlib.suppress(StoreError):  # another process won
                conn.script(ddl)


class Store:
    """A store's one connection to its place (either engine), for any thread of this
    process: a lock serialises it, and the store's tables are made when it opens
    (``schema``: ``CREATE ... IF NOT EXISTS``). A store that another process may be opening
    for the first time at the same moment passes ``racing``."""

    def __init__(self, place: Place, schema: str, *, racing: bool = False) -> None:
        self.place = place
        self._conn: Connection = open_connection(place, racing=racing)
        self._lock = threading.Lock()
        with self._lock:
            self._conn.script(schema)

    def _add_columns(self, table: str, later: Mapping[str, str]) -> None:
        add_columns(self._conn, table, later)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class Follower:
    """What :func:`follow` returns: ``close()`` stops following."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        self._late = False  # follow() returned before the first LISTEN: resync when it comes
        self._guard = threading.Lock()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)


def follow(place: Place, channel: str, changed: Callable[[str], None]) -> Follower:
    """Call ``changed(payload)`` each time another daemon on the store notifies ``channel``
    (:meth:`Connection.notify`; this process's own notices come too). On PostgreSQL a thread
    with a connection of its own ``LISTEN``s; a lost connection is opened again (with
    backoff) and ``changed("")`` is called once it is back, since notices may have been
    missed meanwhile. It returns once it listens (within the place's connect timeout): a
    caller that reads the table after it returns misses no change. On SQLite there is
    nothing to follow (one daemon a file)."""
    follower = Follower()
    if not isinstance(place, Postgres):
        return follower
    _identifier(channel)
    pg = _psycopg()

    def tell(payload: str) -> None:
        try:
            changed(payload)
        except Exception:  # one failing callback never ends the following
            log.exception("a store notice on %s was not handled", channel)

    def run() -> None:
        delay, missed = 0.5, False
        while not follower._stop.is_set():
            try:
                conn = PostgresConnection(place)
            except StoreError:
                follower._stop.wait(delay)
                delay, missed = min(delay * 2, 30.0), True
                continue
            try:
                conn.raw.execute(f"LISTEN {channel}".encode())
                with follower._guard:
                    follower._listening.set()
                    missed = missed or follower._late
                if missed:
                    tell("")
                delay, missed = 0.5, False
                while not follower._stop.is_set():
                    for notice in conn.raw.notifies(timeout=0.5):
                        tell(notice.payload)
            except pg.Error:
                missed = True  # the server went away: listen again, then resync
            finally:
                conn.close()

    follower._thread = threading.Thread(target=run, name=f"follow-{channel}", daemon=True)
    follower._thread.start()
    follower._listening.wait(place.connect_timeout + 1.0)
    with follower._guard:
        follower._late = not follower._listening.is_set()
    return follower


# -- SQLite --------------------------------------------------------------------------------


class SqliteConnection:
    """:mod:`sqlite3` behind the interface (autocommit, WAL: :mod:`chalie.db`)."""

    engine: Engine = "sqlite"

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.raw = conn
        self.place: Place = path

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        try:
            return self.raw.execute(_portable(sql), params)
        except sqlite3.IntegrityError as exc:
            raise IntegrityError(str(exc)) from exc
        except sqlite3.Error as exc:
            raise StoreError(str(exc)) from exc

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        try:
            self.raw.executemany(_portable(sql), rows)
        except sqlite3.IntegrityError as exc:
            raise IntegrityError(str(exc)) from exc
        except sqlite3.Error as exc:
            raise StoreError(str(exc)) from exc

    def script(self, ddl: str) -> None:
        try:
            self.raw.executescript(ddl)
        except sqlite3.Error as exc:
            raise StoreError(str(exc)) from exc

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self.raw.execute(f"PRAGMA table_info({_identifier(table)})")}

    def lease(self, name: str) -> bool:
        # One daemon a SQLite file (its instance lock): a lease is this process's alone.
        with _LEASES_LOCK:
            held = _LEASES.setdefault(self.place, {})
            owner = held.get(name)
            if owner is not None and owner is not self:
                return False
            held[name] = self
            return True

    def leased(self, name: str) -> bool:
        with _LEASES_LOCK:
            return name in _LEASES.get(self.place, {})

    def release(self, name: str) -> None:
        with _LEASES_LOCK:
            held = _LEASES.get(self.place, {})
            if held.get(name) is self:
                del held[name]
                _LEASES_FREED.notify_all()

    def tables(self) -> set[str]:
        rows = self.raw.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
        return {str(r[0]) for r in rows}

    def text_columns(self, table: str) -> set[str]:
        rows = self.raw.execute(f"PRAGMA table_info({_identifier(table)})")
        return {str(r[1]) for r in rows if "TEXT" in str(r[2]).upper()}

    def ids_follow(self, table: str, column: str) -> None:
        pass

    def notify(self, channel: str, payload: str = "") -> None:
        pass

    def utc_minute(self, seconds: str) -> str:
        return f"strftime('%Y-%m-%dT%H:%M', {seconds}, 'unixepoch')"

    def defer_checkpoints(self) -> None:
        self.raw.execute("PRAGMA wal_autocheckpoint=0").fetchall()

    def checkpoint(self) -> None:
        self.raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        try:
            with sqlite_transaction(self.raw):
                yield self
        except sqlite3.IntegrityError as exc:
            raise IntegrityError(str(exc)) from exc
        except sqlite3.Error as exc:
            raise StoreError(str(exc)) from exc

    def close(self) -> None:
        with _LEASES_LOCK:
            held = _LEASES.get(self.place, {})
            for name in [n for n, owner in held.items() if owner is self]:
                del held[name]
            _LEASES_FREED.notify_all()
        self.raw.close()


# SQLite leases: place → lease name → the connection holding it (in this process).
_LEASES: dict[Place, dict[str, SqliteConnection]] = {}
_LEASES_LOCK = threading.Lock()
_LEASES_FREED = threading.Condition(_LEASES_LOCK)


# -- PostgreSQL ----------------------------------------------------------------------------


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise StoreUnavailable(
            f"[store] url is a PostgreSQL database but psycopg is not installed: {INSTALL_HINT}"
        ) from None
    return psycopg


class PostgresConnection:
    """psycopg 3 behind the interface: autocommit, ``?`` → ``%s``, SQLite's DDL types mapped.

    A connection that breaks (the server restarted, the network dropped) is opened again
    once, before the next statement outside a transaction; a statement inside one fails.
    """

    engine: Engine = "postgresql"

    def __init__(self, place: Postgres) -> None:
        self.place: Place = place
        self._pg = _psycopg()
        self._in_transaction = False
        self._guard = threading.RLock()
        self._leases: set[str] = set()
        self.raw: psycopg.Connection[Any] = self._connect()

    def _connect(self) -> psycopg.Connection[Any]:
        place = self.place
        assert isinstance(place, Postgres)
        extra: dict[str, Any] = {"connect_timeout": max(1, int(place.connect_timeout))}
        if place.password is not None:
            extra["password"] = place.password
        try:
            conn: psycopg.Connection[Any] = self._pg.connect(
                place.url, autocommit=True, application_name="chalie", **extra
            )
        except self._pg.Error as exc:
            raise StoreUnavailable(f"PostgreSQL at {place.url}: {_one_line(exc)}") from None
        return conn

    def _reconnect(self) -> None:
        """A new session for a broken one; its leases are taken again, or it fails (another
        process may hold one now: going on would break what the lease guarded)."""
        self.raw = self._connect()
        for name in sorted(self._leases):
            got = self.raw.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (name,)
            ).fetchone()
            if not (got and got[0]):
                self._leases.discard(name)
                raise StoreUnavailable(f"PostgreSQL: the lease {name!r} was lost with its session")

    def _run(self, sql: str, params: Sequence[Any] | None) -> Any:
        pg = self._pg
        with self._guard:
            if self.raw.broken and not self._in_transaction:
                self._reconnect()
            try:
                if params is None:
                    return self.raw.execute(sql.encode())  # no parameters: several statements
                return self.raw.execute(_placeholders(sql), params)
            except pg.IntegrityError as exc:
                raise IntegrityError(_one_line(exc)) from exc
            except pg.OperationalError as exc:
                if self.raw.broken:
                    raise StoreUnavailable(f"PostgreSQL: {_one_line(exc)}") from exc
                raise StoreError(_one_line(exc)) from exc
            except pg.Error as exc:
                raise StoreError(_one_line(exc)) from exc

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        cur: Cursor = self._run(sql, tuple(params))
        return cur

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        pg = self._pg
        with self._guard:
            try:
                with self.raw.cursor() as cur:
                    cur.executemany(_placeholders(sql), [tuple(r) for r in rows])
            except pg.IntegrityError as exc:
                raise IntegrityError(_one_line(exc)) from exc
            except pg.Error as exc:
                raise StoreError(_one_line(exc)) from exc

    def script(self, ddl: str) -> None:
        translated = postgres_ddl(ddl)
        with self.transaction():
            self._run(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})", ())
            self._run(translated, None)

    def columns(self, table: str) -> set[str]:
        rows = self.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ?",
            (table,),
        ).fetchall()
        return {r[0] for r in rows}

    def lease(self, name: str) -> bool:
        # A session-level advisory lock: PostgreSQL releases it when the session ends.
        with self._guard:
            if name in self._leases:
                return True
            row = self.execute("SELECT pg_try_advisory_lock(hashtextextended(?, 0))", (name,))
            if not row.fetchone()[0]:
                return False
            self._leases.add(name)
            return True

    def tables(self) -> set[str]:
        rows = self.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
        )
        return {str(r[0]) for r in rows}

    def text_columns(self, table: str) -> set[str]:
        rows = self.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = ? AND data_type = 'text'",
            (table,),
        )
        return {str(r[0]) for r in rows}

    def ids_follow(self, table: str, column: str) -> None:
        name, col = _identifier(table), _identifier(column)
        sequence = self.execute("SELECT pg_get_serial_sequence(?, ?)", (name, col)).fetchone()[0]
        if sequence is not None:  # an identity column (a text id has none)
            self.execute(
                f"SELECT setval(?, COALESCE(MAX({col}), 0) + 1, false) FROM {name}", (sequence,)
            )

    def notify(self, channel: str, payload: str = "") -> None:
        self.execute("SELECT pg_notify(?, ?)", (_identifier(channel), payload))

    def utc_minute(self, seconds: str) -> str:
        return f"to_char(to_timestamp({seconds}) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI')"

    def defer_checkpoints(self) -> None:
        pass

    def checkpoint(self) -> None:
        pass

    def leased(self, name: str) -> bool:
        with self._guard:
            if name in self._leases:
                return True
            free = self.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(?, 0))", (name,)
            ).fetchone()[0]
            if free:
                self.execute("SELECT pg_advisory_unlock(hashtextextended(?, 0))", (name,))
            return not free

    def release(self, name: str) -> None:
        with self._guard:
            if name in self._leases:
                self._leases.discard(name)
                self.execute("SELECT pg_advisory_unlock(hashtextextended(?, 0))", (name,))

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self._guard:
            if self.raw.broken:
                self._reconnect()
            pg = self._pg
            self._in_transaction = True
            try:
                with self.raw.transaction():
                    yield self
            except pg.IntegrityError as exc:
                raise IntegrityError(_one_line(exc)) from exc
            except pg.Error as exc:
                raise StoreError(_one_line(exc)) from exc
            finally:
                self._in_transaction = False

    def close(self) -> None:
        with self._guard:
            self.raw.close()


_SQLITE_ONLY: Final = re.compile(r"\bINSERT\s+OR\b|\bPRAGMA\b|\bBEGIN\s+IMMEDIATE\b|\bGLOB\b", re.I)


@functools.lru_cache(maxsize=1024)
def _portable(sql: str) -> str:
    """The statement, if it is in the common dialect; SQLite-only syntax is refused on both
    engines, so a store's SQLite tests catch what PostgreSQL would not run (cached: once a
    statement)."""
    if _SQLITE_ONLY.search(sql):
        raise ValueError(f"SQLite-only syntax in a store statement: {sql[:120]!r}")
    return sql


@functools.lru_cache(maxsize=1024)
def _placeholders(sql: str) -> str:
    """``?`` → ``%s`` and ``%`` → ``%%`` outside quoted text (PostgreSQL's paramstyle)."""
    _portable(sql)
    out: list[str] = []
    quote = ""
    for ch in sql:
        if quote:
            out.append("%%" if ch == "%" else ch)
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    return "".join(out)


_DDL: Final = (
    (
        re.compile(r"\bINTEGER\s+PRIMARY\s+KEY(\s+AUTOINCREMENT)?\b", re.I),
        "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    ),
    (re.compile(r"\bINTEGER\b", re.I), "BIGINT"),
    (re.compile(r"\bREAL\b", re.I), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b", re.I), "BYTEA"),
    (re.compile(r"\)\s*WITHOUT\s+ROWID", re.I), ")"),
)


def postgres_ddl(ddl: str) -> str:
    """A schema in SQLite's types, in PostgreSQL's (see the module docstring)."""
    if re.search(r"\bPRAGMA\b|\bCREATE\s+TRIGGER\b|\bCREATE\s+VIRTUAL\b", ddl, re.I):
        raise ValueError("a store schema uses a SQLite-only statement (PRAGMA, TRIGGER, VIRTUAL)")
    for pattern, replacement in _DDL:
        ddl = pattern.sub(replacement, ddl)
    return ddl


def _identifier(name: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
        raise ValueError(f"not a table name: {name!r}")
    return name


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


__all__ = [
    "Connection",
    "Cursor",
    "Engine",
    "Follower",
    "IntegrityError",
    "Place",
    "PostgresConnection",
    "SqliteConnection",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "add_columns",
    "follow",
    "open_connection",
    "postgres_ddl",
]


# -- waiting for a lease ---------------------------------------------------------------------

# How long a PostgreSQL lease wait blocks before it looks whether it was closed meanwhile.
_LEASE_WAIT_SLICE: Final = "2s"


class LeaseWait:
    """What :func:`wait_for_lease` returns: ``close()`` stops waiting (``then`` is not called)."""

    def __init__(self) -> None:
        self._stop = threading.Event()

    def close(self) -> None:
        self._stop.set()
        with _LEASES_LOCK:
            _LEASES_FREED.notify_all()


def wait_for_lease(place: Place, name: str, then: Callable[[], None]) -> LeaseWait:
    """Call ``then()``, on a thread of its own, once the lease ``name`` is free: its holder
    let go of it, or died (its session ended). Nothing polls: on PostgreSQL a session of
    its own blocks on the advisory lock (the server wakes it when the holder lets go), on
    SQLite (leases of this process) a condition. ``then`` is a hint, not the lease: another
    may take it before the caller does (the caller takes it, or waits again). A lost
    server also calls ``then`` (the holder's session may have gone with it)."""
    wait = LeaseWait()

    def tell() -> None:
        if not wait._stop.is_set():
            try:
                then()
            except Exception:
                log.exception("a freed lease was not handled")

    def on_postgres(server: Postgres) -> None:
        pg = _psycopg()
        try:
            conn = PostgresConnection(server)
        except StoreError:
            tell()
            return
        try:
            conn.raw.execute(f"SET lock_timeout = '{_LEASE_WAIT_SLICE}'".encode())
            while not wait._stop.is_set():
                try:
                    conn.raw.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (name,))
                except pg.errors.LockNotAvailable:
                    continue  # still held: wait on (the slice only lets close() be seen)
                conn.raw.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (name,))
                break
        except pg.Error:
            pass  # the server went away: the holder's session may have gone too
        finally:
            conn.close()
        tell()

    def on_sqlite() -> None:
        with _LEASES_LOCK:
            while not wait._stop.is_set() and name in _LEASES.get(place, {}):
                _LEASES_FREED.wait()
        tell()

    name_of = f"lease-wait-{name}"[:60]
    if isinstance(place, Postgres):
        threading.Thread(target=on_postgres, args=(place,), name=name_of, daemon=True).start()
    else:
        threading.Thread(target=on_sqlite, name=name_of, daemon=True).start()
    return wait

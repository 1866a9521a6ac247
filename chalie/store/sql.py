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
:mod:`chalie.store.store_place`.
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

from chalie.store.db import connect, connect_retrying
from chalie.store.db import transaction as sqlite_transaction
from chalie.store.store_place import (
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
# The sessions Connection.send uses on PostgreSQL at most (one statement in flight each).
SEND_LANES: Final = 4


class Cursor(Protocol):
    """What a statement gives back, on either engine."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Writes(Protocol):
    """Statements whose results are not read (what :meth:`Connection.pipelined` gives)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> object: ...

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...


class _Kept:
    """The statements of a PostgreSQL :meth:`Connection.pipelined` block, kept to be sent."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.statements.append((sql, tuple(params)))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.statements.extend((sql, tuple(row)) for row in rows)


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

    def pipelined(self) -> AbstractContextManager[Writes]:
        """A transaction of writes whose results are not read: on PostgreSQL the statements
        are kept and sent as the block ends, together, committed whole or not at all in one
        round trip (an error is raised there); on SQLite a :meth:`transaction`."""
        ...

    def send(self, sql: str, params: Sequence[Any] = ()) -> bool:
        """One statement, committed on its own, without waiting for its answer: on
        PostgreSQL it is written whole to the server's socket and the caller goes on (the
        server runs and commits it even if this process dies next); its answer is read by
        :meth:`confirm`, which every later use of this connection calls first. On SQLite
        it is :meth:`execute` (committed on return). Only for a statement the caller can
        run again when it is not confirmed (:meth:`confirm` raises), and independent of
        the others sent before it is confirmed: on PostgreSQL they go on several sessions
        and may commit in any order. True when an answer is still to be read."""
        ...

    def confirm(self, *, wait: bool = True) -> bool:
        """Read the answers of the statements :meth:`send` sent: True when every one is
        committed; raises :class:`StoreError` (or a subclass) when one was not or when the
        connection was lost before its answer came (then its fate is not known). With
        ``wait=False`` only the answers already here are read: False while some are not."""
        ...

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
    for the first time at the same moment passes ``racing``.

    A store that many threads use at once (the conversations: every TurnActor writes its
    steps) passes ``pool``: on PostgreSQL its operations (:meth:`_connection`,
    :meth:`_transaction`, :meth:`_pipelined`) then run on up to ``pool`` connections of its
    own at once instead of waiting for the one lock (one thread a connection at a time;
    what two threads may do at once is what two daemons on the store may do at once, which
    every store allows). On SQLite they stay on the one connection under the lock (one
    writer a file: a second connection would only wait for it)."""

    def __init__(self, place: Place, schema: str, *, racing: bool = False, pool: int = 1) -> None:
        self.place = place
        self._conn: Connection = open_connection(place, racing=racing)
        self._lock = threading.Lock()
        self._pool = (
            ConnectionPool(place, pool) if pool > 1 and isinstance(place, Postgres) else None
        )
        with self._lock:
            self._conn.script(schema)

    def _add_columns(self, table: str, later: Mapping[str, str]) -> None:
        add_columns(self._conn, table, later)

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        """A connection for one operation, this thread's alone until the block ends: one
        of the pool's, or the store's one under its lock."""
        if self._pool is None:
            with self._lock:
                yield self._conn
        else:
            with self._pool.borrow() as conn:
                yield conn

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        with self._connection() as conn, conn.transaction():
            yield conn

    @contextmanager
    def _pipelined(self) -> Iterator[Writes]:
        """:meth:`Connection.pipelined` on a connection of :meth:`_connection`."""
        with self._connection() as conn, conn.pipelined() as writes:
            yield writes

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        with self._lock:
            self._conn.close()


class ConnectionPool:
    """Up to ``size`` PostgreSQL connections to one place, each lent to one thread at a time
    (:meth:`borrow`); made when first needed, a broken one mends itself at its next use
    (:class:`PostgresConnection`). A thread that finds all lent waits for one back."""

    def __init__(self, place: Postgres, size: int) -> None:
        if size < 1:
            raise ValueError("a pool holds at least one connection")
        self.place = place
        self.size = size
        self._idle: list[PostgresConnection] = []
        self._made = 0
        self._closed = False
        self._cond = threading.Condition()

    @contextmanager
    def borrow(self) -> Iterator[Connection]:
        conn = self._take()
        try:
            yield conn
        finally:
            with self._cond:
                if self._closed:
                    conn.close()
                else:
                    self._idle.append(conn)
                self._cond.notify()

    def _take(self) -> PostgresConnection:
        with self._cond:
            while True:
                if self._closed:
                    raise StoreUnavailable("the store is closed")
                if self._idle:
                    return self._idle.pop()
                if self._made < self.size:
                    self._made += 1
                    break
                self._cond.wait()
        try:
            return PostgresConnection(self.place)
        except BaseException:
            with self._cond:
                self._made -= 1
                self._cond.notify()
            raise

    def lent(self) -> int:
        """How many connections are lent now."""
        with self._cond:
            return self._made - len(self._idle)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for conn in idle:
            conn.close()


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

    def pipelined(self) -> AbstractContextManager[Writes]:
        return self.transaction()

    def send(self, sql: str, params: Sequence[Any] = ()) -> bool:
        self.execute(sql, params)
        return False

    def confirm(self, *, wait: bool = True) -> bool:
        return True

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
        self._piped = False  # in libpq's pipeline mode (send()) until confirm()
        self._inflight = 0  # statements sent whose answer is not read yet
        self._failure: StoreError | None = None  # the first sent one that failed
        self._lanes: list[PostgresConnection] = []  # more sessions for send()
        self._next_lane = 0
        self._opening: threading.Thread | None = None
        self._prepared: dict[bytes, bytes] = {}  # send()'s statements prepared, by name
        self._prepare_seq = 0
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
        self._prepared.clear()
        for name in sorted(self._leases):
            got = self.raw.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (name,)
            ).fetchone()
            if not (got and got[0]):
                self._leases.discard(name)
                raise StoreUnavailable(f"PostgreSQL: the lease {name!r} was lost with its session")

    def send(self, sql: str, params: Sequence[Any] = ()) -> bool:
        # libpq's pipeline mode: the statement goes with its own Sync (it commits on its
        # own) and the caller does not wait for its answer. At most ONE is in flight on a
        # session: a server whose client is gone ends the session at its first failed
        # answer, and what it had received but not run yet would be lost; the one statement
        # it has, it runs whole. So sends go out on up to SEND_LANES sessions (this one and
        # others opened when needed), each time on one whose answer has come; when none
        # has, the caller waits for one.
        with self._guard:
            lane = self._free_lane()
            with lane._guard:
                lane._send_one(sql, params)
            return True

    def _free_lane(self) -> PostgresConnection:
        if self._opening is None:  # the other sessions are opened off the caller's thread
            self._opening = threading.Thread(
                target=self._open_lanes, name="store-send-lanes", daemon=True
            )
            self._opening.start()
        lanes = [self, *self._lanes]
        for lane in lanes:
            if lane._answered():
                return lane
        self._next_lane = (self._next_lane + 1) % len(lanes)
        return lanes[self._next_lane]  # its _send_one waits for its answer

    def _open_lanes(self) -> None:
        for _ in range(SEND_LANES - 1):
            try:
                lane = PostgresConnection(self.place)  # type: ignore[arg-type]
            except StoreError:
                return  # sends go on the sessions there are
            with self._guard:
                if self.raw.closed:
                    lane.close()
                    return
                self._lanes.append(lane)

    def _answered(self) -> bool:
        """Whether nothing this session sent is still unanswered (reads what has come)."""
        if not self._inflight:
            return True
        try:
            self._read(block=False)
        except self._pg.Error as exc:
            self._lost(exc)
        return not self._inflight

    def _send_one(self, sql: str, params: Sequence[Any]) -> None:
        pg, generators = self._pg, self._generators()
        self._begin_pipeline()
        pgconn = self.raw.pgconn
        values = _text_values(params)
        try:
            self._read(block=True)  # the one before on this session, if any
            if values is None:  # a value of another type: bound here by psycopg
                binder = self._pg.ClientCursor(self.raw)
                text = binder.mogrify(_placeholders(sql), tuple(params))
                pgconn.send_query_params(text.encode(), None)
            else:  # bound by the server, each value as text (its type from the column),
                # the statement prepared once a session (parsed and planned once)
                statement = _numbered(sql)
                name = self._prepared.get(statement)
                if name is None:
                    self._prepare_seq += 1  # never a name this session may still hold
                    name = f"chalie_send_{self._prepare_seq}".encode()
                    pgconn.send_prepare(name, statement, None)
                    self._prepared[statement] = name
                pgconn.send_query_prepared(name, values)
            pgconn.pipeline_sync()
            self._inflight += 1
            if pgconn.flush():  # not all written at once: wait until the socket takes it
                self.raw.wait(generators.send(pgconn))
        except pg.Error as exc:
            self._lost(exc)
            raise StoreUnavailable(f"PostgreSQL: {_one_line(exc)}") from exc

    def confirm(self, *, wait: bool = True) -> bool:
        with self._guard:
            return self._confirm(wait=wait)

    def _confirm(self, *, wait: bool = True) -> bool:
        """:meth:`confirm` on this session and every lane of :meth:`send`."""
        done, failure = True, None
        for lane in [self, *self._lanes]:
            try:
                with lane._guard:
                    done = lane._confirm_own(wait=wait) and done
            except StoreError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return done

    def _confirm_own(self, *, wait: bool) -> bool:
        if not self._piped:
            return True
        try:
            self._read(block=wait)
            if self._inflight and self._failure is None:
                return False  # not waiting: some answers are still on their way
            if not self._inflight:
                self.raw.pgconn.exit_pipeline_mode()
                self._piped = False
        except self._pg.Error as exc:
            self._lost(exc)
        failure, self._failure = self._failure, None
        if failure is not None:
            self._prepared.clear()  # a PREPARE may have failed with it: made again
            if type(failure) is StoreError and self.raw.broken:  # the server ended the session
                failure = StoreUnavailable(f"PostgreSQL: {failure}")
            if self._inflight and not self.raw.broken:  # read (and dropped) before next use
                self._read(block=True)
            self._inflight = 0
            with contextlib.suppress(self._pg.Error):
                self.raw.pgconn.exit_pipeline_mode()
            self._piped = False
            raise failure
        return True

    def _read(self, *, block: bool) -> None:
        """Read the answers of sent statements: all of them, or those already here."""
        pg, pgconn = self._pg, self.raw.pgconn
        fetch = self._generators().fetch
        ends = 0  # answers' ends in a row: a second one means libpq has nothing more
        while self._inflight:
            if block:
                result = self.raw.wait(fetch(pgconn))
            else:
                pgconn.consume_input()
                if pgconn.is_busy():
                    return
                result = pgconn.get_result()
            if result is None:
                ends += 1
                if ends > 1:  # answers owed that will not come (the session is gone)
                    self._lost(ConnectionError("the answers stopped"))
                continue
            ends = 0
            if result.status == pg.pq.ExecStatus.PIPELINE_SYNC:
                self._inflight -= 1
            elif result.status == pg.pq.ExecStatus.FATAL_ERROR and self._failure is None:
                error = pg.errors.error_from_result(result, encoding=self.raw.info.encoding)
                kind = IntegrityError if isinstance(error, pg.IntegrityError) else StoreError
                self._failure = kind(_one_line(error))

    def _lost(self, exc: BaseException) -> None:
        """The connection failed with statements in flight: their fate is not known."""
        self._inflight = 0
        if self._failure is None:
            self._failure = StoreUnavailable(f"PostgreSQL: {_one_line(exc)}")

    def _generators(self) -> Any:
        import psycopg.generators

        return psycopg.generators

    def _run(self, sql: str, params: Sequence[Any] | None) -> Any:
        pg = self._pg
        with self._guard:
            self._confirm()
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
            self._confirm()
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
            self._confirm()
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

    @contextmanager
    def pipelined(self) -> Iterator[Writes]:
        # The statements are kept, then sent together up to one Sync (libpq's pipeline
        # mode, no BEGIN): PostgreSQL runs the statements before a Sync as one implicit
        # transaction, all or none, answered in one round trip. Each value is bound by the
        # server as text; a statement with a value of another type (bytes) makes the whole
        # block go as one simple query bound here (psycopg's client-side binding), which
        # the server also runs as one transaction.
        kept = _Kept()
        yield kept
        if not kept.statements:
            return
        bound = [(sql, _text_values(params)) for sql, params in kept.statements]
        with self._guard:
            self._confirm()  # what send() sent is answered first (its failure raised)
            if any(values is None for _, values in bound):
                binder = self._pg.ClientCursor(self.raw)
                text = ";\n".join(
                    binder.mogrify(_placeholders(sql), params) for sql, params in kept.statements
                )
                self._run(text, None)
                return
            self._begin_pipeline()
            pgconn = self.raw.pgconn
            try:
                for sql, values in bound:
                    pgconn.send_query_params(_numbered(sql), values)
                pgconn.pipeline_sync()
                self._inflight += 1
                self.raw.wait(self._generators().send(pgconn))
            except self._pg.Error as exc:
                self._lost(exc)
            self._confirm()

    def _begin_pipeline(self) -> None:
        if not self._piped:
            if self.raw.broken:
                self._reconnect()
            self.raw.pgconn.enter_pipeline_mode()
            self._piped = True

    def close(self) -> None:
        with self._guard:
            try:
                self._confirm()
            finally:
                for lane in self._lanes:
                    lane.raw.close()
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


def _text_values(params: Sequence[Any]) -> list[bytes | None] | None:
    """The parameters as PostgreSQL's text input, when each is text, a number or None."""
    out: list[bytes | None] = []
    for value in params:
        kind = type(value)
        if value is None:
            out.append(None)
        elif kind is str:
            if "\x00" in value:
                return None  # the server refuses it as text: let psycopg say so
            out.append(value.encode())
        elif kind is int:
            out.append(str(value).encode())
        elif kind is float:
            out.append(repr(value).encode())  # shortest text that reads back exactly
        else:
            return None
    return out


@functools.lru_cache(maxsize=256)
def _numbered(sql: str) -> bytes:
    """``?`` → ``$1``, ``$2``, ... outside quoted text (libpq's own placeholders)."""
    _portable(sql)
    out: list[str] = []
    quote = ""
    n = 0
    for ch in sql:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "?":
            n += 1
            out.append(f"${n}")
            continue
        out.append(ch)
    return "".join(out).encode()


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
    "ConnectionPool",
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
    "Writes",
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

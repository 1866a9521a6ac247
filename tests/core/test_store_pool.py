"""A store's connections on either engine (chalie.sql): a pipelined write (one round trip on
PostgreSQL) committed whole or not at all, with every value as it was given; a store with a
pool running several threads' operations at once on PostgreSQL, mending a connection the
server dropped; the conversation store's step writes from many threads at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from chalie.conversation.events import TextDelta
from chalie.conversation.store import Batch, ConversationStore
from chalie.sql import Connection, ConnectionPool, Store, open_connection
from chalie.store_place import IntegrityError, Place, Postgres, StoreUnavailable
from tools.pg_cluster import PgCluster
from tools.waiting import wait_until

SCHEMA = """
CREATE TABLE IF NOT EXISTS notes (
    id    INTEGER PRIMARY KEY,
    name  TEXT NOT NULL UNIQUE,
    at    REAL,
    big   INTEGER,
    body  BLOB
);
"""

# Values a client-side binding must carry exactly: quotes, backslashes, placeholders and
# percent signs inside text, a NUL-free unicode string, bytes with every awkward byte.
AWKWARD = [
    ("it's", 1.5, 2**40, b"\x00\xff'\\"),
    ("back\\slash ? %s %% '' \"q\"", -0.000123456789, -1, b""),
    ("é ✓ 😀 -- ; DROP TABLE notes", 1_765_000_000.123456, 0, None),
    ("none", None, None, b"%s?"),
]


@pytest.fixture
def conn(store_place: Place) -> Iterator[Connection]:
    c = open_connection(store_place)
    c.script(SCHEMA)
    yield c
    c.close()


def test_a_pipelined_write_keeps_every_value_as_given(conn: Connection) -> None:
    with conn.pipelined() as w:
        w.executemany("INSERT INTO notes (name, at, big, body) VALUES (?, ?, ?, ?)", AWKWARD)
        w.execute("UPDATE notes SET big = ? WHERE name = ?", (7, "it's"))
    rows = conn.execute("SELECT name, at, big, body FROM notes ORDER BY id").fetchall()
    expected = [(AWKWARD[0][0], 1.5, 7, AWKWARD[0][3]), *AWKWARD[1:]]
    assert [(r[0], r[1], r[2], None if r[3] is None else bytes(r[3])) for r in rows] == expected


def test_a_pipelined_write_commits_whole_or_not_at_all(conn: Connection) -> None:
    conn.execute("INSERT INTO notes (name) VALUES (?)", ("taken",))
    with pytest.raises(IntegrityError), conn.pipelined() as w:
        w.execute("INSERT INTO notes (name) VALUES (?)", ("first",))
        w.execute("INSERT INTO notes (name) VALUES (?)", ("taken",))  # breaks the constraint
        w.execute("INSERT INTO notes (name) VALUES (?)", ("third",))
    names = {r[0] for r in conn.execute("SELECT name FROM notes").fetchall()}
    assert names == {"taken"}
    with pytest.raises(RuntimeError), conn.pipelined() as w:  # the block itself fails
        w.execute("INSERT INTO notes (name) VALUES (?)", ("never",))
        raise RuntimeError("the caller gave up")
    assert {r[0] for r in conn.execute("SELECT name FROM notes").fetchall()} == {"taken"}
    with conn.pipelined() as w:  # the connection goes on
        w.execute("INSERT INTO notes (name) VALUES (?)", ("after",))
    assert conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0] == 2


class Notes(Store):
    def __init__(self, place: Place, pool: int) -> None:
        super().__init__(place, SCHEMA, pool=pool)

    def add(self, name: str) -> None:
        with self._pipelined() as w:
            w.execute("INSERT INTO notes (name) VALUES (?)", (name,))

    def count(self) -> int:
        with self._connection() as c:
            return int(c.execute("SELECT COUNT(*) FROM notes").fetchone()[0])


def test_a_pooled_store_runs_threads_at_once_on_postgresql(store_place: Place) -> None:
    store = Notes(store_place, pool=2)
    holding, release, other_done = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with store._transaction() as c:  # a transaction left open by a slow caller
            c.execute("INSERT INTO notes (name) VALUES (?)", ("held",))
            holding.set()
            release.wait(30)

    def other() -> None:
        store.add("other")
        other_done.set()

    first = threading.Thread(target=hold)
    first.start()
    assert holding.wait(30)
    second = threading.Thread(target=other)
    second.start()
    try:
        if isinstance(store_place, Postgres):
            # Its own connection: it does not wait for the open transaction to end.
            wait_until(other_done.is_set, timeout=30)
            assert store._pool is not None and store._pool.lent() == 1
        else:
            # SQLite: one connection a file, under the store's lock; it runs after.
            assert store._pool is None
    finally:
        release.set()
        first.join(30)
        second.join(30)
    assert other_done.is_set()
    assert store.count() == 2
    store.close()


@pytest.mark.slow
def test_a_pool_mends_a_connection_the_server_dropped(pg_cluster: PgCluster) -> None:
    # PostgreSQL's alone: SQLite has no server to drop a connection.
    store_place = Postgres(pg_cluster.new_database())
    store = Notes(store_place, pool=2)
    store.add("before")
    admin = open_connection(store_place)
    killed = admin.execute(
        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchone()[0]
    assert killed >= 2  # the store's own connection and the pool's
    # The operation that finds its connection dropped fails as unavailable (whether its
    # statement ran is not known to the client); the next one runs on a new connection.
    with pytest.raises(StoreUnavailable):
        store.add("after")
    store.add("after")
    assert store.count() == 2
    admin.close()
    store.close()


@pytest.mark.slow
def test_a_pool_lends_each_connection_to_one_thread_and_closes_what_comes_back(
    pg_cluster: PgCluster,
) -> None:
    # PostgreSQL's alone: a SQLite store keeps its one connection.
    pool = ConnectionPool(Postgres(pg_cluster.new_database()), 1)
    got_second = threading.Event()
    seen: list[object] = []
    with pool.borrow() as first:
        seen.append(first)

        def borrow_again() -> None:
            with pool.borrow() as again:
                seen.append(again)
                got_second.set()

        waiter = threading.Thread(target=borrow_again)
        waiter.start()
        wait_until(lambda: waiter.is_alive(), timeout=10)
        assert not got_second.is_set()  # the only connection is lent
    waiter.join(30)
    assert got_second.is_set() and seen[0] is seen[1]  # lent again once it came back
    with pool.borrow() as last:
        pool.close()  # closed while lent: closed as it comes back
    assert last.raw.closed  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="closed"), pool.borrow():
        pass


def test_step_writes_of_many_conversations_at_once_all_land_in_order(
    store_place: Place,
) -> None:
    store = ConversationStore(store_place)
    ids = [f"c{i}" for i in range(8)]
    for cid in ids:
        store.create(cid, "chat")
    errors: list[BaseException] = []

    def write(cid: str) -> None:
        try:
            for seq in range(1, 26):
                batch = Batch(cid)
                batch.events.append(
                    TextDelta(conversation_id=cid, seq=seq, ts=float(seq), turn_id="t", text="x")
                )
                store.write(batch)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(cid,)) for cid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    for cid in ids:
        assert [e.seq for e in store.events(cid, 0, 100)] == list(range(1, 26))
    store.close()

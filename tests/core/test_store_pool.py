"""A store's connections on either engine (chalie.store.sql): a pipelined write (one round trip on
PostgreSQL) committed whole or not at all, with every value as it was given; a store with a
pool running several threads' operations at once on PostgreSQL, mending a connection the
server dropped; the conversation store's step writes from many threads at once; statements
sent without waiting (the trail's ends on the dispatcher's hot path): each commits on its
own, a failure comes at confirm, an end the server never got is written again (a call
replied to and its daemon killed right after: tests/core/test_trail.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from chalie.calls.trail import Trail
from chalie.conversation.store import Batch, ConversationStore
from chalie.store.sql import Connection, ConnectionPool, Store, open_connection
from chalie.store.store_place import IntegrityError, Place, Postgres, StoreUnavailable
from chalie.wire.events import TextDelta
from tests.store_engines import opened
from tools.pg_cluster import PgCluster
from tools.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]

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
    with opened(store_place, SCHEMA) as c:
        yield c


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


def test_sent_statements_commit_each_on_its_own_and_a_failure_comes_at_confirm(
    conn: Connection,
) -> None:
    conn.execute("INSERT INTO notes (name) VALUES (?)", ("taken",))
    conn.send("INSERT INTO notes (name, body) VALUES (?, ?)", ("one", b"\x00'"))
    conn.send("INSERT INTO notes (name) VALUES (?)", ("two",))
    if isinstance(conn.place, Postgres):
        conn.send("INSERT INTO notes (name) VALUES (?)", ("taken",))  # refused by the server
        conn.send("INSERT INTO notes (name) VALUES (?)", ("three",))  # its own commit
        with pytest.raises(IntegrityError):
            conn.confirm()
    else:  # SQLite runs it as it is sent
        with pytest.raises(IntegrityError):
            conn.send("INSERT INTO notes (name) VALUES (?)", ("taken",))
        conn.send("INSERT INTO notes (name) VALUES (?)", ("three",))
    conn.confirm()  # nothing left to confirm
    # Each commits on its own (in any order: sent statements are independent ones).
    rows = dict(conn.execute("SELECT name, body FROM notes").fetchall())
    assert sorted(rows) == ["one", "taken", "three", "two"]
    assert bytes(rows["one"]) == b"\x00'"
    # Every value as given, bound by the server (text, numbers, None) or here (bytes).
    conn.execute("DELETE FROM notes")
    for row in AWKWARD:
        conn.send("INSERT INTO notes (name, at, big, body) VALUES (?, ?, ?, ?)", row)
    assert conn.confirm()
    got = conn.execute("SELECT name, at, big, body FROM notes").fetchall()
    as_given = {(r[0], r[1], r[2], None if r[3] is None else bytes(r[3])) for r in got}
    assert as_given == set(AWKWARD)


@pytest.mark.slow
def test_a_trail_end_the_server_never_got_is_written_again_once(
    pg_cluster: PgCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # PostgreSQL's alone (on SQLite an end is committed before finish returns).
    place = Postgres(pg_cluster.new_database())
    trail = Trail(place)
    first = trail.record_for(
        call_id="c1", turn_id="t", conversation_id="k", channel="chat", tool="email",
        permission="email", params="{}", act_summary="",
    )  # fmt: skip
    trail.finish(
        first, status="success", code=None, decision="allow", decided_by="p", started=False
    )
    trail.settle()
    admin = open_connection(place)
    pid = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()"
    ).fetchone()[0]
    admin.execute("SELECT pg_terminate_backend(?)", (pid,))
    wait_until(
        lambda: (
            not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ?", (pid,)).fetchall()
        ),
        timeout=10,
        what="the trail's session ended",
    )
    # Sent on the dropped session: no server ran it. The settle finds it unconfirmed and
    # writes it again on a new session; the first end, already committed, stays one row.
    second = trail.record_for(
        call_id="c2", turn_id="t", conversation_id="k", channel="chat", tool="email",
        permission="email", params="{}", act_summary="",
    )  # fmt: skip
    try:
        trail.finish(
            second, status="success", code=None, decision="allow", decided_by="p", started=False
        )
    except StoreUnavailable:
        pass  # the drop was seen as it was sent: kept, written again at the settle
    assert trail.unsettled()
    with caplog.at_level("WARNING", logger="chalie.calls.trail"):
        trail.settle()
    assert "not confirmed" in caplog.text
    assert not trail.unsettled()
    rows = admin.execute("SELECT call_id, status FROM trail ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [("c1", "success"), ("c2", "success")]
    admin.close()
    trail.close()

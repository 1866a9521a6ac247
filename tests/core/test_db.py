"""The one write transaction of the stores (chalie.store.db.transaction), on a real SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from chalie.store.db import connect, transaction


def _count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM t").fetchone()[0])


def test_a_transaction_commits_its_block_or_none_of_it(tmp_path: Path) -> None:
    conn = connect(tmp_path / "chalie.db")
    other = connect(tmp_path / "chalie.db")
    try:
        conn.execute("CREATE TABLE t (x INTEGER)")
        with transaction(conn) as tx:
            tx.execute("INSERT INTO t VALUES (1)")
            tx.execute("INSERT INTO t VALUES (2)")
        assert _count(other) == 2  # committed: another connection sees both rows
        with pytest.raises(KeyError):
            with transaction(conn):
                conn.execute("INSERT INTO t VALUES (3)")
                raise KeyError("midway")
        assert _count(conn) == _count(other) == 2 and not conn.in_transaction
    finally:
        conn.close()
        other.close()


def test_a_transaction_holds_the_write_lock_from_its_start(tmp_path: Path) -> None:
    conn = connect(tmp_path / "chalie.db")
    other = sqlite3.connect(str(tmp_path / "chalie.db"), isolation_level=None, timeout=0)
    try:
        conn.execute("CREATE TABLE t (x INTEGER)")
        with transaction(conn):
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")  # free again once the block ended
        other.execute("ROLLBACK")
    finally:
        conn.close()
        other.close()

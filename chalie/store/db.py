"""Opening the daemon's SQLite file (WAL, a busy timeout, and a 0600 file) and its write
transaction (the SQLite side of the store interface, chalie.store.sql).

Durability choice: ``journal_mode=WAL`` with ``synchronous=NORMAL``. A commit
appends the transaction to the WAL file with ``write()`` before it returns, so
the data is in the kernel's page cache: a SIGKILL of the daemon cannot lose a
committed row. What NORMAL gives up (against FULL) is only the fsync at each
commit, i.e. the last transactions on an OS crash or power loss; the database
itself stays consistent either way. FULL would cost an fsync per tool call on
the dispatcher's hot path.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final, Literal

BUSY_TIMEOUT_MS: Final = 5000
# A 0-byte file another process created a moment ago gets its header within milliseconds.
EMPTY_GRACE: Final = 2.0


class DatabaseUnusable(RuntimeError):
    """``chalie.db`` exists but cannot be used (corrupt, not SQLite, emptied); one line.

    Chalie never re-initialises such a file: it holds (or held) the tokens, the
    policy (deny rules included), conversations and servers.
    """


Synchronous = Literal["NORMAL", "FULL"]


def connect(path: Path, *, synchronous: Synchronous = "NORMAL") -> sqlite3.Connection:
    """An autocommit connection any thread may use (callers serialise access)."""
    if synchronous not in ("NORMAL", "FULL"):
        raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Create the file 0600 before SQLite does: SQLite would honour the umask,
    # and it copies the main file's mode onto the -wal and -shm files.
    # Only when it does not exist yet: closing any fd of the file releases every POSIX lock
    # this process holds on it, SQLite's too, and another process would then delete the WAL
    # under our open connections (their writes vanish).
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        check_usable(path)
    else:
        os.close(fd)
    os.chmod(path, 0o600)
    conn = sqlite3.connect(
        str(path), isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
    )
    try:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        # fetchall: a statement left unfinished would hold a read snapshot open for good.
        conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
    except sqlite3.DatabaseError as exc:
        conn.close()
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise
        raise DatabaseUnusable(_unusable(path, str(exc))) from None
    if str(mode).lower() != "wal":
        conn.close()
        raise sqlite3.OperationalError(f"{path}: could not switch to WAL (got {mode})")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


def connect_retrying(path: Path, attempts: int = 100) -> sqlite3.Connection:
    """:func:`connect`, retried for a store that another process may be opening first: two
    first opens of a fresh file racing to switch it to WAL answer "database is locked" at
    once (SQLite's busy handler does not cover it)."""
    for attempt in range(attempts):
        try:
            return connect(path)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.02)
    raise AssertionError("unreachable")


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on an autocommit connection (``BEGIN IMMEDIATE``: the write lock
    is taken at the start): committed when the block ends, rolled back when it raises (a
    failed commit included). The caller holds its connection's lock around it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def check_usable(path: Path) -> None:
    """Raise DatabaseUnusable when the existing file at ``path`` is empty (0 bytes).

    Only ``stat``: opening and closing any descriptor of the file would release
    every POSIX lock this process holds on it (SQLite's too). A file that is not
    SQLite is found by SQLite itself, at the first statement.
    """
    deadline = time.monotonic() + EMPTY_GRACE
    while True:
        try:
            size = os.stat(path).st_size
        except OSError as exc:
            raise DatabaseUnusable(_unusable(path, exc.strerror or str(exc))) from None
        if size > 0:
            return
        if time.monotonic() >= deadline:
            raise DatabaseUnusable(
                f"{path} is empty (0 bytes): it held the tokens, policy, conversations and "
                "servers; restore it from a backup, or move it away to start afresh"
            )
        time.sleep(0.05)  # another process is creating it right now


def _unusable(path: Path, why: str) -> str:
    return (
        f"{path} cannot be used ({' '.join(why.split())[:120]}); restore it from a backup, "
        "or move it away to start afresh"
    )

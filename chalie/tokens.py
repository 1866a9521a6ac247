"""The token store: named bearer tokens for every client that is not a local socket.

A token is ``chalie_`` plus 32 random bytes (url-safe base64). Only its
sha256 is stored, in the ``tokens`` table of ``chalie.db``; the secret is
returned once, by :meth:`TokenStore.create`, and never again. Because the
secret is high-entropy, a plain sha256 is enough (no slow KDF: there is
nothing to brute-force). :meth:`TokenStore.verify` looks the hash up and
compares it in constant time; a revoked token never verifies. Every call
reads the database, so a revocation from another process (``chalie token
revoke`` while the daemon runs) takes effect at the next check. A check
never writes on the caller's thread: ``last_used`` is brought up to date at
most once a :data:`TOUCH_EVERY` per token, by a thread of the store's own
with a connection of its own, so a request is never held by a busy database
(the MCP server checks every request on its event loop). A token may
carry the ``gateway`` permission (``chalie token create NAME --gateway``): with
``[mcp_server] gateway`` on, its agent may call Chalie's tools directly.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import threading
import time
from pathlib import Path
from typing import Final

import msgspec

from chalie.db import connect

PREFIX: Final = "chalie_"
SECRET_BYTES: Final = 32
MAX_SECRET_CHARS: Final = 256
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
FIRST_TOKEN_NAME: Final = "first"
FIRST_TOKEN_FILE: Final = "first-token"
TOUCH_EVERY: Final = 60.0  # seconds between two writes of one token's last_used

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS tokens (
    name       TEXT PRIMARY KEY,
    hash       TEXT NOT NULL UNIQUE,
    created    REAL NOT NULL,
    revoked    REAL,
    last_used  REAL,
    gateway    INTEGER NOT NULL DEFAULT 0
)
"""
# A store created before the gateway permission existed gains its column.
_MIGRATE_GATEWAY: Final = "ALTER TABLE tokens ADD COLUMN gateway INTEGER NOT NULL DEFAULT 0"


class TokenError(ValueError):
    """A token command that cannot be done; ``code`` is stable, the message is for a person."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class TokenInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What may be shown about a token: never the secret, never its hash."""

    name: str
    created: float
    revoked: float | None = None
    last_used: float | None = None
    # May call Chalie's tools directly through the MCP gateway (when it is on).
    gateway: bool = False

    @property
    def active(self) -> bool:
        return self.revoked is None


def check_name(name: object) -> str:
    """The name if it is one a token may have, else TokenError(invalid-token-name)."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        shown = repr(name)[:80]
        raise TokenError(
            "invalid-token-name",
            f"token name {shown} must be 1-64 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit",
        )
    return name


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def new_secret() -> str:
    raw = base64.urlsafe_b64encode(secrets.token_bytes(SECRET_BYTES)).rstrip(b"=")
    return PREFIX + raw.decode("ascii")


class TokenStore:
    """Named tokens in one SQLite file; safe to use from several threads and processes."""

    def __init__(self, db_path: Path) -> None:
        self.path = Path(db_path)
        self._conn = connect(self.path)
        self._lock = threading.Lock()
        self._touched: dict[str, float] = {}  # name -> when its last_used was last sent
        self._toucher: concurrent.futures.ThreadPoolExecutor | None = None
        self._touch_conn: sqlite3.Connection | None = None  # the toucher thread's only
        with self._lock:
            self._conn.execute(_SCHEMA)
            columns = {r[1] for r in self._conn.execute("PRAGMA table_info(tokens)")}
            if "gateway" not in columns:
                with contextlib.suppress(sqlite3.OperationalError):  # another process won
                    self._conn.execute(_MIGRATE_GATEWAY)

    def close(self) -> None:
        """Close, after the last_used writes already sent."""
        self.flush()
        with self._lock:
            self._conn.close()

    def flush(self) -> None:
        """Wait for the last_used writes sent so far."""
        with self._lock:
            toucher, self._toucher = self._toucher, None
        if toucher is not None:
            toucher.submit(self._close_touch_conn)
            toucher.shutdown(wait=True)

    def _touch(self, name: str, when: float) -> None:
        try:
            if self._touch_conn is None:
                self._touch_conn = connect(self.path)
            self._touch_conn.execute(
                "UPDATE tokens SET last_used = ? WHERE name = ? AND (last_used IS NULL "
                "OR last_used < ?)",
                (when, name, when),
            )
        except sqlite3.Error:
            pass  # a busy or closed database: the next check after TOUCH_EVERY tries again

    def _close_touch_conn(self) -> None:
        conn, self._touch_conn = self._touch_conn, None
        if conn is not None:
            conn.close()

    def __enter__(self) -> TokenStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self, name: str, *, gateway: bool = False) -> str:
        """A new token named ``name``; returns its secret, which is stored nowhere.

        A revoked token's name may be reused; an active one's may not.
        ``gateway`` grants the permission to call Chalie's tools directly.
        """
        check_name(name)
        secret = new_secret()
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                self._conn.execute(
                    "DELETE FROM tokens WHERE name = ? AND revoked IS NOT NULL", (name,)
                )
                self._conn.execute(
                    "INSERT INTO tokens (name, hash, created, gateway) VALUES (?, ?, ?, ?)",
                    (name, digest(secret), time.time(), 1 if gateway is True else 0),
                )
                self._conn.execute("COMMIT")
            except sqlite3.IntegrityError:
                self._conn.execute("ROLLBACK")
                raise TokenError("token-exists", f"a token named {name!r} exists") from None
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise
        return secret

    def list(self) -> list[TokenInfo]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT name, created, revoked, last_used, gateway FROM tokens ORDER BY name"
            ).fetchall()
        return [
            TokenInfo(name=r[0], created=r[1], revoked=r[2], last_used=r[3], gateway=bool(r[4]))
            for r in rows
        ]

    def count(self) -> int:
        """How many tokens exist, revoked ones included."""
        with self._lock:
            return int(self._conn.execute("SELECT count(*) FROM tokens").fetchone()[0])

    def revoke(self, name: str) -> bool:
        """Revoke the active token ``name``; False when there is none."""
        check_name(name)
        with self._lock:
            cur = self._conn.execute(
                "UPDATE tokens SET revoked = ? WHERE name = ? AND revoked IS NULL",
                (time.time(), name),
            )
        return cur.rowcount == 1

    def verify(self, secret: object) -> TokenInfo | None:
        """The active token whose secret this is, else None (never raises on hostile input)."""
        if not isinstance(secret, str) or not secret or len(secret) > MAX_SECRET_CHARS:
            return None
        wanted = digest(secret)
        with self._lock:
            row = self._conn.execute(
                "SELECT name, hash, created, revoked, gateway, last_used FROM tokens "
                "WHERE hash = ?",
                (wanted,),
            ).fetchone()
            if row is None or not hmac.compare_digest(row[1], wanted) or row[3] is not None:
                return None
            name, last_used = row[0], row[5]
            now = time.time()
            if (last_used is None or now - last_used >= TOUCH_EVERY) and now - self._touched.get(
                name, 0.0
            ) >= TOUCH_EVERY:
                self._touched[name] = now
                if self._toucher is None:
                    self._toucher = concurrent.futures.ThreadPoolExecutor(
                        1, thread_name_prefix="token-touch"
                    )
                self._toucher.submit(self._touch, name, now)
                last_used = now
        return TokenInfo(name=name, created=row[2], last_used=last_used, gateway=bool(row[4]))

    def active_hash(self, wanted: str) -> bool:
        """Whether an active token has this sha256 (a dashboard session's check; no write)."""
        if not isinstance(wanted, str) or len(wanted) != 64:
            return False
        with self._lock:
            row = self._conn.execute(
                "SELECT hash, revoked FROM tokens WHERE hash = ?", (wanted,)
            ).fetchone()
        return row is not None and hmac.compare_digest(row[0], wanted) and row[1] is None


def bearer(header: str | None) -> str | None:
    """The token in an ``Authorization: Bearer ...`` header value, or None."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def ensure_first_token(store: TokenStore, home: Path) -> Path | None:
    """On a store with no token at all, create one and write it once to a 0600 file in ``home``.

    Returns the file's path when it was written, None when tokens already
    existed (the operator's choice stands, even if every one is revoked).
    """
    if store.count() > 0:
        return None
    path = home / FIRST_TOKEN_FILE
    try:
        secret = store.create(FIRST_TOKEN_NAME)
    except TokenError:
        return None  # another process created it between the count and now
    # O_EXCL: never follow or overwrite a file someone placed there.
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return path

"""The token store: named bearer tokens for every client that is not a local socket.

A token is ``chalie_`` plus 32 random bytes (url-safe base64). Only its
sha256 is stored, in the ``tokens`` table of the store (``chalie.db``, or
``[store] url``'s PostgreSQL database); the secret is
returned once, by :meth:`TokenStore.create`, and never again. Because the
secret is high-entropy, a plain sha256 is enough (no slow KDF: there is
nothing to brute-force). :meth:`TokenStore.verify` looks the hash up and
compares it in constant time; a revoked token never verifies. Every call
reads the database, so a revocation from another process (``chalie token
revoke`` while the daemon runs) takes effect at the next check. A check
never writes on the caller's thread: ``last_used`` is brought up to date at
most once a :data:`TOUCH_EVERY` per token, by a thread of the store's own
with a connection of its own, so a request is never held by a busy database
(the MCP server checks every request on its event loop).

Every token has a stable id (``tok_`` and 16 hex digits, never reused) and a
scope (:mod:`chalie.wire.principals`): ``agent`` by default (``chalie token create
NAME``), ``owner`` (``--owner``: chat clients, answering approvals) or
``gateway`` (``--gateway``: an agent that may also call tools directly).
What is keyed by a token (conversations, MCP sessions, limits) is keyed by
its id: a new token that reuses a revoked token's name inherits nothing.

Migration of a store made before scopes: each existing token gets an id and
the scope ``agent`` (``gateway`` if it had the gateway permission). That is
the safe default: no token that could have been handed to an agent becomes
a person. The owner keeps the local control socket and ``chalie chat``, and
makes an owner token for a WebSocket client with ``chalie token create NAME
--owner``; the daemon says so at start while no owner token exists.
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
import threading
import time
from pathlib import Path
from typing import Final

import msgspec

from chalie.store.sql import Connection, IntegrityError, Place, StoreError, open_connection
from chalie.wire.principals import DEFAULT_SCOPE, Principal, Scope, check_scope

PREFIX: Final = "chalie_"
SECRET_BYTES: Final = 32
MAX_SECRET_CHARS: Final = 256
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
FIRST_TOKEN_NAME: Final = "first"
FIRST_TOKEN_FILE: Final = "first-token"
TOUCH_EVERY: Final = 60.0  # seconds between two writes of one token's last_used
ID_PREFIX: Final = "tok_"

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS tokens (
    name       TEXT PRIMARY KEY,
    hash       TEXT NOT NULL UNIQUE,
    created    REAL NOT NULL,
    revoked    REAL,
    last_used  REAL,
    gateway    INTEGER NOT NULL DEFAULT 0,
    id         TEXT,
    scope      TEXT NOT NULL DEFAULT 'agent'
)
"""
# Columns a store made by an older version lacks, in the order they were added.
_MIGRATIONS: Final = (
    ("gateway", "ALTER TABLE tokens ADD COLUMN gateway INTEGER NOT NULL DEFAULT 0"),
    ("id", "ALTER TABLE tokens ADD COLUMN id TEXT"),
    ("scope", "ALTER TABLE tokens ADD COLUMN scope TEXT NOT NULL DEFAULT 'agent'"),
)
_ID_INDEX: Final = "CREATE UNIQUE INDEX IF NOT EXISTS tokens_id ON tokens (id)"


def new_id() -> str:
    return ID_PREFIX + secrets.token_hex(8)


class TokenError(ValueError):
    """A token command that cannot be done; ``code`` is stable, the message is for a person."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class TokenInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What may be shown about a token: never the secret, never its hash."""

    name: str
    created: float
    id: str = ""
    scope: Scope = DEFAULT_SCOPE
    revoked: float | None = None
    last_used: float | None = None

    @property
    def active(self) -> bool:
        return self.revoked is None

    @property
    def gateway(self) -> bool:
        """May call Chalie's tools directly through the MCP gateway (when it is on)."""
        return self.scope == "gateway"

    def principal(self) -> Principal:
        return Principal(scope=self.scope, id=self.id, name=self.name)


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
    """Named tokens in the store (:mod:`chalie.store.sql`); safe to use from several threads and
    processes (and daemons, on a shared PostgreSQL)."""

    def __init__(self, place: Place) -> None:
        self.place = place
        self._conn = open_connection(place)
        self._lock = threading.Lock()
        self._touched: dict[str, float] = {}  # name -> when its last_used was last sent
        self._toucher: concurrent.futures.ThreadPoolExecutor | None = None
        self._touch_conn: Connection | None = None  # the toucher thread's only
        with self._lock:
            self._conn.script(_SCHEMA)
            self._migrate()

    def _migrate(self) -> None:
        """Bring a store made by an older version up to date (idempotent, any process)."""
        columns = self._conn.columns("tokens")
        for column, statement in _MIGRATIONS:
            if column not in columns:
                with contextlib.suppress(StoreError):  # another process won
                    self._conn.execute(statement)
        if self._conn.execute("SELECT 1 FROM tokens WHERE id IS NULL LIMIT 1").fetchone() is None:
            self._conn.execute(_ID_INDEX)
            return
        with self._conn.transaction() as tx:
            # Tokens made before scopes: least privilege (see the module docstring).
            rows = tx.execute("SELECT name, gateway FROM tokens WHERE id IS NULL")
            for name, gateway in rows.fetchall():
                tx.execute(
                    "UPDATE tokens SET id = ?, scope = ? WHERE name = ? AND id IS NULL",
                    (new_id(), "gateway" if gateway else "agent", name),
                )
        self._conn.execute(_ID_INDEX)

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

    def _touch(self, token_id: str, when: float) -> None:
        try:
            if self._touch_conn is None:
                self._touch_conn = open_connection(self.place)
            self._touch_conn.execute(
                "UPDATE tokens SET last_used = ? WHERE id = ? AND (last_used IS NULL "
                "OR last_used < ?)",
                (when, token_id, when),
            )
        except StoreError:
            pass  # a busy or closed database: the next check after TOUCH_EVERY tries again

    def _close_touch_conn(self) -> None:
        conn, self._touch_conn = self._touch_conn, None
        if conn is not None:
            conn.close()

    def __enter__(self) -> TokenStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self, name: str, *, scope: Scope = DEFAULT_SCOPE) -> str:
        """A new token named ``name`` with ``scope``; returns its secret, stored nowhere.

        A revoked token's name may be reused (by a new id: it inherits nothing);
        an active one's may not.
        """
        check_name(name)
        check_scope(scope)
        secret = new_secret()
        with self._lock:
            try:
                with self._conn.transaction() as tx:
                    tx.execute("DELETE FROM tokens WHERE name = ? AND revoked IS NOT NULL", (name,))
                    tx.execute(
                        "INSERT INTO tokens (name, hash, created, gateway, id, scope) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (
                            name,
                            digest(secret),
                            time.time(),
                            1 if scope == "gateway" else 0,
                            new_id(),
                            scope,
                        ),
                    )
            except IntegrityError:
                raise TokenError("token-exists", f"a token named {name!r} exists") from None
        return secret

    def list(self) -> list[TokenInfo]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT name, created, revoked, last_used, id, scope FROM tokens ORDER BY name"
            ).fetchall()
        return [
            TokenInfo(
                name=r[0], created=r[1], revoked=r[2], last_used=r[3], id=r[4], scope=_scope(r[5])
            )
            for r in rows
        ]

    def owners(self) -> int:
        """How many active owner tokens exist."""
        with self._lock:
            row = self._conn.execute(
                "SELECT count(*) FROM tokens WHERE scope = 'owner' AND revoked IS NULL"
            ).fetchone()
        return int(row[0])

    def count(self) -> int:
        """How many tokens exist, revoked ones included."""
        with self._lock:
            return int(self._conn.execute("SELECT count(*) FROM tokens").fetchone()[0])

    def regenerate(self, name: str) -> str | None:
        """A new secret for the active token ``name`` (None when there is none), in one
        step: the old secret stops working at once (and the dashboard sessions opened
        with it), while the token keeps its id, so whatever is the principal's (memories,
        grants, its trail rows) stays its own."""
        check_name(name)
        secret = new_secret()
        with self._lock:
            cur = self._conn.execute(
                "UPDATE tokens SET hash = ?, created = ? WHERE name = ? AND revoked IS NULL",
                (digest(secret), time.time(), name),
            )
        return secret if cur.rowcount == 1 else None

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
                "SELECT name, hash, created, revoked, scope, last_used, id FROM tokens "
                "WHERE hash = ?",
                (wanted,),
            ).fetchone()
            if row is None or not hmac.compare_digest(row[1], wanted) or row[3] is not None:
                return None
            name, last_used, token_id = row[0], row[5], row[6]
            now = time.time()
            if (last_used is None or now - last_used >= TOUCH_EVERY) and now - self._touched.get(
                token_id, 0.0
            ) >= TOUCH_EVERY:
                self._touched[token_id] = now
                if self._toucher is None:
                    self._toucher = concurrent.futures.ThreadPoolExecutor(
                        1, thread_name_prefix="token-touch"
                    )
                self._toucher.submit(self._touch, token_id, now)
                last_used = now
        return TokenInfo(
            name=name, created=row[2], last_used=last_used, id=token_id, scope=_scope(row[4])
        )

    def active_hash(self, wanted: str) -> bool:
        """Whether an active token has this sha256 (a dashboard session's check; no write)."""
        if not isinstance(wanted, str) or len(wanted) != 64:
            return False
        with self._lock:
            row = self._conn.execute(
                "SELECT hash, revoked FROM tokens WHERE hash = ?", (wanted,)
            ).fetchone()
        return row is not None and hmac.compare_digest(row[0], wanted) and row[1] is None


def _scope(value: object) -> Scope:
    # A value no version wrote (a hand-edited row) is the least privilege: fail closed.
    return value if value in ("owner", "agent", "gateway") else "agent"  # type: ignore[return-value]


# RFC 7235: the auth scheme is case-insensitive; RFC 6750 b64token, bounded. One rule for
# every entry point (the chat WebSocket and the MCP gate).
_BEARER: Final = re.compile(r"^(?i:bearer) +([A-Za-z0-9\-._~+/]{8,512}=*)$")


def bearer(header: str | bytes | None) -> str | None:
    """The token in an ``Authorization: Bearer <token>`` header value, or None."""
    if not header:
        return None
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    found = _BEARER.match(header.strip())
    return found.group(1) if found is not None else None


def ensure_first_token(store: TokenStore, home: Path) -> Path | None:
    """On a store with no token at all, create an owner token, written once to a 0600 file.

    Returns the file's path when it was written, None when tokens already
    existed (the operator's choice stands, even if every one is revoked).
    """
    if store.count() > 0:
        return None
    path = home / FIRST_TOKEN_FILE
    try:
        secret = store.create(FIRST_TOKEN_NAME, scope="owner")
    except TokenError:
        return None  # another process created it between the count and now
    # O_EXCL: never follow or overwrite a file someone placed there.
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return path

"""The accounts in ``chalie.db`` and their passwords in the 0600 secrets file.

One table, ``accounts`` (name, kind, the spec as JSON, default flag). A
password never touches the table: it goes to the secrets file the MCP
connections use (:class:`chalie.mcp.secrets.SecretFile`), under the id
``account:<name>.password`` (a colon no MCP server slug can hold, so the two
never collide). One account a kind is the default: the first one added, or
the one :meth:`AccountStore.set_default` names.

Several processes may open the file (the daemon, the CLI); SQLite's WAL and
busy timeout serialise them; within a process one lock guards the connection.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

import msgspec

from chalie.accounts.failure import AccountFailure
from chalie.accounts.spec import KINDS, Account, AccountSpecError, Kind, check_account
from chalie.mcp.secrets import MissingSecret, SecretFile
from chalie.store.sql import Store
from chalie.store.store_place import Place

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS accounts (
    name       TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    spec       TEXT NOT NULL,
    is_default INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
"""
SECRET_PREFIX: Final = "account:"

_encode = msgspec.json.Encoder()
_decode = msgspec.json.Decoder(Account)


def secret_id(name: str) -> str:
    return f"{SECRET_PREFIX}{name}.password"


class Credentials(msgspec.Struct, frozen=True):
    """An account with its password, for a protocol client only; never stored or shown."""

    account: Account
    password: str

    def __repr__(self) -> str:  # a stray log line or traceback never carries the password
        return f"Credentials({self.account.name!r}, password=<hidden>)"


class AccountStore(Store):
    """The table and the secrets file, for any thread of one process."""

    def __init__(self, db_path: Place, home: Path) -> None:
        super().__init__(db_path, _SCHEMA, racing=True)
        self.secrets = SecretFile(Path(home))

    # -- reading ----------------------------------------------------------------------
    def _rows(self, kind: str | None = None) -> list[Account]:
        sql = "SELECT spec, is_default FROM accounts"
        args: tuple[str, ...] = ()
        if kind is not None:
            sql += " WHERE kind = ?"
            args = (kind,)
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY kind, name", args).fetchall()
        return [msgspec.structs.replace(_decode.decode(s), default=bool(d)) for s, d in rows]

    def list(self, kind: str | None = None) -> list[Account]:
        return self._rows(kind)

    def get(self, name: str) -> Account | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT spec, is_default FROM accounts WHERE name = ?", (name,)
            ).fetchone()
        if row is None:
            return None
        return msgspec.structs.replace(_decode.decode(row[0]), default=bool(row[1]))

    def pick(self, kinds: tuple[Kind, ...], name: str | None) -> Account:
        """The named account (of one of ``kinds``), or the default of the first kind with one.

        A name that fits none, where only one account of these kinds exists, is that one.
        AccountFailure ``unknown-account`` naming the accounts there are, when none fits.
        """
        candidates = [a for k in kinds for a in self._rows(k)]
        if name:
            for a in candidates:
                if a.name == name:
                    return a
            if len(candidates) == 1:
                # One account of the kind: a name that is not its own ("primary", "my
                # account", a model's guess) can only mean it.
                return candidates[0]
            raise AccountFailure(
                "unknown-account",
                f"no {'/'.join(kinds)} account is named {name!r}",
                valid_values=tuple(a.name for a in candidates) or None,
                param="account",
            )
        for a in candidates:
            if a.default:
                return a
        if candidates:
            return candidates[0]
        raise AccountFailure(
            "unknown-account",
            f"no {'/'.join(kinds)} account is set up",
            hint=f"ask the user to add one with `chalie accounts add {kinds[0]} NAME ...`; "
            "do not retry until then.",
        )

    def credentials(self, account: Account) -> Credentials:
        """The account with its password from the secrets file (empty when it has none)."""
        if not account.has_password:
            return Credentials(account, "")
        try:
            found = self.secrets.get(secret_id(account.name))
        except MissingSecret as exc:
            raise AccountFailure("auth-failed", str(exc), account=account.name) from None
        if found is None:
            raise AccountFailure(
                "auth-failed",
                "the account's password is missing from the secrets file",
                account=account.name,
            )
        return Credentials(account, found)

    # -- changing -----------------------------------------------------------------------
    def add(self, account: Account, password: str | None, *, replace: bool = False) -> Account:
        """Store an account (AccountSpecError when it is malformed or exists); returns it."""
        account = check_account(
            msgspec.structs.replace(account, has_password=bool(password), default=False)
        )
        if password is not None and ("\n" in password or "\r" in password or "\0" in password):
            raise AccountSpecError(f"account {account.name}: the password holds a line break")
        with self._lock:
            existing = self._conn.execute(
                "SELECT kind, is_default FROM accounts WHERE name = ?", (account.name,)
            ).fetchone()
            if existing is not None and not replace:
                raise AccountSpecError(
                    f"an account named {account.name} exists (remove it, or add --replace)"
                )
            if existing is not None and existing[0] != account.kind:
                raise AccountSpecError(
                    f"account {account.name} is a {existing[0]} account, not {account.kind}"
                )
            has_default = self._conn.execute(
                "SELECT 1 FROM accounts WHERE kind = ? AND is_default = 1 AND name != ?",
                (account.kind, account.name),
            ).fetchone()
            is_default = 1 if existing is not None and existing[1] else int(has_default is None)
            # The secret first: a row never points at a password that is not there.
            if password:
                self.secrets.put({secret_id(account.name): password})
            self._conn.execute(
                "INSERT INTO accounts (name, kind, spec, is_default, created_at) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, "
                "spec = excluded.spec, is_default = excluded.is_default, "
                "created_at = excluded.created_at",
                (
                    account.name,
                    account.kind,
                    _encode.encode(account).decode(),
                    is_default,
                    time.time(),
                ),
            )
        if not password:
            self.secrets.drop_server(f"{SECRET_PREFIX}{account.name}")
        found = self.get(account.name)
        assert found is not None
        return found

    def set_default(self, name: str) -> Account:
        account = self.get(name)
        if account is None:
            raise AccountSpecError(f"no account is named {name}")
        with self._lock:
            self._conn.execute(
                "UPDATE accounts SET is_default = CASE WHEN name = ? THEN 1 ELSE 0 END "
                "WHERE kind = ?",
                (name, account.kind),
            )
        return msgspec.structs.replace(account, default=True)

    def remove(self, name: str) -> bool:
        with self._lock:
            row = self._conn.execute(
                "SELECT kind, is_default FROM accounts WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                return False
            self._conn.execute("DELETE FROM accounts WHERE name = ?", (name,))
            if row[1]:  # the next one of the kind becomes the default
                self._conn.execute(
                    "UPDATE accounts SET is_default = 1 WHERE name = (SELECT name FROM accounts "
                    "WHERE kind = ? ORDER BY created_at, name LIMIT 1)",
                    (row[0],),
                )
        self.secrets.drop_server(f"{SECRET_PREFIX}{name}")
        return True


__all__ = ["KINDS", "AccountStore", "Credentials", "secret_id"]

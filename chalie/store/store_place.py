"""Where the durable state lives (a *place*): the daemon's SQLite file, or a PostgreSQL
database (``[store] url``), and the stores that cannot live in PostgreSQL yet.

A :class:`~pathlib.Path` is the SQLite file; a :class:`Postgres` is a database.
:mod:`chalie.store.sql` opens a connection to either. A store not ported onto that interface
yet is named in :data:`NOT_ON_POSTGRES`: it refuses a PostgreSQL place when it opens
(:func:`sqlite_file`) and the daemon refuses to start with one (:func:`check_ported`),
naming every such store: never half-working silently.

Credentials never sit in ``config.toml``: a url that carries a password is refused
(:func:`check_url`); the password comes from the environment variable ``[store]
password_env`` names, else the 0600 secrets file (id :data:`PASSWORD_SECRET`), else
libpq's own ``PGPASSWORD`` / ``~/.pgpass``.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

SCHEMES: Final = ("postgresql", "postgres")
PASSWORD_SECRET: Final = "store.password"


class StoreError(Exception):
    """A statement the store could not run (the engine's own error, in one line)."""


class IntegrityError(StoreError):
    """A statement broke a constraint (a unique key, a check, a NOT NULL)."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or opened (PostgreSQL down, driver missing, bad url)."""


@dataclass(frozen=True)
class Postgres:
    """A PostgreSQL database: ``url`` without a password, the password apart (never shown)."""

    url: str
    password: str | None = field(default=None, repr=False, compare=False)
    connect_timeout: float = 10.0

    def __str__(self) -> str:
        return self.url


Place = Path | Postgres


def check_url(url: str) -> str:
    """The url if it is a PostgreSQL url without a password in it, else ValueError (one line)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"url is not a url ({exc})") from None
    if parts.scheme not in SCHEMES:
        raise ValueError(f"url must start with postgresql:// (got {parts.scheme or 'no'} scheme)")
    query = urllib.parse.parse_qs(parts.query)
    if parts.password is not None or "password" in query:
        raise ValueError(
            "url must not carry a password (config.toml is not a secret): put it in "
            "the variable [store] password_env names, the secrets file, or ~/.pgpass"
        )
    return url


def place_for(settings: StoreSettings, db_file: Path, home: Path) -> Place:
    """Where the daemon in ``home`` keeps its state: ``[store] url``, else its SQLite file."""
    if settings.url is None:
        return db_file
    password = None
    if settings.password_env is not None:
        password = os.environ.get(settings.password_env)
        if password is None:
            raise StoreUnavailable(
                f"[store] password_env names {settings.password_env}, which is not set"
            )
    else:
        from chalie.mcp.secrets import MissingSecret, SecretFile

        try:
            password = SecretFile(home).get(PASSWORD_SECRET)
        except MissingSecret as exc:
            raise StoreUnavailable(str(exc)) from None
    return Postgres(check_url(settings.url), password, settings.connect_timeout)


class StoreSettings(Protocol):
    """``[store]`` (:class:`chalie.process.config.StoreConfig`)."""

    @property
    def url(self) -> str | None: ...

    @property
    def password_env(self) -> str | None: ...

    @property
    def connect_timeout(self) -> float: ...


# The stores still on SQLite only, by module, with what they hold (one place: the start
# check names them all, and each refuses a PostgreSQL place when it opens). A store leaves
# this table when it is ported onto the interface above.
NOT_ON_POSTGRES: Final[dict[str, str]] = {}


def sqlite_file(place: Place, module: str) -> Path:
    """The SQLite file of a store not on PostgreSQL yet; a PostgreSQL place fails closed."""
    if isinstance(place, Postgres):
        what = NOT_ON_POSTGRES.get(module, module)
        raise StoreUnavailable(
            f"{what} ({module}) cannot be kept in PostgreSQL yet: remove [store] url to "
            "run on SQLite"
        )
    return place


def check_ported(place: Place) -> None:
    """At start: a PostgreSQL place while some store is SQLite-only fails closed, naming each."""
    if isinstance(place, Postgres) and NOT_ON_POSTGRES:
        names = "; ".join(f"{what} ({module})" for module, what in NOT_ON_POSTGRES.items())
        raise StoreUnavailable(
            f"[store] url is a PostgreSQL database, but these stores are not on PostgreSQL "
            f"yet: {names}. Remove [store] url to run on SQLite"
        )


__all__ = [
    "NOT_ON_POSTGRES",
    "PASSWORD_SECRET",
    "IntegrityError",
    "Place",
    "Postgres",
    "StoreError",
    "StoreSettings",
    "StoreUnavailable",
    "check_ported",
    "check_url",
    "place_for",
    "sqlite_file",
]

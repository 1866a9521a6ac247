"""What the personal abilities share in the daemon: the accounts, the settings, the caches.

The composition root builds one :class:`PersonalRuntime` and hands it to
inline abilities as ``services.personal``; tests build their own.
The caches hold parsed calendar objects and address books by collection,
revalidated by CTag/ETag on every call, so a month view reads only what
changed on the server since the last one.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar

from chalie.accounts.failure import AccountFailure
from chalie.accounts.spec import Account
from chalie.accounts.store import AccountStore, Credentials
from chalie.personal.calstore import CalendarStore
from chalie.personal.dav import Collection, DavClient
from chalie.personal.dav import Kind as DavKind
from chalie.personal.http import HttpClient
from chalie.process.home import personal_cache_file
from chalie.result import ToolResult
from chalie.store.store_place import Place

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")
MAX_CACHED: Final = 64
LISTING_TTL: Final = 300.0
# Where a restarted daemon may list an account's collections without finding it again: a
# home set rarely moves, and listing at a stale place fails and finds it again anyway.
STORED_LISTING_TTL: Final = 86_400.0


class CollectionCache(Generic[T]):
    """(account, collection) -> (ctag, value), least recently used dropped past a bound."""

    def __init__(self, limit: int = MAX_CACHED) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, str], tuple[str, T]] = OrderedDict()
        self._limit = limit

    def get(self, key: tuple[str, str]) -> tuple[str, T] | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[str, str], ctag: str, value: T) -> None:
        with self._lock:
            self._items[key] = (ctag, value)
            self._items.move_to_end(key)
            while len(self._items) > self._limit:
                self._items.popitem(last=False)

    def forget(self, account: str) -> None:
        with self._lock:
            for key in [k for k in self._items if k[0] == account]:
                del self._items[key]


@dataclass(frozen=True)
class PersonalSettings:
    timeout: float = 15.0
    zone: str = "UTC"
    max_message_bytes: int = 50 * 1024 * 1024
    forecast_url: str = "https://api.open-meteo.com/v1/forecast"
    geocoding_url: str = "https://geocoding-api.open-meteo.com/v1/search"
    weather_timeout: float = 10.0


def settings_from(config: Any) -> PersonalSettings:
    """The settings from ``[accounts]`` and ``[weather]`` of a
    :class:`chalie.process.config.Config`."""
    a, w = config.accounts, config.weather
    return PersonalSettings(
        timeout=a.timeout,
        zone=a.zone,
        max_message_bytes=a.max_message_mb * 1024 * 1024,
        forecast_url=w.forecast_url,
        geocoding_url=w.geocoding_url,
        weather_timeout=w.timeout,
    )


@dataclass
class PersonalRuntime:
    accounts: AccountStore
    settings: PersonalSettings = PersonalSettings()
    calendars: CollectionCache[Any] = field(default_factory=CollectionCache)
    addressbooks: CollectionCache[Any] = field(default_factory=CollectionCache)
    # (account, kind) -> (when found, (listing URL, depth)): discovery is redone after a while
    listings: CollectionCache[tuple[str, int]] = field(default_factory=CollectionCache)
    # Calendar objects on disk across restarts (None: memory only, as in most tests).
    store: CalendarStore | None = None

    @classmethod
    def open(cls, db_path: Place, home: Path, settings: PersonalSettings) -> PersonalRuntime:
        return cls(
            AccountStore(db_path, home), settings, store=CalendarStore(personal_cache_file(home))
        )

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        self.accounts.close()

    def http(self, creds: Credentials) -> HttpClient:
        a = creds.account
        return HttpClient(
            a.name, username=a.username, password=creds.password, timeout=self.settings.timeout
        )

    def dav(self, creds: Credentials, http: HttpClient) -> DavClient:
        return DavClient(creds.account.name, creds.account.url, http)

    @contextmanager
    def dav_session(self, account: Account) -> Iterator[DavClient]:
        """A DAV client on the account's server with its stored credentials; its HTTP
        connection closes when the block ends."""
        creds = self.accounts.credentials(account)
        with self.http(creds) as http:
            yield self.dav(creds, http)

    def collections(self, dav: DavClient, account: Account, kind: DavKind) -> list[Collection]:
        """The account's collections and their CTags: one PROPFIND once discovery is cached.

        Where to list them (the account URL, or the home set behind its principal) is
        found again after LISTING_TTL seconds, or when listing there fails; the cache
        file keeps it across restarts (for STORED_LISTING_TTL).
        """
        key = (account.name, kind)
        found = self.listings.get(key)
        now = time.monotonic()
        where: tuple[str, int] | None = None
        if found is not None and now - float(found[0]) < LISTING_TTL:
            where = found[1]
        elif found is None and self.store is not None:  # a fresh process: what the last one found
            where = self.store.listing(account, kind, STORED_LISTING_TTL)
            if where is not None:
                self.listings.put(key, str(now), where)
        if where is not None:
            try:
                return dav.listed(kind, *where)
            except AccountFailure as exc:
                if exc.code in ("auth-failed", "account-unreachable"):
                    raise
        where = dav.listing(kind)
        self.listings.put(key, str(now), where)
        if self.store is not None:
            self.store.put_listing(account, kind, where)
        return dav.listed(kind, *where)


class Served(Protocol):
    """An ability, as far as this module needs it (naming chalie.ability's type here would
    close an import circle through chalie.services)."""

    services: Any


def runtime_of(ability: Served) -> PersonalRuntime | ToolResult:
    """The daemon's personal runtime, as the ability's services carry it; an internal error
    when this runtime has none."""
    found = ability.services.personal if ability.services is not None else None
    if not isinstance(found, PersonalRuntime):
        return ToolResult.error(
            "internal-error",
            "accounts are not available in this runtime.",
            hint="this is a fault in the runtime's set-up, not in your call.",
        )
    return found


def with_accounts(ability: Served, act: Callable[[PersonalRuntime], ToolResult]) -> ToolResult:
    """``act`` on the personal runtime; an account failure is its structured error."""
    rt = runtime_of(ability)
    if isinstance(rt, ToolResult):
        return rt
    try:
        return act(rt)
    except AccountFailure as exc:
        return exc.result()

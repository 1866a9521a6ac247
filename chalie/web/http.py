"""Fetching one URL for the model: the project's HTTP client (httpx2) under the SSRF guard.

Every TCP connection the client opens goes through :class:`GuardedBackend`,
which resolves the host with the guard, checks every address, and connects to
the checked one (so a redirect's new host, and a host that re-resolves
differently, are checked each time). Redirects are followed here, one hop at
a time, up to ``max_redirects``, each hop's URL checked in form as well
(http(s) only, no credentials). The body is read as it arrives and cut off at
``max_bytes`` (counted after decompression, so a small gzip bomb is cut too),
within ``timeout`` seconds for the whole fetch, not per read: the deadline runs from
the connect to the last byte, headers included (every socket read and write of the
fetch waits at most until it, :class:`_DeadlineStream`, so a server trickling its
headers a byte at a time is cut at the deadline too). The caller's ``cancelled`` event
ends the fetch too: a read waits in slices of at most :data:`CANCEL_SLICE` seconds and
looks at it between them, so a fetch blocked on a silent or trickling server ends within
one slice of being cancelled (``cancelled``); a connect still waits until the deadline.

One site cannot starve the others: at most ``per_site`` fetches to one scheme, host
and port run at once; one more is refused at once (``fetch-busy``) instead of holding
a thread of the tool's lane while it waits.

Environment proxies are ignored (``trust_env=False``): a proxy would make the
connection the guard checked one to the proxy, not to the page.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any, Final
from urllib.parse import urljoin, urlsplit

import httpcore2
import httpx2

from chalie.net.ssrf import BLOCKED_CODE, Blocked, Guard
from chalie.net.tls import tls_context

# Seconds a read of a cancellable fetch waits before it looks at the cancel event again.
CANCEL_SLICE: Final = 0.1
REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
ACCEPT: Final = (
    "text/html,application/xhtml+xml,application/pdf,application/json,text/plain,"
    "text/markdown;q=0.9,*/*;q=0.5"
)


class FetchError(Exception):
    """A fetch that failed; ``code`` is one of the web codes of chalie.errors."""

    def __init__(self, code: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint


# The deadline (time.monotonic()) and cancel event of the fetch this thread is making, if
# any: a pooled connection is read by the thread whose request it serves.
_current = threading.local()


@contextlib.contextmanager
def _until(deadline: float, cancelled: threading.Event | None = None) -> Iterator[None]:
    before = getattr(_current, "deadline", None), getattr(_current, "cancelled", None)
    _current.deadline, _current.cancelled = deadline, cancelled
    try:
        yield
    finally:
        _current.deadline, _current.cancelled = before


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """The wait one socket operation may take: its own timeout, cut at the fetch's deadline."""
    deadline: float | None = getattr(_current, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the fetch's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore2.NetworkStream):
    """A connection whose every read and write ends by the current fetch's deadline."""

    def __init__(self, inner: httpcore2.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        wait = _left(timeout, httpcore2.ReadTimeout)
        cancelled: threading.Event | None = getattr(_current, "cancelled", None)
        if cancelled is None:
            return self._inner.read(max_bytes, wait)
        end = None if wait is None else time.monotonic() + wait
        while True:  # in slices, looking at the cancel event between them
            if cancelled.is_set():
                raise httpcore2.ReadError("the fetch was cancelled")
            left = CANCEL_SLICE if end is None else min(CANCEL_SLICE, end - time.monotonic())
            if left <= 0:
                raise httpcore2.ReadTimeout("the read's time passed")
            try:
                return self._inner.read(max_bytes, left)
            except httpcore2.ReadTimeout:
                continue

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore2.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.NetworkStream:
        wait = _left(timeout, httpcore2.ConnectTimeout)
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, wait))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class GuardedBackend(httpcore2.SyncBackend):
    """httpcore's socket backend, connecting only to addresses the guard checked, each
    connection held to the current fetch's deadline (:class:`_DeadlineStream`)."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        wait = _left(timeout, httpcore2.ConnectTimeout)
        try:
            target = self.guard.resolve(host, port)
        except OSError as exc:
            raise httpcore2.ConnectError(str(exc)) from None
        # TLS still names ``host`` (SNI and the certificate check use the URL's host).
        return _DeadlineStream(
            super().connect_tcp(target.address, port, wait, local_address, socket_options)
        )


class _SiteSlots:
    """At most ``per_site`` fetches to one site (scheme, host, port) at once."""

    def __init__(self, per_site: int) -> None:
        self._per_site = per_site
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}

    @contextlib.contextmanager
    def hold(self, url: str) -> Iterator[None]:
        try:
            parts = urlsplit(url)
            host, site = parts.hostname or url, f"{parts.scheme}://{parts.hostname}:{parts.port}"
        except ValueError:
            host = site = url  # not a usable URL: the request says so
        with self._lock:
            if self._busy.get(site, 0) >= self._per_site:
                raise FetchError(
                    "fetch-busy",
                    f"{self._per_site} fetches to {host[:100]} are running already",
                    "Wait for them to finish, then fetch fewer pages from that site at once.",
                )
            self._busy[site] = self._busy.get(site, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._busy[site] - 1
                if left:
                    self._busy[site] = left
                else:
                    del self._busy[site]


def guarded_client(guard: Guard, *, user_agent: str, timeout: float) -> httpx2.Client:
    """An httpx2 client whose every connection passes the guard (no proxies, no redirects)."""
    transport = httpx2.HTTPTransport(verify=tls_context(), trust_env=False)
    # The transport's pool is httpcore's; ours differs only in its network backend.
    transport._pool = httpcore2.ConnectionPool(
        ssl_context=tls_context(),
        max_connections=20,
        max_keepalive_connections=10,
        keepalive_expiry=30.0,
        network_backend=GuardedBackend(guard),
    )
    return httpx2.Client(
        transport=transport,
        # One client serves every turn: no cookie may be kept from one fetch to the next.
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
        trust_env=False,
        follow_redirects=False,
        timeout=httpx2.Timeout(timeout),
        headers={"User-Agent": user_agent, "Accept": ACCEPT},
    )


@dataclass(frozen=True)
class Fetched:
    """What came back: the final URL, status, content type and charset, the raw body."""

    url: str
    status: int
    content_type: str
    charset: str | None
    body: bytes
    redirects: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Limits:
    timeout: float = 20.0
    max_bytes: int = 10 * 1024 * 1024
    max_redirects: int = 5
    # Fetches to one site at once (fetch-busy past it).
    per_site: int = 4


class Fetcher:
    """One guard, one client, the limits: share it between threads."""

    def __init__(self, guard: Guard, limits: Limits, user_agent: str) -> None:
        self.guard = guard
        self.limits = limits
        self._client = guarded_client(guard, user_agent=user_agent, timeout=limits.timeout)
        self._sites = _SiteSlots(limits.per_site)

    def close(self) -> None:
        self._client.close()

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        cancelled: threading.Event | None = None,
    ) -> Fetched:
        """One request, no redirect followed and any status returned (the browser's routing).

        The guard still checks the URL and the connection; limits as :meth:`fetch`.
        """
        limits = self.limits
        deadline = time.monotonic() + limits.timeout
        try:
            self.guard.check_url(url)
            _check_cancelled(cancelled)
            with (
                self._sites.hold(url),
                _until(deadline, cancelled),
                self._client.stream(
                    method, url, headers=dict(headers or {}), content=content
                ) as response,
            ):
                body = _read(response, limits.max_bytes, deadline, limits.timeout, cancelled)
                return _described(url, response, body, ())
        except Blocked as exc:
            raise FetchError(BLOCKED_CODE, exc.reason, _BLOCKED_HINT) from None
        except httpx2.TimeoutException:
            _check_cancelled(cancelled)
            raise _timeout(limits.timeout) from None
        except (httpx2.InvalidURL, ValueError) as exc:
            raise FetchError("invalid-param", f"not a usable URL: {_reason(exc)}") from None
        except httpx2.HTTPError as exc:
            _check_cancelled(cancelled)
            raise FetchError("fetch-failed", f"{url}: {_reason(exc)}") from None

    def fetch(
        self,
        url: str,
        *,
        cancelled: threading.Event | None = None,
        max_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Fetched:
        """GET ``url`` within the limits; raises FetchError (code ``blocked-address`` ...)."""
        limits = self.limits
        cap = limits.max_bytes if max_bytes is None else min(max_bytes, limits.max_bytes)
        deadline = time.monotonic() + limits.timeout
        seen: list[str] = []
        current = url
        for _hop in range(limits.max_redirects + 1):
            _check_cancelled(cancelled)
            try:
                self.guard.check_url(current)
            except Blocked as exc:
                raise FetchError(BLOCKED_CODE, exc.reason, _BLOCKED_HINT) from None
            if current in seen:
                raise FetchError("too-many-redirects", f"redirect loop at {current}")
            seen.append(current)
            left = deadline - time.monotonic()
            if left <= 0:
                raise _timeout(limits.timeout)
            try:
                with (
                    self._sites.hold(current),
                    _until(deadline, cancelled),
                    self._client.stream(
                        "GET", current, headers=dict(headers or {}), timeout=httpx2.Timeout(left)
                    ) as response,
                ):
                    if response.status_code in REDIRECTS and "location" in response.headers:
                        current = urljoin(current, response.headers["location"])
                        continue
                    body = _read(response, cap, deadline, limits.timeout, cancelled)
                    return _fetched(current, response, body, tuple(seen[:-1]))
            except Blocked as exc:
                raise FetchError(BLOCKED_CODE, exc.reason, _BLOCKED_HINT) from None
            except httpx2.TimeoutException:
                _check_cancelled(cancelled)
                raise _timeout(limits.timeout) from None
            except (httpx2.InvalidURL, ValueError) as exc:
                raise FetchError(
                    "invalid-param", f"not a usable URL: {_reason(exc)}", _URL_HINT
                ) from None
            except httpx2.HTTPError as exc:
                _check_cancelled(cancelled)
                raise FetchError("fetch-failed", f"{current}: {_reason(exc)}") from None
        raise FetchError(
            "too-many-redirects",
            f"more than {limits.max_redirects} redirects from {url}",
            "Fetch the last URL of the chain directly, or give up on this page.",
        )


_URL_HINT: Final = "Pass a whole http(s) URL, as found in a search result or a link."
_BLOCKED_HINT: Final = "Only public web addresses can be fetched; try another source."


def _timeout(limit: float) -> FetchError:
    return FetchError(
        "fetch-timeout",
        f"the page did not arrive within {limit:g} s",
        "Try again later or use another source.",
    )


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:300]


def _read(
    response: httpx2.Response,
    cap: int,
    deadline: float,
    limit: float,
    cancelled: threading.Event | None,
) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap and "content-encoding" not in response.headers:
        raise _too_large(cap)
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():  # as they arrive: a trickle still meets the deadline
        size += len(chunk)
        if size > cap:
            raise _too_large(cap)
        if time.monotonic() > deadline:
            raise _timeout(limit)
        _check_cancelled(cancelled)
        chunks.append(chunk)
    return b"".join(chunks)


def _check_cancelled(cancelled: threading.Event | None) -> None:
    if cancelled is not None and cancelled.is_set():
        raise FetchError("cancelled", "the fetch was cancelled")


def _too_large(cap: int) -> FetchError:
    return FetchError(
        "fetch-too-large",
        f"the response is larger than {cap} bytes",
        "This page is too big to read whole; look for a smaller page or a summary.",
    )


def _fetched(
    url: str, response: httpx2.Response, body: bytes, redirects: tuple[str, ...]
) -> Fetched:
    if response.status_code >= 400:
        raise FetchError(
            "fetch-failed",
            f"{url} answered HTTP {response.status_code}",
            "The page is missing or refused; try another result.",
        )
    return _described(url, response, body, redirects)


def _described(
    url: str, response: httpx2.Response, body: bytes, redirects: tuple[str, ...]
) -> Fetched:
    raw_type = response.headers.get("content-type", "")
    media, _, params = raw_type.partition(";")
    charset = None
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key.lower() == "charset" and value:
            charset = value.strip().strip("\"'").lower()
    return Fetched(
        url=url,
        status=response.status_code,
        content_type=media.strip().lower(),
        charset=charset,
        body=body,
        redirects=redirects,
        headers={k.lower(): v for k, v in response.headers.items()},
    )

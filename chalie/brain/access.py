"""Who gets into the Brain: the owner rule, sessions, one-time links, CSRF, Host and Origin.

Everything here is pure state and rules, safe to call from any thread; the web layer
(:mod:`chalie.brain.web`) applies them to requests.

- :func:`is_owner` is the one place that says whether a verified token is the owner's:
  an active token whose scope is ``owner`` (:mod:`chalie.wire.principals`).
- A session is a random id in an HttpOnly, SameSite=Strict cookie; the book keeps only its
  sha256, the hash of the token it was opened with (so revoking the token ends it), its CSRF
  secret and when it expires.
- A one-time link (``chalie brain open``) is a random code that opens one session within
  :data:`LINK_TTL` seconds and never again. It never goes on a command line (any local user
  reads ``/proc/*/cmdline``): the browser is given a 0600 page (:func:`sign_in_page`) that
  goes on to the link. Such a session has no token behind it; :meth:`DashboardSessions.close_all`
  (``chalie brain sign-out``) ends it.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final

import msgspec

from chalie.gate.tokens import TokenInfo
from chalie.net.loopback import host_names
from chalie.wire.principals import LOCAL_OWNER, Principal, may_chat

COOKIE: Final = "chalie_brain"
PRE_COOKIE: Final = "chalie_brain_pre"  # the sign-in form's double-submit nonce
CSRF_HEADER: Final = "x-csrf-token"
CSRF_FIELD: Final = "csrf"
SESSION_TTL: Final = 8 * 3600.0
LINK_TTL: Final = 120.0
MAX_SESSIONS: Final = 256
MAX_LINKS: Final = 64
# A link session is the local operator's (the control socket is the owner's): no token backs it.
LOCAL_PRINCIPAL: Final = "local"


def is_owner(token: TokenInfo) -> bool:
    """Whether this verified token is the owner's: active, and of the ``owner`` scope.

    An agent or gateway token is refused: the REST API answers 403 and the sign-in form
    refuses it.
    """
    return token.active and may_chat(token.principal())


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """One signed-in browser. ``token_hash`` is None for a one-time-link session.

    ``principal`` is the name shown; ``who`` is the caller an operation that needs one gets
    (the token's principal, or the local owner for a one-time-link session)."""

    principal: str
    token_hash: str | None
    csrf: str
    created: float
    expires: float
    who: Principal = LOCAL_OWNER


class DashboardSessions:
    """Dashboard sessions and one-time links, in memory (a daemon restart signs everyone out)."""

    def __init__(
        self,
        *,
        ttl: float = SESSION_TTL,
        link_ttl: float = LINK_TTL,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ttl = ttl
        self._link_ttl = link_ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._links: dict[str, float] = {}

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def link_ttl(self) -> float:
        return self._link_ttl

    def open(
        self, principal: str, token_hash: str | None, who: Principal = LOCAL_OWNER
    ) -> tuple[str, Session]:
        """A new session; returns the cookie value (shown once) and the session."""
        sid = secrets.token_urlsafe(32)
        now = self._clock()
        session = Session(
            principal=principal,
            token_hash=token_hash,
            csrf=secrets.token_urlsafe(32),
            created=now,
            expires=now + self._ttl,
            who=who,
        )
        with self._lock:
            self._sweep(now)
            if len(self._sessions) >= MAX_SESSIONS:  # the oldest goes first
                oldest = min(self._sessions, key=lambda k: self._sessions[k].created)
                del self._sessions[oldest]
            self._sessions[_digest(sid)] = session
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        """The live session this cookie names, else None."""
        if not sid or len(sid) > 128:
            return None
        key = _digest(sid)
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                return None
            if session.expires <= self._clock():
                del self._sessions[key]
                return None
            return session

    def close(self, sid: str | None) -> bool:
        if not sid or len(sid) > 128:
            return False
        with self._lock:
            return self._sessions.pop(_digest(sid), None) is not None

    def close_for_token(self, token_hashes: Iterable[str]) -> int:
        """End the sessions opened with any of these tokens (they were revoked)."""
        gone = set(token_hashes)
        with self._lock:
            keys = [k for k, s in self._sessions.items() if s.token_hash in gone]
            for k in keys:
                del self._sessions[k]
        return len(keys)

    def close_all(self) -> int:
        """Sign every browser out (one-time-link sessions included) and spend every link."""
        with self._lock:
            gone = len(self._sessions)
            self._sessions.clear()
            self._links.clear()
        return gone

    def count(self) -> int:
        with self._lock:
            self._sweep(self._clock())
            return len(self._sessions)

    def _sweep(self, now: float) -> None:
        for k in [k for k, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[k]
        for k in [k for k, t in self._links.items() if t <= now]:
            del self._links[k]

    # -- one-time links ----------------------------------------------------------------
    def new_link(self) -> str:
        """A code that opens one session within the link lifetime."""
        code = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            self._sweep(now)
            if len(self._links) >= MAX_LINKS:
                oldest = min(self._links, key=lambda k: self._links[k])
                del self._links[oldest]
            self._links[_digest(code)] = now + self._link_ttl
        return code

    def redeem(self, code: str | None) -> bool:
        """Whether the code was a live link; it is spent either way."""
        if not code or len(code) > 128:
            return False
        with self._lock:
            expires = self._links.pop(_digest(code), None)
        return expires is not None and expires > self._clock()


def sign_in_page(url: str) -> str:
    """The page ``chalie brain open`` hands the browser instead of the link itself: it goes
    on to ``url`` at once (a script, or a refresh where scripts are off)."""
    shown = html.escape(url, quote=True)
    target = json.dumps(url).replace("<", "\\u003c")
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="0;url={shown}">'
        "<title>Signing in to Chalie</title></head><body>"
        f'<p><a href="{shown}">Sign in to the Brain</a></p>'
        f"<script>location.replace({target});</script></body></html>\n"
    )


def same_secret(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a submitted CSRF token with the session's."""
    if not isinstance(given, str) or not given or len(given) > 256:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def allowed_hosts(host: str, port: int, extra: Iterable[str] = ()) -> frozenset[str]:
    """The Host header values the server answers (the DNS-rebinding guard), as the MCP server's."""
    return frozenset({f"{n}:{port}" for n in host_names(host)} | set(extra))


def allowed_origins(hosts: Iterable[str], extra: Iterable[str] = ()) -> frozenset[str]:
    """The browser origins of those hosts (http and https) plus configured ones."""
    found = set(extra)
    for h in hosts:
        found.add(f"http://{h}")
        found.add(f"https://{h}")
    return frozenset(found)


__all__ = [
    "COOKIE",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "LOCAL_PRINCIPAL",
    "DashboardSessions",
    "Session",
    "allowed_hosts",
    "allowed_origins",
    "is_owner",
    "same_secret",
]

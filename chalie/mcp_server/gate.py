"""The ASGI gate in front of the MCP app: bearer token, per-token limits, body size.

Order for every HTTP request, each step answering itself when it refuses:

0. ``GET /.well-known/oauth-protected-resource`` (RFC 9728, also with the
   resource path after it) answers its metadata without a token: this resource
   takes bearer tokens in the header and names no authorization server (tokens
   come from ``chalie token``), so an OAuth-capable client reports a bad token
   instead of an OAuth failure. Any other ``/.well-known/`` path is 404.
1. ``Authorization: Bearer <token>`` (the scheme in any case, one rule:
   :func:`chalie.gate.tokens.bearer`) parsed and verified against the token store:
   missing, malformed, unknown or revoked → 401 with ``WWW-Authenticate``.
   The caller is the token's principal (id and scope); what is keyed by a
   token below is keyed by its id.
2. The token's requests-per-minute bucket → 429 with ``Retry-After``.
3. A body over the limit (by ``Content-Length`` or as it streams) → 413.
4. A stateful session belongs to the token that opened it: a request naming
   another token's (or an unknown) ``mcp-session-id`` gets 404; a token at its
   session quota cannot open another (429), so one token cannot use them all.
   A body nested past the depth rule gets 400 ``malformed-frame``.
5. A ``tools/call`` takes one of the token's turn slots for as long as its
   response runs → 429 with ``Retry-After`` when all are in use.
6. The request goes on with a :class:`Caller` in ``scope["state"]`` (the tool
   reads the token's name there) and a replayed body; a client that goes away
   sets ``Caller.gone``, which the tool turns into a cancelled turn.

Nothing reaches the MCP app, and so no turn starts, before steps 1 to 5 passed.
Runs on the event-loop thread, the token check too (one indexed read; the store
writes ``last_used`` on a thread of its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import msgspec

from chalie.gate.tokens import bearer
from chalie.mcp_server.limits import Refused, TokenLimits
from chalie.wire.frames import MAX_DEPTH, TooDeep, check_json_depth
from chalie.wire.principals import Principal, check_scope, may_use_gateway
from chalie.wire.principals import Scope as TokenScope

log = logging.getLogger("chalie.mcp_server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CALLER_KEY: Final = "chalie.caller"
REALM: Final = 'Bearer realm="chalie"'
WELL_KNOWN: Final = "/.well-known/"
RESOURCE_METADATA: Final = "/.well-known/oauth-protected-resource"


class NamedToken(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def id(self) -> str: ...

    @property
    def scope(self) -> str: ...


class TokenVerifier(Protocol):
    """The TokenStore (chalie.gate.tokens), as the gate uses it."""

    def verify(self, secret: str) -> NamedToken | None: ...


@dataclass
class Caller:
    """Who sent this request, as the gate established it: a token's principal."""

    token_name: str
    token_id: str = ""
    scope: TokenScope = "agent"
    gone: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def gateway(self) -> bool:
        """The token may call Chalie's tools directly (when the server allows)."""
        return may_use_gateway(self.principal)

    @property
    def principal(self) -> Principal:
        return Principal(scope=self.scope, id=self.token_id, name=self.token_name)


@dataclass
class GateStats:
    admitted: int = 0
    unauthorized: int = 0
    limited: int = 0
    too_large: int = 0
    malformed: int = 0


class _Peek(msgspec.Struct):
    method: str | None = None


_peek = msgspec.json.Decoder(_Peek)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


async def refuse(
    send: Send,
    status: int,
    code: str,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """An HTTP error whose body is a JSON-RPC error carrying the stable code."""
    error = {"code": -32000, "message": message, "data": {"code": code}}
    await _send_json(send, status, {"jsonrpc": "2.0", "id": None, "error": error}, headers)


async def _send_json(
    send: Send, status: int, value: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A whole JSON answer straight on the ASGI channel, before any app sees the request."""
    body = msgspec.json.encode(value)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Gate:
    """Pure-ASGI wrapper: authenticate, limit, then hand the request to ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        verifier: Callable[[], TokenVerifier],
        limits: TokenLimits,
        *,
        max_body_bytes: int,
        max_sessions: int = 1_000,
        resource: str = "",
        max_sessions_per_token: int | None = None,
        session_idle_timeout: float = 600.0,
    ) -> None:
        self.app = app
        self.resource = resource  # this server's MCP URL, as RFC 9728 metadata names it
        self._verifier_factory = verifier
        self._verifier: TokenVerifier | None = None
        self.limits = limits
        self.max_body = max_body_bytes
        self.sessions = SessionOwners(
            max_sessions, per_token=max_sessions_per_token, idle_timeout=session_idle_timeout
        )
        self.stats = GateStats()

    def _verify(self, secret: str) -> NamedToken | None:
        if self._verifier is None:
            self._verifier = self._verifier_factory()
        return self._verifier.verify(secret)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        if path.startswith(WELL_KNOWN):
            await self._well_known(path, send)
            return
        who = await self._authenticate(scope, send)
        if who is None:
            return
        # Limits and sessions are keyed by the token's id, never its name.
        key = who.token_id
        try:
            self.limits.admit(key)
        except Refused as exc:
            self.stats.limited += 1
            await self._too_many(send, exc)
            return
        session = _header(scope, b"mcp-session-id")
        if session is not None and not self.sessions.allows(session, key):
            self.stats.unauthorized += 1
            await refuse(send, 404, "unknown-session", "Session not found")
            return
        if session is None and not self.sessions.room_for(key):
            # A new session for a token at its quota: others' sessions stay reachable.
            self.stats.limited += 1
            log.warning(
                "MCP token at its session quota; new session refused",
                # "principal", not "token_id": a key naming a token is masked in the log,
                # and the id is no secret (the operator must tell which token it is).
                extra={"principal": key, "quota": self.sessions.per_token},
            )
            await refuse(
                send,
                429,
                Refused.code,
                f"this token already holds {self.sessions.per_token} sessions; "
                "end one (DELETE) or reuse its mcp-session-id",
                [(b"retry-after", b"60")],
            )
            return
        send = self.sessions.recorder(
            key, send, deleting=session if scope.get("method") == "DELETE" else None
        )
        if scope.get("method") != "POST":
            scope.setdefault("state", {})[CALLER_KEY] = who
            self.stats.admitted += 1
            await self.app(scope, receive, send)
            return
        body = await self._read_body(scope, receive, send)
        if body is None:
            return
        if not _well_formed(body):
            self.stats.malformed += 1
            await refuse(
                send,
                400,
                "malformed-frame",
                f"the body nests deeper than {MAX_DEPTH} levels",
            )
            return
        is_call = _is_tool_call(scope, body)
        if is_call:
            try:
                self.limits.begin_turn(key)
            except Refused as exc:
                self.stats.limited += 1
                await self._too_many(send, exc)
                return
        scope.setdefault("state", {})[CALLER_KEY] = who
        self.stats.admitted += 1
        try:
            await self._forward(scope, receive, send, body, who)
        finally:
            if is_call:
                self.limits.end_turn(key)

    async def _authenticate(self, scope: Scope, send: Send) -> Caller | None:
        raw = _header(scope, b"authorization")
        if raw is None:
            await self._unauthorized(send, REALM, "a bearer token is required")
            return None
        secret = bearer(raw)
        if secret is None:
            await self._unauthorized(
                send,
                f'{REALM}, error="invalid_request"',
                "the Authorization header is not 'Bearer <token>'",
            )
            return None
        try:
            # On the loop: one indexed read (the store writes last_used on a thread of its own).
            info = self._verify(secret)
        except Exception:
            # Fail closed: a broken store admits nobody.
            log.exception("token store failed; request refused")
            self.stats.unauthorized += 1
            await refuse(send, 503, "internal-error", "the token store is unavailable")
            return None
        if info is None:
            await self._unauthorized(
                send, f'{REALM}, error="invalid_token"', "the token is unknown or revoked"
            )
            return None
        try:
            token_scope = check_scope(getattr(info, "scope", "agent"))
        except ValueError:
            token_scope = "agent"  # fail closed: the least privilege
        return Caller(
            info.name, token_id=str(getattr(info, "id", "") or info.name), scope=token_scope
        )

    async def _unauthorized(self, send: Send, challenge: str, message: str) -> None:
        self.stats.unauthorized += 1
        if self.resource:
            challenge += f', resource_metadata="{self._metadata_url()}"'
        await refuse(
            send, 401, "unauthorized", message, [(b"www-authenticate", challenge.encode())]
        )

    def _metadata_url(self) -> str:
        scheme, _, rest = self.resource.partition("://")
        origin = rest.split("/", 1)[0]
        return f"{scheme}://{origin}{RESOURCE_METADATA}"

    async def _well_known(self, path: str, send: Send) -> None:
        resource_path = "/" + self.resource.partition("://")[2].partition("/")[2]
        no_store = [(b"cache-control", b"no-store")]
        if self.resource and path in (RESOURCE_METADATA, RESOURCE_METADATA + resource_path):
            metadata = {
                "resource": self.resource,
                "bearer_methods_supported": ["header"],
                "resource_name": "Chalie",
            }
            await _send_json(send, 200, metadata, no_store)
        else:
            await _send_json(send, 404, {"error": "not_found"}, no_store)

    async def _too_many(self, send: Send, exc: Refused) -> None:
        await refuse(
            send,
            429,
            Refused.code,
            exc.detail,
            [(b"retry-after", str(exc.retry_after).encode())],
        )

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await refuse(send, 400, "invalid-arguments", "Content-Length is not a number")
                return None
            if size > self.max_body:
                await self._too_large(send)
                return None
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body:
                await self._too_large(send)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _too_large(self, send: Send) -> None:
        self.stats.too_large += 1
        await refuse(
            send,
            413,
            "body-too-large",
            f"the request body is over the limit of {self.max_body} bytes",
        )

    async def _forward(
        self, scope: Scope, receive: Receive, send: Send, body: bytes, caller: Caller
    ) -> None:
        delivered = False

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    caller.gone.set()
                    return

        watcher = asyncio.get_running_loop().create_task(watch())

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await caller.gone.wait()
            return {"type": "http.disconnect"}

        try:
            await self.app(scope, replay, send)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


class SessionOwners:
    """mcp-session-id → the token id that opened it, learnt from the responses that create one.

    A session id the gate never saw created is refused (404): an entry can be
    neither flushed nor re-bound to another token. An entry leaves when its
    session is deleted (a DELETE answered 2xx) or has been idle past the app's
    own idle timeout (the app reaped it too). Each token holds at most
    ``per_token`` sessions, so one token cannot use up ``max_sessions``.
    """

    def __init__(
        self, max_sessions: int, *, per_token: int | None = None, idle_timeout: float = 600.0
    ) -> None:
        self._owners: dict[bytes, tuple[str, float]] = {}  # session -> (token id, last seen)
        self._per: dict[str, int] = {}
        self.max_sessions = max_sessions
        self.per_token = per_token if per_token is not None else max_sessions
        self._idle = idle_timeout
        self._clock = time.monotonic

    def allows(self, session: bytes, token_id: str) -> bool:
        found = self._owners.get(session)
        if found is None or found[0] != token_id:
            return False
        self._owners[session] = (token_id, self._clock())
        return True

    def room_for(self, token_id: str) -> bool:
        """May ``token_id`` open one more session?"""
        if self._per.get(token_id, 0) < self.per_token:
            return True
        self._sweep()
        return self._per.get(token_id, 0) < self.per_token

    def recorder(self, token_id: str, send: Send, *, deleting: bytes | None = None) -> Send:
        async def recording(message: Message) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers", ()):
                    if key.lower() == b"mcp-session-id":
                        self._bind(bytes(value), token_id)
                status = int(message.get("status", 0))
                if deleting is not None and (200 <= status < 300 or status == 404):
                    self._drop(deleting)
            await send(message)

        return recording

    def _bind(self, session: bytes, token_id: str) -> None:
        if session in self._owners:
            return  # first owner wins
        if len(self._owners) >= self.max_sessions:
            self._sweep()
        self._owners[session] = (token_id, self._clock())
        self._per[token_id] = self._per.get(token_id, 0) + 1

    def _drop(self, session: bytes) -> None:
        found = self._owners.pop(session, None)
        if found is not None:
            left = self._per.get(found[0], 0) - 1
            if left > 0:
                self._per[found[0]] = left
            else:
                self._per.pop(found[0], None)

    def _sweep(self) -> None:
        cutoff = self._clock() - self._idle
        for session in [k for k, (_, seen) in self._owners.items() if seen < cutoff]:
            self._drop(session)

    def held(self, token_id: str) -> int:
        return self._per.get(token_id, 0)

    def __len__(self) -> int:
        return len(self._owners)


def _well_formed(body: bytes) -> bool:
    """Not nested past the one depth rule (chalie.wire.frames): a parser would recurse into it."""
    try:
        check_json_depth(body)
    except TooDeep:
        return False
    return True


def _is_tool_call(scope: Scope, body: bytes) -> bool:
    # Either says so: a header that disagrees with the body must not dodge the slot.
    if _header(scope, b"mcp-method") == b"tools/call":
        return True
    try:
        return _peek.decode(body).method == "tools/call"
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return False  # not one JSON-RPC object: the MCP app answers it

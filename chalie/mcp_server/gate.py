"""The ASGI gate in front of the MCP app: bearer token, per-token limits, body size.

Order for every HTTP request, each step answering itself when it refuses:

0. ``GET /.well-known/oauth-protected-resource`` (RFC 9728, also with the
   resource path after it) answers its metadata without a token: this resource
   takes bearer tokens in the header and names no authorization server (tokens
   come from ``chalie token``), so an OAuth-capable client reports a bad token
   instead of an OAuth failure. Any other ``/.well-known/`` path is 404.
1. ``Authorization: Bearer <token>`` (the scheme in any case, :func:`bearer_secret`)
   parsed and verified against the token store: missing, malformed, unknown or
   revoked → 401 with ``WWW-Authenticate`` (naming the metadata).
2. The token's requests-per-minute bucket → 429 with ``Retry-After``.
3. A body over the limit (by ``Content-Length`` or as it streams) → 413.
4. A stateful session belongs to the token that opened it: a request naming
   another token's ``mcp-session-id`` gets 404, as an unknown session would.
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
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import msgspec

from chalie.mcp_server.limits import Refused, TokenLimits

log = logging.getLogger("chalie.mcp_server")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CALLER_KEY: Final = "chalie.caller"
REALM: Final = 'Bearer realm="chalie"'
# Token checks read (and stamp) SQLite, which may wait on another writer: never on the loop.
# RFC 6750 b64token, bounded; the scheme is case-insensitive (RFC 9110 11.1).
_BEARER: Final = re.compile(r"^[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9\-._~+/]{8,512}=*)$")
WELL_KNOWN: Final = "/.well-known/"
RESOURCE_METADATA: Final = "/.well-known/oauth-protected-resource"


def bearer_secret(header: str) -> str | None:
    """The token of an ``Authorization`` header value, or None when it is not a bearer one."""
    match = _BEARER.match(header)
    return match.group(1) if match is not None else None


class NamedToken(Protocol):
    @property
    def name(self) -> str: ...


class TokenVerifier(Protocol):
    """The TokenStore (chalie.tokens), as the gate uses it."""

    def verify(self, secret: str) -> NamedToken | None: ...


@dataclass
class Caller:
    """Who sent this request, as the gate established it."""

    token_name: str
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    # The token carries the gateway permission (direct tool calls, when the server allows).
    gateway: bool = False


@dataclass
class GateStats:
    admitted: int = 0
    unauthorized: int = 0
    limited: int = 0
    too_large: int = 0


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
    body = msgspec.json.encode(
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32000, "message": message, "data": {"code": code}},
        }
    )
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
    ) -> None:
        self.app = app
        self.resource = resource  # this server's MCP URL, as RFC 9728 metadata names it
        self._verifier_factory = verifier
        self._verifier: TokenVerifier | None = None
        self.limits = limits
        self.max_body = max_body_bytes
        self.sessions = SessionOwners(max_sessions)
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
        name, gateway = who
        try:
            self.limits.admit(name)
        except Refused as exc:
            self.stats.limited += 1
            await self._too_many(send, exc)
            return
        session = _header(scope, b"mcp-session-id")
        if session is not None and not self.sessions.allows(session, name):
            self.stats.unauthorized += 1
            await refuse(send, 404, "unknown-session", "Session not found")
            return
        send = self.sessions.recorder(name, send)
        if scope.get("method") != "POST":
            scope.setdefault("state", {})[CALLER_KEY] = Caller(name, gateway=gateway)
            self.stats.admitted += 1
            await self.app(scope, receive, send)
            return
        body = await self._read_body(scope, receive, send)
        if body is None:
            return
        is_call = _is_tool_call(scope, body)
        if is_call:
            try:
                self.limits.begin_turn(name)
            except Refused as exc:
                self.stats.limited += 1
                await self._too_many(send, exc)
                return
        caller = Caller(name, gateway=gateway)
        scope.setdefault("state", {})[CALLER_KEY] = caller
        self.stats.admitted += 1
        try:
            await self._forward(scope, receive, send, body, caller)
        finally:
            if is_call:
                self.limits.end_turn(name)

    async def _authenticate(self, scope: Scope, send: Send) -> tuple[str, bool] | None:
        raw = _header(scope, b"authorization")
        if raw is None:
            await self._unauthorized(send, REALM, "a bearer token is required")
            return None
        secret = bearer_secret(raw.decode("latin-1"))
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
        return info.name, getattr(info, "gateway", False) is True

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
        if self.resource and path in (RESOURCE_METADATA, RESOURCE_METADATA + resource_path):
            body = msgspec.json.encode(
                {
                    "resource": self.resource,
                    "bearer_methods_supported": ["header"],
                    "resource_name": "Chalie",
                }
            )
            status = 200
        else:
            body = msgspec.json.encode({"error": "not_found"})
            status = 404
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

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
    """mcp-session-id → the token that opened it, learnt from the responses that create one.

    Bounded: past ``2 * max_sessions`` entries the oldest are forgotten (the MCP
    app holds at most ``max_sessions`` sessions; a forgotten one is re-bound to
    the next token that presents it, which the app itself will have reaped).
    """

    def __init__(self, max_sessions: int) -> None:
        self._owners: dict[bytes, str] = {}
        self._cap = 2 * max_sessions

    def allows(self, session: bytes, token_name: str) -> bool:
        owner = self._owners.get(session)
        return owner is None or owner == token_name

    def recorder(self, token_name: str, send: Send) -> Send:
        async def recording(message: Message) -> None:
            if message["type"] == "http.response.start":
                for key, value in message.get("headers", ()):
                    if key.lower() == b"mcp-session-id":
                        self._bind(bytes(value), token_name)
            await send(message)

        return recording

    def _bind(self, session: bytes, token_name: str) -> None:
        self._owners.setdefault(session, token_name)
        while len(self._owners) > self._cap:
            del self._owners[next(iter(self._owners))]

    def __len__(self) -> int:
        return len(self._owners)


def _is_tool_call(scope: Scope, body: bytes) -> bool:
    # Either says so: a header that disagrees with the body must not dodge the slot.
    if _header(scope, b"mcp-method") == b"tools/call":
        return True
    try:
        return _peek.decode(body).method == "tools/call"
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False  # not one JSON-RPC object: the MCP app answers it

"""The WebSocket chat transport: JSON frames at ``ws://<host>:<port>/chat``, served by uvicorn.

Admission happens before ``accept()``, each refusal a real HTTP response
with a ``rejected`` body: a browser ``Origin`` outside the allow-list → 403;
no valid bearer token (``Authorization: Bearer ...``, the scheme in any
case, or for browsers, which cannot set headers, the subprotocol
``chalie.bearer.<token>``, alone or beside ``chalie``) → 401; a valid token
that is not an owner's (an agent's, :func:`chalie.wire.principals.may_chat`) → 403
``forbidden``, logged with the token's id, never its secret; too many
clients → 503. An admitted client gets a
:class:`~chalie.chat.session.ChatSession`; one task reads its frames, one
writes its outbox. A client that stops reading fills its outbox and is
dropped; the others are not held up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from chalie.chat import protocol as p
from chalie.chat.session import ChatSession
from chalie.conversation.port import ConversationsPort
from chalie.gate.tokens import TokenInfo, bearer
from chalie.net.admission import Admission, connection_cap, guarded_protocol
from chalie.net.asgi_server import Server
from chalie.net.listener import tcp_listener
from chalie.net.loopback import is_loopback
from chalie.process.config import ChatConfig
from chalie.wire.principals import Principal, may_chat

log = logging.getLogger("chalie.chat.websocket")

SUBPROTOCOL: Final = "chalie"
TOKEN_SUBPROTOCOL: Final = "chalie.bearer."
# Frames past this are cut by the WebSocket layer itself (close 1009);
# between max_frame_bytes and this they get a structured oversized-frame.
TRANSPORT_FACTOR: Final = 4
SLOW_CLIENT_CLOSE: Final = 4008
REVOKED_CLOSE: Final = 4401

Verify = Callable[[str | None], Awaitable[TokenInfo | None]]
# More routes on the same server (the Brain: /brain/, /api/v1/), built once the port is bound.
ExtraRoutes = Callable[[tuple[str, int]], list[BaseRoute]]


async def _not_found(_request: Any, _exc: Exception) -> JSONResponse:
    """Every unknown path (one no route's pattern matches, even a mangled one) in JSON."""
    return JSONResponse({"error": "not-found", "message": "no such endpoint"}, status_code=404)


class WebSocketBridge:
    """One uvicorn server with one WebSocket route, on the running event loop."""

    def __init__(
        self,
        config: ChatConfig,
        port: ConversationsPort,
        verify: Verify,
        extra_routes: ExtraRoutes | None = None,
    ) -> None:
        self._config = config
        self._extra_routes = extra_routes
        self._port = port
        self._verify = verify
        self._server: Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._sessions: set[ChatSession] = set()
        self._admitting = 0
        self.admission: Admission | None = None
        self.address: tuple[str, int] | None = None

    @property
    def clients(self) -> int:
        return len(self._sessions)

    def app(self) -> Starlette:
        routes: list[BaseRoute] = [WebSocketRoute(self._config.path, self._endpoint)]
        if self._extra_routes is not None and self.address is not None:
            routes.extend(self._extra_routes(self.address))
        return Starlette(routes=routes, exception_handlers={404: _not_found})

    async def start(self) -> tuple[str, int]:
        """Bind and serve; returns the bound (host, port), the port resolved when it was 0."""
        cfg = self._config
        if not is_loopback(cfg.host):
            log.warning(
                "chat WebSocket listens beyond loopback",
                extra={"host": cfg.host, "port": cfg.port},
            )
        sock = tcp_listener(cfg.host, cfg.port)
        self.address = sock.getsockname()[:2]
        self.admission = Admission("chat", connection_cap(cfg.max_connections), cfg.request_timeout)
        uv = uvicorn.Config(
            self.app(),
            http=guarded_protocol(self.admission),
            ws="wsproto",
            lifespan="off",
            log_config=None,
            access_log=False,
            ws_max_size=cfg.max_frame_bytes * TRANSPORT_FACTOR,
            # Deflate holds ~150 KB of zlib state per connection; chat frames are small.
            ws_per_message_deflate=False,
            ws_ping_interval=20.0,
            ws_ping_timeout=20.0,
            timeout_graceful_shutdown=1,
        )
        self._server = Server(uv)
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[sock]), name="chat-websocket"
        )
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the chat WebSocket server stopped at start-up")
            await asyncio.sleep(0.005)
        log.info(
            "chat WebSocket listening", extra={"host": self.address[0], "port": self.address[1]}
        )
        return self.address

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    async def stop(self) -> None:
        for session in list(self._sessions):
            session.close()
        if self._server is not None and self._task is not None:
            self._server.exit()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._task), 3.0)
            if not self._task.done():
                self._server.force_exit = True
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)

    # -- one connection -------------------------------------------------------------
    async def _refuse(self, ws: WebSocket, status: int, code: str, message: str) -> None:
        body = msgspec.to_builtins(p.Rejected(code=code, message=message))
        await ws.send_denial_response(JSONResponse(body, status_code=status))

    def _token(self, ws: WebSocket) -> tuple[str | None, bool]:
        """The offered token and whether it came as a subprotocol."""
        found = bearer(ws.headers.get("authorization"))
        if found is not None:
            return found, False
        for proto in ws.scope.get("subprotocols", []):
            if proto.startswith(TOKEN_SUBPROTOCOL):
                return proto[len(TOKEN_SUBPROTOCOL) :], True
        return None, False

    async def _endpoint(self, ws: WebSocket) -> None:
        cfg = self._config
        origin = ws.headers.get("origin")
        if origin is not None and origin not in cfg.origins:
            log.warning("chat WebSocket refused a foreign origin", extra={"origin": origin[:200]})
            await self._refuse(ws, 403, p.ORIGIN_REFUSED, "this Origin is not in chat.origins")
            return
        # Upgraded clients hold descriptors too: no more than the listener's share of them.
        most = min(cfg.max_clients, self.admission.cap if self.admission else cfg.max_clients)
        if len(self._sessions) + self._admitting >= most:
            await self._refuse(ws, 503, p.TOO_MANY, f"at most {most} chat clients")
            return
        offered = ws.scope.get("subprotocols", [])
        if any(o.startswith(TOKEN_SUBPROTOCOL) for o in offered) and SUBPROTOCOL not in offered:
            # The token cannot be echoed as the chosen subprotocol, and a browser fails a
            # handshake that selects none of those it offered: say so in a real response.
            await self._refuse(
                ws,
                400,
                p.INVALID,
                f"offer the subprotocol {SUBPROTOCOL!r} beside {TOKEN_SUBPROTOCOL}<token>",
            )
            return
        self._admitting += 1
        try:
            secret, as_subprotocol = self._token(ws)
            info = await self._verify(secret)
        finally:
            self._admitting -= 1
        if info is None:
            await self._refuse(ws, 401, p.UNAUTHORIZED, "a valid bearer token is required")
            return
        principal = info.principal()
        if not may_chat(principal):
            log.warning(
                "chat WebSocket refused a token that is not an owner's",
                extra={"token_id": info.id, "scope": info.scope},
            )
            await self._refuse(
                ws, 403, p.FORBIDDEN, f"a {info.scope} token cannot chat; chat needs an owner token"
            )
            return
        await ws.accept(
            subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered or as_subprotocol else None
        )
        await self._converse(ws, f"websocket:{info.name}", secret, principal)

    async def _still_valid(self, secret: str | None) -> None:
        """Return once the connection's token is no longer valid (revoked)."""
        while True:
            await asyncio.sleep(self._config.token_recheck)
            if await self._verify(secret) is None:
                log.info("chat WebSocket client disconnected: its token was revoked")
                return

    async def _converse(
        self, ws: WebSocket, origin: str, secret: str | None, principal: Principal
    ) -> None:
        dropped = asyncio.Event()
        session = ChatSession(
            self._port,
            p.Codec("json", self._config.max_frame_bytes),
            origin=origin,
            principal=principal,
            outbox_limit=self._config.send_queue,
            max_open=self._config.max_open_conversations,
            on_overflow=dropped.set,
        )
        self._sessions.add(session)
        session.hello()
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(self._read(ws, session)),
            loop.create_task(self._write(ws, session)),
            loop.create_task(dropped.wait()),
            loop.create_task(self._still_valid(secret)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            session.close()
            self._sessions.discard(session)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if dropped.is_set():
            # The client does not read, so a close frame may never leave: do not wait on it.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(SLOW_CLIENT_CLOSE, p.SLOW_CLIENT), 0.5)
        elif tasks[3].done() and not tasks[3].cancelled():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(REVOKED_CLOSE, p.UNAUTHORIZED), 0.5)

    @staticmethod
    async def _read(ws: WebSocket, session: ChatSession) -> None:
        while True:
            message: Any = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            if raw is None:
                raw = message.get("bytes") or b""
            await session.handle(raw)

    @staticmethod
    async def _write(ws: WebSocket, session: ChatSession) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            while True:
                frame = await session.outbox.get()
                await ws.send_text(frame.decode("utf-8"))

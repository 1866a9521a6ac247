"""The ChatBridge actor: starts the WebSocket and ZeroMQ chat transports on the loop; stops them.

Lifecycle, in order:

1. ``on_start`` opens the token store and, when no token exists at all,
   writes the first one to ``<home>/first-token`` (0600) and logs where.
2. It starts both transports on the daemon's :class:`~actors.loop.EventLoopThread`;
   a bind failure fails the start (the supervisor sees it).
3. If a transport stops serving on its own, the actor fails, and the
   supervisor restarts it (new sockets, same token store).
4. ``on_stop`` closes every client session, both sockets and the store.

The transports reach the conversations through the one port adapter,
:class:`~actors.conversation.port.ActorConversations`, which awaits each answer
on the loop (no thread waits for it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

from actors.child_ref import ChildRef
from actors.conversation.port import ActorConversations
from actors.loop import EventLoopThread
from actors.process.serving import ServingActor
from chalie.chat.websocket import WebSocketBridge
from chalie.chat.zmq_transport import ZmqBridge
from chalie.gate.tokens import TokenInfo, TokenStore, ensure_first_token
from chalie.mcp_server.exchange import AgentExchange
from chalie.mcp_server.kept import KeptExchanges
from chalie.process.config import ChatConfig
from chalie.store.store_place import Place
from chalie.wire.bus import EventBus

log = logging.getLogger("chalie.chat")

T = TypeVar("T")

CALL_TIMEOUT: Final = 10.0
START_TIMEOUT: Final = 10.0

# The Brain (dashboard and REST) on the same server: its routes for the bound address and
# this actor's token store, and what closes them when the transports stop.
BrainFactory = Callable[[tuple[str, int], TokenStore], tuple[list[Any], Callable[[], None]]]


class ChatBridge(ServingActor):
    """The tree's child for the chat transports."""

    def __init__(
        self,
        config: ChatConfig,
        home: Path,
        db_path: Place,
        loop: EventLoopThread,
        events: EventBus,
        conversations: ChildRef[Any],
        brain: BrainFactory | None = None,
    ) -> None:
        super().__init__()
        self._brain = brain
        self._brain_close: Callable[[], None] | None = None
        self._config = config
        self._home = home
        self._db_path = db_path
        self._loop = loop
        self._port = ActorConversations(conversations, events, backlog=self._unseen)
        self._kept: KeptExchanges | None = None
        self._tokens: TokenStore | None = None
        self._ws: WebSocketBridge | None = None
        self._zmq: ZmqBridge | None = None
        self._stopping = False

    def on_start(self) -> None:
        self._tokens = TokenStore(self._db_path)
        self._kept = KeptExchanges(self._db_path)
        written = ensure_first_token(self._tokens, self._home)
        if written is not None:
            log.warning(
                "no token existed: an owner token was created and written once to a 0600 file",
                extra={"path": str(written)},
            )
        elif self._tokens.owners() == 0:
            log.warning(
                "no owner token: WebSocket chat clients are refused; make one with "
                "chalie token create NAME --owner (local chalie chat still works)"
            )
        self._loop.submit(self._start_transports()).result(START_TIMEOUT)

    async def _start_transports(self) -> None:
        if self._config.websocket:
            ws = WebSocketBridge(self._config, self._port, self._verify, self._brain_routes)
            try:
                await ws.start()
            except OSError as exc:
                # Another program holds the port: the local ZeroMQ chat still serves.
                log.error(
                    "chat WebSocket cannot listen; serving ZeroMQ chat only: %s",
                    exc.strerror or exc,
                    extra={"host": self._config.host, "port": self._config.port},
                )
            else:
                self._ws = ws
                self._watch(ws.task)
        self._zmq = ZmqBridge(self._config, self._port, self._home, self._verify)
        await self._zmq.start()
        for task in self._zmq.tasks:
            self._watch(task)

    def _brain_routes(self, address: tuple[str, int]) -> list[Any]:
        """The Brain's routes on this server (its own token checks use this actor's store)."""
        if self._brain is None or self._tokens is None:
            return []
        routes, self._brain_close = self._brain(address, self._tokens)
        return routes

    def _watch(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            task.add_done_callback(self._transport_ended)

    def _transport_ended(self, task: asyncio.Task[Any]) -> None:
        error = None if task.cancelled() else task.exception()
        if self._stopping:
            return
        log.error("chat transport stopped serving: %r", error)
        self.stopped_serving(repr(error))

    async def _verify(self, secret: str | None) -> TokenInfo | None:
        store = self._tokens
        if store is None or secret is None:
            return None
        # On the loop, as the MCP gate does: one indexed read of a WAL database (a reader
        # never waits for a writer); this store instance writes nothing after on_start, and
        # last_used goes to the store's own thread at most once a minute a token.
        return store.verify(secret)

    def addresses(self) -> dict[str, Any]:
        """Where the transports listen (the WebSocket port is resolved when configured 0)."""
        ws = self._ws.address if self._ws is not None else None
        return {
            "websocket": None if ws is None else f"ws://{ws[0]}:{ws[1]}{self._config.path}",
            "zmq_tcp": self._zmq.tcp_endpoint if self._zmq is not None else None,
            "websocket_clients": self._ws.clients if self._ws is not None else 0,
            "zmq_clients": self._zmq.clients if self._zmq is not None else 0,
            "zmq_sessions_opened": self._zmq.sessions_opened if self._zmq is not None else 0,
        }

    def close(self) -> None:
        self._stopping = True
        if self._loop.is_alive():
            try:
                self._loop.submit(self._stop_transports()).result(START_TIMEOUT)
            except (concurrent.futures.TimeoutError, RuntimeError) as exc:
                log.error("chat transports did not stop: %s", exc)
        if self._brain_close is not None:
            self._brain_close()
            self._brain_close = None
        if self._tokens is not None:
            self._tokens.close()
            self._tokens = None
        if self._kept is not None:
            self._kept.close()
            self._kept = None

    def _unseen(self) -> list[AgentExchange]:
        """An owner session connected: the agents' exchanges no owner has seen yet."""
        kept = self._kept
        if kept is None:
            return []
        try:
            return kept.backlog()
        except Exception:
            log.exception("reading the kept agent exchanges failed")
            return []

    async def _stop_transports(self) -> None:
        if self._ws is not None:
            await self._ws.stop()
        if self._zmq is not None:
            await self._zmq.stop()

"""McpServerActor: the supervised owner of the inbound MCP server on the daemon's loop.

Lifecycle, in order:

1. ``on_start``: when ``[mcp_server] enabled``, bind and start the server on
   the loop thread (``actors/loop.py``) and wait until it accepts connections.
   A port in use (or a refused remote bind) is one error line and the actor
   stays up, idle, reporting it in :meth:`status`: no restart loop.
2. While it runs, an unexpected end of the uvicorn task is told to the actor
   as :class:`~chalie.wire.actor_messages.EndpointDied`; the actor fails and its supervisor
   restarts it.
3. ``on_stop`` (or ``on_failure``): stop uvicorn (open requests end; their
   turns are cancelled), close its listeners and the ownership table.

The actor's own state is touched on its thread only; the server lives on the
loop thread, reached by ``loop.submit``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import pykka

from actors.calls.dispatcher import DispatcherClient
from actors.child_ref import ChildRef
from actors.conversation.conversations import Conversations
from actors.conversation.port import ActorConversations
from actors.loop import EventLoopThread
from actors.process.serving import ServingActor
from chalie.conversation.catalogue import ToolCatalogue
from chalie.conversation.port import ConversationsPort
from chalie.gate.approvals import ApprovalStore
from chalie.gate.tokens import TokenStore
from chalie.mcp_server.app import McpHttpServer, PortInUse, RemoteBindRefused
from chalie.mcp_server.exchange import AgentExchange, HumansPort
from chalie.mcp_server.gate import TokenVerifier
from chalie.mcp_server.gateway import Gateway, ToolsPort
from chalie.mcp_server.kept import KeptExchanges
from chalie.mcp_server.owners import ConversationOwners
from chalie.mcp_server.talk import TalkToChalie
from chalie.process.config import McpServerConfig
from chalie.store.store_place import Place
from chalie.wire.bus import HUMANS, EventBus
from chalie.wire.messages import ToolCall, ToolOutcome

log = logging.getLogger("chalie.mcp_server")

START_TIMEOUT = 15.0
CALL_TIMEOUT = 15.0
T = TypeVar("T")


class DispatcherTools:
    """The gateway's ToolsPort: the one dispatcher chokepoint and the one tool catalogue."""

    def __init__(self, dispatcher: DispatcherClient, catalogue: ToolCatalogue) -> None:
        self._dispatcher = dispatcher
        self._catalogue = catalogue

    async def call(self, call: ToolCall) -> ToolOutcome:
        return await self._dispatcher.call(call)

    def injected(self, turn_id: str) -> frozenset[str]:
        return self._catalogue.injected(turn_id)

    def descriptors(self, names: tuple[str, ...]) -> list[dict[str, Any]]:
        return self._catalogue.descriptors(names)  # a token's direct calls run inline


class BusHumans:
    """The people at a screen: every chat session subscribes to the bus's HUMANS key.
    Each exchange is kept first (``book``), and seen once an owner client received it."""

    def __init__(self, bus: EventBus, book: KeptExchanges | None = None) -> None:
        self._bus = bus
        self._book = book

    def humans_connected(self) -> int:
        return self._bus.subscribed(HUMANS)

    def surface(self, exchange: AgentExchange) -> int:
        book = self._book
        if book is not None:
            try:
                exchange = book.keep(exchange)
            except Exception:
                log.exception("keeping an agent exchange failed")
        delivered = self._bus.publish(HUMANS, exchange)
        if delivered and exchange.kept and book is not None:
            try:
                book.seen(exchange.kept)
            except Exception:
                log.exception("marking an agent exchange seen failed")
        return delivered


class McpServerActor(ServingActor):
    serving = "the MCP server"

    def __init__(
        self,
        config: McpServerConfig,
        loop: EventLoopThread,
        db_path: Place,
        conversations: ConversationsPort,
        tokens: Callable[[], TokenVerifier],
        desk: HumansPort,
        closers: tuple[Callable[[], None], ...] = (),
        tools: ToolsPort | None = None,
    ) -> None:
        super().__init__()
        self.tools = tools
        self.closers = closers
        self.config = config
        self.loop = loop
        self.db_path = db_path
        self.conversations = conversations
        self.tokens = tokens
        self.desk = desk
        self.server: McpHttpServer | None = None
        self.owners: ConversationOwners | None = None
        self.approvals: ApprovalStore | None = None
        self.state = "disabled"
        self.url: str | None = None

    def on_start(self) -> None:
        if not self.config.enabled:
            log.info("MCP server disabled ([mcp_server] enabled = false)")
            return
        self.owners = ConversationOwners(self.db_path)
        if self.config.park_asks:
            self.approvals = ApprovalStore(self.db_path)
        talk = TalkToChalie(
            self.conversations,
            self.owners,
            self.desk,
            turn_wait=self.config.turn_wait,
            asks=self.config.loop_in_human_asks,
            approvals=self.approvals,
        )
        gateway = Gateway(self.config.gateway, self.tools)
        server = McpHttpServer(self.config, talk, self.tokens, gateway)
        try:
            self.url = self.loop.submit(server.start()).result(START_TIMEOUT)
        except (PortInUse, RemoteBindRefused) as exc:
            # One clear line; staying up idle keeps the supervisor from looping on it.
            log.error("%s", exc)
            self.state = f"not started: {exc}"
            return
        self.server = server
        self.state = "serving"
        log.info("MCP server listening", extra={"url": self.url})
        assert server.done is not None

        def ended(task: Any) -> None:
            if server.stopping:
                return
            self.stopped_serving("stopped" if task.cancelled() else repr(task.exception()))

        self.loop.call_soon(server.done.add_done_callback, ended)

    def close(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            try:
                self.loop.submit(server.stop()).result(10)
            except Exception as exc:  # the loop may already be gone at shutdown
                log.warning("MCP server did not stop cleanly: %s", exc)
        if self.owners is not None:
            self.owners.close()
            self.owners = None
        if self.approvals is not None:
            self.approvals.close()
            self.approvals = None
        closers, self.closers = self.closers, ()
        for close in closers:
            close()

    def status(self) -> dict[str, Any]:
        server = self.server
        out: dict[str, Any] = {"state": self.state, "url": self.url}
        if server is not None:
            # owner chat clients present now: who a loop_in_human ask would go to
            out["people_connected"] = self.desk.humans_connected()
            gate, talk = server.gate, server.talk.stats
            if gate is not None:
                out["requests"] = {
                    "admitted": gate.stats.admitted,
                    "unauthorized": gate.stats.unauthorized,
                    "limited": gate.stats.limited,
                    "too_large": gate.stats.too_large,
                }
            out["calls"] = {
                "total": talk.calls,
                "invalid": talk.invalid,
                "finished": talk.finished,
                "cancelled": talk.cancelled,
                "failed": talk.failed,
            }
        return out


def start_for(
    config: McpServerConfig,
    loop: EventLoopThread,
    db_path: Place,
    conversations: ChildRef[Conversations],
    events: EventBus,
    tools: ToolsPort | None = None,
) -> pykka.ActorRef[McpServerActor]:
    """The daemon's McpServerActor: the real conversations, token store and event bus,
    and (for gateway mode) the dispatcher's tools."""
    port = ActorConversations(conversations, events)
    store = TokenStore(db_path)
    book = KeptExchanges(db_path)
    return McpServerActor.start(
        config,
        loop,
        db_path,
        port,
        lambda: store,
        BusHumans(events, book),
        closers=(store.close, book.close),
        tools=tools,
    )

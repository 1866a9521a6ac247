"""A real inbound MCP server on a real loop thread over loopback, and a real SDK client for it."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from actors.loop import EventLoopThread
from chalie.conversation.port import ConversationsPort
from chalie.gate.tokens import TokenStore
from chalie.mcp_server.app import McpHttpServer
from chalie.mcp_server.exchange import HumansPort
from chalie.mcp_server.gate import TokenVerifier
from chalie.mcp_server.owners import ConversationOwners
from chalie.mcp_server.talk import TalkToChalie
from chalie.process.config import McpServerConfig
from tests.conversations_double import DoublePort
from tests.core.mcp_server.doubles import FakeDesk
from tests.slow import require_slow

MODES = ("auto", "legacy")


@dataclass
class Running:
    server: McpHttpServer
    loop: EventLoopThread
    url: str
    tokens: Any
    convs: Any
    desk: Any
    owners: ConversationOwners

    @property
    def talk(self) -> TalkToChalie:
        return self.server.talk


@contextlib.contextmanager
def running(
    *,
    convs: DoublePort | ConversationsPort | None = None,
    tokens: TokenVerifier | None = None,
    desk: HumansPort | None = None,
    db_path: Path | None = None,
    **config: Any,
) -> Iterator[Running]:
    """Start a server on port 0 on its own loop thread, over a conversations double (or
    ``convs``); stop all three afterwards."""
    require_slow("an MCP HTTP server")
    cfg = McpServerConfig(port=0, **config)
    double = DoublePort() if convs is None else convs
    port = double.port if isinstance(double, DoublePort) else double
    people = desk if desk is not None else FakeDesk()
    with tempfile.TemporaryDirectory() as tmp:
        db = db_path or Path(tmp) / "chalie.db"
        store = tokens if tokens is not None else TokenStore(db)
        owners = ConversationOwners(db)
        talk = TalkToChalie(
            port, owners, people, turn_wait=cfg.turn_wait, asks=cfg.loop_in_human_asks
        )
        server = McpHttpServer(cfg, talk, lambda: store)
        loop = EventLoopThread("mcp-test-loop")
        loop.start()
        try:
            url = loop.submit(server.start()).result(10)
            yield Running(server, loop, url, store, double, people, owners)
        finally:
            with contextlib.suppress(Exception):
                loop.submit(server.stop()).result(10)
            loop.stop()
            owners.close()
            if isinstance(double, DoublePort):
                double.stop()  # the double it ran with, made here or given
            if tokens is None and isinstance(store, TokenStore):
                store.close()


@contextlib.asynccontextmanager
async def connect(
    url: str, secret: str | None, mode: str = "auto", **kwargs: Any
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, **kwargs) as client:  # type: ignore[arg-type]
            yield client

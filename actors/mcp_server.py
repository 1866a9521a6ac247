"""McpServerActor: the supervised owner of the inbound MCP server on the daemon's loop.

Lifecycle, in order:

1. ``on_start``: when ``[mcp_server] enabled``, bind and start the server on
   the loop thread (``actors/loop.py``) and wait until it accepts connections.
   A port in use (or a refused remote bind) is one error line and the actor
   stays up, idle, reporting it in :meth:`status`: no restart loop.
2. While it runs, an unexpected end of the uvicorn task is told to the actor
   as :class:`_ServerDied`; the actor fails and its supervisor restarts it.
3. ``on_stop``: stop uvicorn (open requests end; their turns are cancelled)
   and close the ownership table.

The actor's own state is touched on its thread only; the server lives on the
loop thread, reached by ``loop.submit``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actors.loop import EventLoopThread
from actors.supervisor import SupervisedActor
from chalie.config import McpServerConfig
from chalie.mcp_server.app import McpHttpServer, PortInUse, RemoteBindRefused
from chalie.mcp_server.exchange import HumanDesk
from chalie.mcp_server.gate import TokenVerifier
from chalie.mcp_server.owners import ConversationOwners
from chalie.mcp_server.talk import TalkToChalie
from chalie.mcp_server.turns import ConversationsPort

log = logging.getLogger("chalie.mcp_server")

START_TIMEOUT = 15.0


class _ServerDied:
    """The uvicorn task ended without being asked to."""

    def __init__(self, error: str) -> None:
        self.error = error


class McpServerActor(SupervisedActor):
    def __init__(
        self,
        config: McpServerConfig,
        loop: EventLoopThread,
        db_path: Path,
        conversations: ConversationsPort,
        tokens: Callable[[], TokenVerifier],
        desk: HumanDesk,
    ) -> None:
        super().__init__()
        self.config = config
        self.loop = loop
        self.db_path = db_path
        self.conversations = conversations
        self.tokens = tokens
        self.desk = desk
        self.server: McpHttpServer | None = None
        self.owners: ConversationOwners | None = None
        self.state = "disabled"
        self.url: str | None = None

    def on_start(self) -> None:
        if not self.config.enabled:
            log.info("MCP server disabled ([mcp_server] enabled = false)")
            return
        self.owners = ConversationOwners(self.db_path)
        talk = TalkToChalie(
            self.conversations, self.owners, self.desk, turn_wait=self.config.turn_wait
        )
        server = McpHttpServer(self.config, talk, self.tokens)
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
        me = self.actor_ref
        assert server.done is not None

        def ended(task: Any) -> None:
            if server.stopping:
                return
            error = "stopped" if task.cancelled() else repr(task.exception())
            me.tell(_ServerDied(error))

        self.loop.call_soon(server.done.add_done_callback, ended)

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _ServerDied):
            raise RuntimeError(f"the MCP server stopped unexpectedly: {message.error}")
        return None

    def on_stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            try:
                self.loop.submit(server.stop()).result(10)
            except Exception as exc:  # the loop may already be gone at shutdown
                log.warning("MCP server did not stop cleanly: %s", exc)
        if self.owners is not None:
            self.owners.close()
            self.owners = None

    def status(self) -> dict[str, Any]:
        server = self.server
        out: dict[str, Any] = {"state": self.state, "url": self.url}
        if server is not None:
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

"""A real daemon in this process for the Brain's tests (``tools/daemon_thread.py``): chat web
server and inbound MCP server on ephemeral ports, the scripted model on loopback, the first
(owner) token read from its file. A test that starts one must carry the slow mark."""

from __future__ import annotations

from typing import Any

import httpx2
import msgspec

from actors.mcp.server import McpServerActor
from tests.slow import require_slow
from tools.conversation_harness import ChatDaemon
from tools.waiting import wait_until


class BrainDaemon(ChatDaemon):
    def __init__(self, extra_toml: str = "") -> None:
        require_slow("a daemon")
        super().__init__("[mcp_server]\nport = 0\n" + extra_toml, prefix="chb-")
        try:
            mcp = self.rt.child("mcp_server", McpServerActor).within(10)
            wait_until(mcp.is_alive, 60, "the MCP server to start")
            self.ws_url: str = self.addresses["websocket"]
            self.base = self.ws_url.replace("ws://", "http://").rsplit("/chat", 1)[0]
            self.hostport = self.base.split("://", 1)[1]
            self.mcp_url: str = mcp.call(McpServerActor.status)["url"]
        except BaseException:
            self.close()
            raise

    def client(self, token: str | None = "owner", **kw: Any) -> httpx2.Client:
        headers = dict(kw.pop("headers", {}))
        if token == "owner":
            token = self.token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx2.Client(base_url=self.base, headers=headers, timeout=30, **kw)


# -- reading the REST answers ----------------------------------------------------------
def ok(response: Any, kind: Any) -> Any:
    """A 200 JSON answer, decoded as ``kind``."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return msgspec.json.decode(response.content, type=kind)


def refused(response: Any, status: int, code: str) -> None:
    """A refusal with this status and error code."""
    assert response.status_code == status, response.text
    assert response.json()["error"] == code

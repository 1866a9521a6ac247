"""MCP Server: the inbound server's state; tokens created (shown once), listed, revoked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.operations import Backend
from chalie.brain.pages.page import Operations, Page


async def load(brain: Operations, _query: Mapping[str, str]) -> dict[str, Any]:
    return {"server": await brain.op(Backend.mcp_server), "tokens": await brain.op(Backend.tokens)}


PAGE = Page("mcp_server", "MCP Server", "mcp_server.html", load, shows_results=True)

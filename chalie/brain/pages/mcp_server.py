"""MCP Server: the inbound server's state; tokens created (shown once), listed, revoked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.pages.page import Page


async def load(brain: Any, _query: Mapping[str, str]) -> dict[str, Any]:
    return {"server": await brain.op("mcp_server"), "tokens": await brain.op("tokens")}


PAGE = Page("mcp_server", "MCP Server", "mcp_server.html", load, shows_results=True)

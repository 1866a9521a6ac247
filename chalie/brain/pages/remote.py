"""Remote MCP servers: status, tools with provenance, and a server's last log lines and
notifications; add, import, test, enable, approve."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.operations import ApiProblem, Backend
from chalie.brain.pages.page import Operations, Page


async def load(brain: Operations, query: Mapping[str, str]) -> dict[str, Any]:
    servers = await brain.op(Backend.remotes)
    selected = query.get("server", "")
    tools: list[Any] = []
    log: Any = None
    if selected:
        try:
            tools = await brain.op(Backend.remote_tools, {"name": selected})
            log = await brain.op(Backend.remote_log, {"name": selected}, lines=100)
        except ApiProblem:
            selected = ""
    return {"servers": servers, "selected": selected, "tools": tools, "log": log}


PAGE = Page("remote", "Remote MCP", "remote.html", load, shows_results=True)

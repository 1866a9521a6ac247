"""Overview: the supervisor tree, workers, memory, uptime, MCP servers, approvals, recent errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.pages.page import Page


async def load(brain: Any, _query: Mapping[str, str]) -> dict[str, Any]:
    return {"ov": await brain.op("overview")}


PAGE = Page("overview", "Overview", "overview.html", load)

"""Overview: the supervisor tree, workers, memory, uptime, MCP servers, approvals, recent errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.operations import Backend
from chalie.brain.pages.page import Operations, Page


async def load(brain: Operations, _query: Mapping[str, str]) -> dict[str, Any]:
    return {"ov": await brain.op(Backend.overview)}


PAGE = Page("overview", "Overview", "overview.html", load)

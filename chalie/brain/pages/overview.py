"""Overview: the supervisor tree, workers, memory, uptime, MCP servers, approvals, recent errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from chalie.brain.operations import Backend
from chalie.brain.pages.page import Page

if TYPE_CHECKING:
    from chalie.brain.web import Brain


async def load(brain: Brain, _query: Mapping[str, str]) -> dict[str, Any]:
    return {"ov": await brain.op(Backend.overview)}


PAGE = Page("overview", "Overview", "overview.html", load)

"""Discovery: try a query and see which rung answered, with distances; learned examples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.operations import Backend
from chalie.brain.pages.page import Operations, Page


async def load(brain: Operations, _query: Mapping[str, str]) -> dict[str, Any]:
    return {"examples": await brain.op(Backend.examples)}


PAGE = Page("discovery", "Discovery", "discovery.html", load, shows_results=True)

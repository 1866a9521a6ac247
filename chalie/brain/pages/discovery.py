"""Discovery: try a query and see which rung answered, with distances; learned examples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.pages.page import Page


async def load(brain: Any, _query: Mapping[str, str]) -> dict[str, Any]:
    return {"examples": await brain.op("examples")}


PAGE = Page("discovery", "Discovery", "discovery.html", load, shows_results=True)

"""Approvals: pending permission requests, live, answered once / always / deny; the history."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.pages.page import Page


async def load(brain: Any, _query: Mapping[str, str]) -> dict[str, Any]:
    return {
        "pending": await brain.op("approvals"),
        "history": await brain.op("approval_history", limit=25),
        "exchanges": await brain.op("agent_exchanges", limit=25),
    }


PAGE = Page("approvals", "Approvals", "approvals.html", load, fragment="approvals_pending.html")

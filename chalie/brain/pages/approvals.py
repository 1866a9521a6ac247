"""Approvals: pending permission requests, live, answered once / always / deny; the history."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.operations import Backend
from chalie.brain.pages.page import Operations, Page


async def load(brain: Operations, _query: Mapping[str, str]) -> dict[str, Any]:
    return {
        "pending": await brain.op(Backend.approvals),
        "history": await brain.op(Backend.approval_history, limit=25),
        "exchanges": await brain.op(Backend.agent_exchanges, limit=25),
    }


PAGE = Page("approvals", "Approvals", "approvals.html", load, fragment="approvals_pending.html")

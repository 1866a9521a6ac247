"""Conversations: the list; one read whole (messages, tool calls and results, events); delete."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.operations import ApiProblem, Backend
from chalie.brain.pages.page import Operations, Page


async def load(brain: Operations, query: Mapping[str, str]) -> dict[str, Any]:
    rows = await brain.op(Backend.conversations, limit=100)
    shown = None
    wanted = query.get("id", "")
    if wanted:
        try:
            shown = await brain.op(Backend.conversation, {"conversation_id": wanted})
        except ApiProblem:
            shown = None
    return {"rows": rows, "shown": shown}


PAGE = Page("conversations", "Conversations", "conversations.html", load)

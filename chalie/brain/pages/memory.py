"""Memory: the owner's memories and, apart, each agent's, with their provenance, the mark of
an untrusted source and of a superseded (past) memory; a search (recall, as the memory ability
does); forget; promote an agent's memory to the owner's; the forgotten ones, restorable."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.operations import ApiProblem, Backend
from chalie.brain.pages.page import Operations, Page, chosen
from chalie.memory.book import FORGET_GRACE


async def load(brain: Operations, query: Mapping[str, str]) -> dict[str, Any]:
    shown = chosen(query, "principal")
    found = await brain.op(Backend.memories, **shown)
    forgotten = await brain.op(Backend.memories_forgotten)
    search = chosen(query, "query", "location", "in")
    hits = None
    problem = ""
    if "query" in search or "location" in search:
        asked = {k: v for k, v in search.items() if k != "in"}
        if search.get("in"):
            asked["principal"] = search["in"]
        try:
            hits = await brain.op(Backend.memory_search, **asked)
        except ApiProblem as exc:
            problem = exc.message
    return {
        "groups": found.groups,
        "search": search,
        "hits": hits,
        "search_problem": problem,
        "forgotten": forgotten,
        "grace": FORGET_GRACE,
        "back": "memory",
    }


PAGE = Page("memory", "Memory", "memory.html", load)

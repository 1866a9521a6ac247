"""Memory: the owner's memories and, apart, each agent's, with their provenance and the mark of
an untrusted source; a search (recall, as the memory ability does); forget; promote an agent's
memory to the owner's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.operations import ApiProblem
from chalie.brain.pages.page import Page, chosen


async def load(brain: Any, query: Mapping[str, str]) -> dict[str, Any]:
    shown = chosen(query, "principal")
    found = await brain.op("memories", **shown)
    search = chosen(query, "query", "location", "in")
    hits = None
    problem = ""
    if "query" in search or "location" in search:
        asked = {k: v for k, v in search.items() if k != "in"}
        if search.get("in"):
            asked["principal"] = search["in"]
        try:
            hits = await brain.op("memory_search", **asked)
        except ApiProblem as exc:
            problem = exc.message
    return {
        "groups": found.groups,
        "search": search,
        "hits": hits,
        "search_problem": problem,
        "back": "memory",
    }


PAGE = Page("memory", "Memory", "memory.html", load)

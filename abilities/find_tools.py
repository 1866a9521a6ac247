"""find_tools: activate the tools a turn needs, by name or by described action.

Each entry of ``query`` runs through the discovery cascade on its own (exact
name → name keyword → vector); the union is injected into the calling turn
so those tools become callable. Always available, internal (it bypasses the
permission gate) and absent from the roster it searches.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from chalie.ability import Ability
from chalie.discovery.asking import Entry, ask_discovery
from chalie.discovery.cascade import DEFAULT_K, MAX_ENTRIES, FindResult, confident
from chalie.result import ToolResult

Entries = Annotated[
    list[Entry],
    msgspec.Meta(
        min_length=1,
        max_length=MAX_ENTRIES,
        description="One entry per need: <what you want done>, in a few words.",
    ),
]


class FindToolsParams(msgspec.Struct, forbid_unknown_fields=True):
    """Find and activate tools for this turn."""

    query: Entries


class FindTools(Ability):
    name = "find_tools"
    summary = (
        "Makes more tools callable when an action needs one you do not have. "
        "Matching tools can be called in your next step."
    )
    tooltip = "Find and activate tools"
    examples = (
        "find a tool to check the weather",
        "activate the calendar tools",
        "I need something to send an email",
        "is there a tool that converts currencies",
        "load the clock and calculator",
        "search for tools that read web pages",
    )
    Params = FindToolsParams
    aliases = {
        "queries": "query",
        "tools": "query",
        "entries": "query",
        "needs": "query",
        "q": "query",
        "tool": "query",
        "names": "query",
    }
    internal = True
    discoverable = False
    backgroundable = False
    timeout = 30.0

    def run(self, params: FindToolsParams) -> ToolResult:
        queries = list(params.query)
        # A framework seed's query is the person's message: a tool it names in words
        # ("send an email", "search the web") is offered as surely as an exact name.
        seed = self.context is not None and self.context.seed
        outcome: FindResult | ToolResult = ask_discovery(
            self, lambda d: d.find(queries, k=DEFAULT_K, mentions=seed)
        )
        if isinstance(outcome, ToolResult):
            return outcome
        names = outcome.names
        if seed:
            # A framework seed: only what clearly fits joins the first request.
            keep = set(confident(outcome))
            outcome = FindResult(
                injected=[d for d in outcome.injected if d.name in keep],
                not_found=[],
                entries=outcome.entries,
                definitions=outcome.definitions,
            )
            names = outcome.names
        if names and self.context is not None and self.services is not None:
            self.services.turns.inject(self.context.turn_id, names)
            # so that the turn's end can learn from which entry led to which tool
            if self.services.discovery is not None:
                self.services.discovery.remember(self.context.turn_id, outcome)
        return ToolResult.success(
            outcome.body(), meta={"injected": len(names), "not_found": len(outcome.not_found)}
        )

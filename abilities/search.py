"""search: a web search through the configured provider (SearXNG, Brave, Tavily).

A raw tool of the web-search delegate (not discoverable, pinned there only).
Internal to the gate: it sends the query to the operator's own provider and
reads results; the person's consent is the web_search call on their channel.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

import chalie.calls.untrusted as untrusted
from chalie.ability import Ability
from chalie.result import ToolResult
from chalie.web import results


class SearchParams(msgspec.Struct, forbid_unknown_fields=True):
    """Search the web."""

    query: Annotated[str, msgspec.Meta(min_length=1, max_length=400, description="the query")]
    max_results: Annotated[int, msgspec.Meta(ge=1, le=50)] | None = None


class Search(Ability):
    name = "search"
    summary = (
        "Search the web and return the results: title, URL, a snippet and a date for each. "
        "Fetch a result's URL with web_fetch to read the page itself."
    )
    examples = (
        "search the web for this",
        "find pages about the topic",
        "look this up online",
        "what are the latest news on this",
        "find sources for the claim",
        "search for reviews of the product",
    )
    tooltip = "Search the web"
    Params = SearchParams
    discoverable = False
    internal = True
    timeout = 60.0

    def run(self, params: SearchParams) -> ToolResult:
        from chalie.web.search import SearchError

        kit = results.kit_of(self.services)
        if isinstance(kit, ToolResult):
            return kit
        query = " ".join(params.query.split())
        if not query:
            return ToolResult.error(
                "invalid-param", "the query is empty", hint="pass words to search for"
            )
        try:
            hits = kit.searcher.search(query, params.max_results)
        except SearchError as exc:
            return results.error(exc.code, exc.message, exc.hint)
        rows = [hit.as_dict() for hit in hits]
        provider = kit.config.search.provider or "none"
        return untrusted.success(
            rows, meta={"provider": provider, "count": len(rows)}, rich={"results": rows}
        )

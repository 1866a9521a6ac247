"""web_fetch: one web page (or PDF, text, JSON) fetched under the SSRF guard, as readable text.

A raw tool of the web delegates: not discoverable, pinned on the web-search and
web-browse channels only. Internal to the gate (like reading): it only reads,
under the SSRF guard and the fetch limits, and the person's consent is the
web_search / web_browse call on their own channel.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from chalie.ability import Ability
from chalie.result import ToolResult
from chalie.web import results


class WebFetchParams(msgspec.Struct, forbid_unknown_fields=True):
    """Fetch one URL and return its readable text."""

    url: Annotated[str, msgspec.Meta(min_length=1, max_length=2048, description="http(s) URL")]
    links: Annotated[bool, msgspec.Meta(description="also list the page's links")] = False
    max_chars: Annotated[int, msgspec.Meta(ge=200, le=2_000_000)] | None = None


class WebFetch(Ability):
    name = "web_fetch"
    summary = (
        "Fetch a web page, PDF, text or JSON file by URL and return its readable text "
        "(the article without menus and boilerplate), its title and optionally its links."
    )
    examples = (
        "read this article",
        "fetch the page at this URL",
        "open the link from the search result",
        "get the text of this PDF",
        "what does this web page say",
        "download the JSON from this address",
    )
    tooltip = "Fetch a URL"
    Params = WebFetchParams
    discoverable = False
    internal = True
    timeout = 90.0

    def run(self, params: WebFetchParams) -> ToolResult:
        from chalie.web.extract import ExtractError, extract
        from chalie.web.http import FetchError

        kit = results.kit_of(self.services)
        if isinstance(kit, ToolResult):
            return kit
        try:
            fetched = kit.fetcher.fetch(params.url, cancelled=self.cancelled)
            doc = extract(fetched.body, fetched.content_type, fetched.charset, url=fetched.url)
        except FetchError as exc:
            return results.error(exc.code, exc.message, exc.hint)
        except ExtractError as exc:
            return results.error(
                exc.code, exc.message, "This tool reads HTML, PDF, text, Markdown and JSON."
            )
        limit = min(params.max_chars or kit.config.max_text_chars, kit.config.max_text_chars)
        return results.document_result(
            doc,
            fetched.url,
            limit,
            links=params.links,
            extra_meta={
                "content_type": fetched.content_type or "unknown",
                "redirects": len(fetched.redirects),
            },
        )

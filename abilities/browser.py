"""browser: a real headless Chromium page: open, click, type, scroll, extract text, screenshot.

A raw tool of the web-browse delegate (not discoverable, pinned there only).
Each delegate turn has its own page (chalie.web.browser); every request the
page makes passes the SSRF guard. Internal to the gate: a fresh context with
no stored logins, and the person's consent is the web_browse call.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from chalie.ability import Ability
from chalie.result import ToolResult
from chalie.web import results

# Characters of page text an action other than extract returns (extract: the whole limit).
GLANCE: Final = 4000


class BrowserParams(msgspec.Struct, forbid_unknown_fields=True):
    """Drive the page: open a URL, click, type, scroll, extract its text, take a screenshot."""

    action: Literal["open", "click", "type", "scroll", "extract", "screenshot", "close"]
    url: Annotated[str, msgspec.Meta(max_length=2048, description="open: the URL")] | None = None
    selector: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=500,
                description="click/type: a CSS selector, or the visible text of a link/button",
            ),
        ]
        | None
    ) = None
    text: Annotated[str, msgspec.Meta(max_length=5000, description="type: the text")] | None = None
    submit: Annotated[bool, msgspec.Meta(description="type: press Enter after")] = False
    amount: Annotated[int, msgspec.Meta(ge=-20, le=20, description="scroll: screens")] = 1


class Browser(Ability):
    name = "browser"
    summary = (
        "Drive a real web browser: open a URL, click a link or button, type into a field "
        "(and submit), scroll, extract the page's text and links (pages rendered by "
        "JavaScript too), or take a screenshot."
    )
    examples = (
        "open the website in a browser",
        "click the next page link",
        "type the query into the search box",
        "scroll down the page",
        "take a screenshot of the page",
        "read the page that needs JavaScript",
    )
    tooltip = "Use the browser"
    Params = BrowserParams
    actions = {
        "open": ("url",),
        "click": ("selector",),
        "type": ("selector", "text"),
        "scroll": (),
        "extract": (),
        "screenshot": (),
        "close": (),
    }
    discoverable = False
    internal = True
    timeout = 120.0

    def run(self, params: BrowserParams) -> ToolResult:
        from chalie.web.browser import BrowserError, png_payload

        kit = results.kit_of(self.services)
        if isinstance(kit, ToolResult):
            return kit
        session = self.context.turn_id if self.context is not None else "cli"
        pool = kit.browser
        try:
            state = pool.act(
                session,
                params.action,
                url=params.url,
                selector=params.selector,
                text=params.text,
                submit=params.submit,
                amount=params.amount,
            )
        except BrowserError as exc:
            return results.error(exc.code, exc.message, exc.hint)
        meta = {"action": params.action, "blocked": len(state.blocked)}
        if params.action == "close":
            return ToolResult.success("The page is closed.", meta=meta)
        if state.screenshot is not None:
            return ToolResult.success(
                f"Screenshot of {state.url} taken ({len(state.screenshot)} bytes); "
                "the person sees it in the chat.",
                rich=png_payload(state.screenshot),
                meta={**meta, "url": state.url[:2048]},
            )
        assert state.document is not None
        limit = kit.config.max_text_chars if params.action == "extract" else GLANCE
        result = results.document_result(
            state.document, state.url, limit, links=True, extra_meta=meta
        )
        if state.blocked:
            listed = ", ".join(state.blocked[:5])
            return ToolResult.success(
                result.body + f"\n\nRequests refused by the SSRF guard: {listed}",
                rich=result.rich,
                meta=result.meta,
            )
        return result

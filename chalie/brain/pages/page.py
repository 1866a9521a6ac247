"""What a dashboard page is: a slug, a title, a template and the load step that fills it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class Operations(Protocol):
    """What a page's load step calls (chalie.brain.web.Brain): one operation, named by its
    :class:`chalie.brain.operations.Backend` method."""

    async def op(
        self, run: Callable[..., Any], path: Mapping[str, Any] | None = None, /, **raw: Any
    ) -> Any: ...


Load = Callable[[Operations, Mapping[str, str]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Page:
    slug: str
    title: str
    template: str
    load: Load
    # A part of the page the browser refreshes by itself (live approvals), if any.
    fragment: str | None = None
    # Actions whose answer the page shows (a token's secret, a test report) instead of
    # redirecting back to it.
    shows_results: bool = False


def chosen(query: Mapping[str, str], *names: str) -> dict[str, str]:
    """The filters a person filled in (empty fields are no filter)."""
    return {n: query[n] for n in names if query.get(n)}

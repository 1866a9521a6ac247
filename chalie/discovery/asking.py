"""How the discovery abilities (find_tools, find_skills) ask the discovery service: one
query entry's type, and the service's failures as error results."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import msgspec

from chalie.ability import Ability
from chalie.discovery.cascade import MAX_ENTRIES, MAX_ENTRY_CHARS, QueryError
from chalie.discovery.types import IndexBuilding, IndexCorruptError
from chalie.result import ToolResult

log = logging.getLogger("chalie.discovery")
T = TypeVar("T")

Entry = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ENTRY_CHARS)]


def index_error(exc: Exception) -> ToolResult:
    log.error("discovery index error: %s", exc)
    return ToolResult.error(
        "discovery-index-error",
        "The tool index is missing, corrupt or unreadable, so tools cannot be searched right now.",
        hint="Tell the user tool search is unavailable; do not assume no tool exists.",
    )


def building(exc: IndexBuilding) -> ToolResult:
    progress = f" ({exc.done} of {exc.total} embedded)" if exc.total else ""
    wait = round(exc.retry_after)
    return ToolResult.error(
        "discovery-index-building",
        f"The tool index is still being built{progress}, so tools cannot be searched yet.",
        hint=f"Retry this call in about {wait} seconds; meanwhile tell the user you are "
        "getting ready, or answer without a tool.",
        meta={"retry_after": wait},
    )


def bad_query(exc: QueryError) -> ToolResult:
    return ToolResult.error(
        "invalid-param",
        f"{exc}.",
        hint=f"pass query as an array of 1 to {MAX_ENTRIES} short strings, one tool or action each",
        meta={"param": "query"},
    )


def ask_discovery(ability: Ability, ask: Callable[[Any], T]) -> T | ToolResult:
    """Ask the discovery service; its failures become error results."""
    discovery = None if ability.services is None else ability.services.discovery
    if discovery is None:
        return index_error(RuntimeError("no discovery service is attached"))
    try:
        return ask(discovery)
    except QueryError as exc:
        return bad_query(exc)
    except IndexBuilding as exc:
        return building(exc)
    except IndexCorruptError as exc:
        return index_error(exc)

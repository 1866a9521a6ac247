"""Trail: the action trail filtered by tool, status, code, channel, conversation, principal
and time,
paged by keyset through any depth, exported as JSONL or CSV."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from chalie.brain.pages.page import Page, chosen

FILTERS = ("tool", "status", "code", "channel", "conversation", "principal", "since", "until")


async def load(brain: Any, query: Mapping[str, str]) -> dict[str, Any]:
    filters = chosen(query, *FILTERS)
    paged = chosen(query, "before")
    found = await brain.op("trail", **filters, **paged)
    nxt = None
    if found.next_before is not None:
        nxt = "/brain/trail?" + urlencode({**filters, "before": found.next_before})
    return {
        "trail": found,
        "filters": filters,
        "next_url": nxt,
        "export_jsonl": "/api/v1/trail/export?" + urlencode({**filters, "format": "jsonl"}),
        "export_csv": "/api/v1/trail/export?" + urlencode({**filters, "format": "csv"}),
    }


PAGE = Page("trail", "Trail", "trail.html", load)

"""Trail: calls, error rate and p50/p95 latency per tool and per remote server over the last
hour or day (:mod:`chalie.calls.usage`); the action trail filtered by tool, status, code, channel,
conversation, principal
and time (a date and time in the browser's form, local time; unix seconds in the REST API),
paged by keyset through any depth, exported as JSONL or CSV through the signed-in session
(``/brain/download/trail_export``, the REST operation's own answer)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from chalie.brain.operations import Backend
from chalie.brain.pages.page import Operations, Page, chosen

FILTERS = ("tool", "status", "code", "channel", "conversation", "principal", "since", "until")
TIMES = ("since", "until")


def unix_time(text: str) -> float:
    """A form's ``2026-12-06T19:30`` (local time) or unix seconds; ValueError otherwise."""
    try:
        return float(text)
    except ValueError:
        return dt.datetime.fromisoformat(text).timestamp()


def form_time(seconds: float) -> str:
    """Unix seconds as a ``datetime-local`` input's value (local time, to the second)."""
    return dt.datetime.fromtimestamp(seconds).replace(microsecond=0).isoformat()


async def load(brain: Operations, query: Mapping[str, str]) -> dict[str, Any]:
    filters = chosen(query, *FILTERS)
    problem = ""
    for name in TIMES:
        if name in filters:
            try:
                filters[name] = repr(unix_time(filters[name]))
            except (ValueError, OverflowError, OSError):
                problem = f"{name}: {filters.pop(name)[:40]!r} is not a date and time"
    paged = chosen(query, "before")
    found = await brain.op(Backend.trail, **filters, **paged)
    window = "day" if query.get("window") == "day" else "hour"
    used = await brain.op(Backend.usage, window=window)
    nxt = None
    if found.next_before is not None:
        nxt = "/brain/trail?" + urlencode({**filters, "before": found.next_before})
    return {
        "trail": found,
        "usage": used,
        "window_urls": {
            w: "/brain/trail?" + urlencode({**filters, "window": w}) for w in ("hour", "day")
        },
        "filters": filters,
        "shown_times": {n: form_time(float(filters[n])) for n in TIMES if n in filters},
        "problem_times": problem,
        "next_url": nxt,
        "export_jsonl": "/brain/download/trail_export?" + urlencode({**filters, "format": "jsonl"}),
        "export_csv": "/brain/download/trail_export?" + urlencode({**filters, "format": "csv"}),
    }


PAGE = Page("trail", "Trail", "trail.html", load)

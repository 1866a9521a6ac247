"""The dashboard's pages: one module and one row each (a new page is a module and a line here).

A page is a :class:`~chalie.brain.pages.page.Page`: its slug (the route ``/brain/<slug>``),
its title, its template, and ``load``, which gathers what the template shows by running the
same operations the REST API runs.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any, Final

import msgspec

from chalie.brain.pages import (
    accounts,
    approvals,
    conversations,
    discovery,
    mcp_server,
    memory,
    overview,
    policy,
    reminders,
    remote,
    tools,
    trail,
)
from chalie.brain.pages.page import Page

PAGES: Final[tuple[Page, ...]] = (
    overview.PAGE,
    approvals.PAGE,
    policy.PAGE,
    mcp_server.PAGE,
    remote.PAGE,
    trail.PAGE,
    tools.PAGE,
    conversations.PAGE,
    accounts.PAGE,
    memory.PAGE,
    reminders.PAGE,
    discovery.PAGE,
)


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float) or ts <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty(value: Any) -> str:
    return json.dumps(msgspec.to_builtins(value), indent=2, ensure_ascii=False, sort_keys=True)


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return "-"
    s = int(seconds)
    return f"{s // 86400}d {s % 86400 // 3600}h {s % 3600 // 60}m {s % 60}s"


def filters() -> dict[str, Callable[[Any], str]]:
    return {"when": _when, "pretty": _pretty, "duration": _duration}


__all__ = ["PAGES", "Page", "filters"]

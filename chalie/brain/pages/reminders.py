"""Reminders: pending ones (next due first), fired ones and late ones (newest firing first),
with each one's rule, zone and last answer; a pending one can be cancelled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, get_args

from chalie.brain.operations import Backend
from chalie.brain.pages.page import Operations, Page
from chalie.schedule.store import Shown

VIEWS: Final = get_args(Shown)


async def load(brain: Operations, query: Mapping[str, str]) -> dict[str, Any]:
    view = query.get("view", "pending")
    if view not in VIEWS:
        view = "pending"
    return {
        "rows": await brain.op(Backend.reminders, view=view),
        "view": view,
        "views": VIEWS,
        "back": "reminders" if view == "pending" else f"reminders?view={view}",
    }


PAGE = Page("reminders", "Reminders", "reminders.html", load)

"""Policy manager: every (channel, permission) with its setting, filtered; set, reset, wildcards.

The table is shown :data:`PER_PAGE` rows at a time (every row is reachable by the pages and by
the search); the REST answer behind it has them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlencode

from chalie.brain.operations import Backend
from chalie.brain.pages.page import Operations, Page, chosen

PER_PAGE: Final = 100


async def load(brain: Operations, query: Mapping[str, str]) -> dict[str, Any]:
    filters = chosen(query, "q", "channel", "setting", "origin", "internal")
    policy = await brain.op(Backend.policy, **filters)
    total = len(policy.rows)
    pages = max(1, -(-total // PER_PAGE))
    try:
        number = min(max(1, int(query.get("page", "1"))), pages)
    except ValueError:
        number = 1
    start = (number - 1) * PER_PAGE

    def link(n: int) -> str | None:
        if not 1 <= n <= pages or n == number:
            return None
        return "/brain/policy?" + urlencode({**filters, "page": n})

    return {
        "policy": policy,
        "rows": policy.rows[start : start + PER_PAGE],
        "total": total,
        "first": start + 1 if total else 0,
        "last": min(start + PER_PAGE, total),
        "prev_url": link(number - 1),
        "next_url": link(number + 1),
        "filters": filters,
    }


PAGE = Page("policy", "Policy", "policy.html", load)

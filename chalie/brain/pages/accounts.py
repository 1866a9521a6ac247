"""Accounts: the person's calendar, contacts and email accounts (kind, name, default, where the
server is, whether a password is stored); never a password. Added with ``chalie accounts``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.pages.page import Page


async def load(brain: Any, _query: Mapping[str, str]) -> dict[str, Any]:
    return {"rows": await brain.op("accounts")}


PAGE = Page("accounts", "Accounts", "accounts.html", load)

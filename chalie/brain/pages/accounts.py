"""Accounts: the person's calendar, contacts and email accounts (kind, name, default, where the
server is, whether a password is stored); never a password. Added with ``chalie accounts``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chalie.brain.operations import Backend
from chalie.brain.pages.page import Operations, Page


async def load(brain: Operations, _query: Mapping[str, str]) -> dict[str, Any]:
    return {"rows": await brain.op(Backend.accounts)}


PAGE = Page("accounts", "Accounts", "accounts.html", load)

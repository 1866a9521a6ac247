"""``loop_in_human``: the event that shows a person what an agent asked Chalie and what it answered.

Published twice per surfaced exchange (``phase`` "asked", then "answered") to
every connected chat client through :class:`HumanDesk`.
"""

from __future__ import annotations

import time
from typing import Literal, Protocol

import msgspec

Phase = Literal["asked", "answered"]


class AgentExchange(msgspec.Struct, frozen=True, kw_only=True, tag="agent_exchange"):
    """An inbound agent's message (and, once answered, Chalie's answer) shown to the user."""

    conversation_id: str
    phase: Phase
    token_name: str
    agent_name: str
    project: str
    message: str
    answer: str = ""
    reason: str = ""
    ts: float = msgspec.field(default_factory=time.time)


class HumanDesk(Protocol):
    """Where the people are: connected chat clients."""

    def humans_connected(self) -> int: ...

    def surface(self, exchange: AgentExchange) -> int:
        """Show the exchange to every connected chat client; how many deliveries were made."""
        ...

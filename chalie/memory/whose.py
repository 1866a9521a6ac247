"""Whose memory a turn reads and writes: the one place a principal identity becomes a memory key.

Today a turn carries its channel and its conversation's origin; an inbound
MCP conversation's origin names the token that started it
(``chalie.mcp_server.turns.origin``). The owner's memories are keyed
``owner``; an agent's are keyed ``agent:<token name>`` and are kept apart.
When tokens carry a scope and a stable id (the principals work), only
:func:`principal_of` changes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from chalie.mcp_server.turns import ORIGIN_PREFIX

OWNER: Final = "owner"
AGENT_PREFIX: Final = "agent:"
# Who may be allowed to read the owner's memories: every agent.
ALL_AGENTS: Final = "*"


def principal_of(channel: str, origin: str) -> str:
    """The memory key of a turn on ``channel`` whose conversation has ``origin``."""
    if origin.startswith(ORIGIN_PREFIX):
        return AGENT_PREFIX + origin[len(ORIGIN_PREFIX) :]
    if channel == "external_agent":
        # An agent turn whose token is unknown must not read or write the owner's memories.
        return AGENT_PREFIX + "?"
    return OWNER


def is_agent(principal: str) -> bool:
    return principal.startswith(AGENT_PREFIX)


def agent_name(principal: str) -> str:
    return principal[len(AGENT_PREFIX) :] if is_agent(principal) else ""


def readable_by(principal: str, owner_readers: Collection[str]) -> tuple[str, ...]:
    """The memory keys a principal recalls from: its own, plus the owner's if the owner allows it.

    ``owner_readers`` is the owner's allow-list of agent token names (``*``: all agents).
    """
    if not is_agent(principal):
        return (OWNER,)
    name = agent_name(principal)
    if name != "?" and (name in owner_readers or ALL_AGENTS in owner_readers):
        return (principal, OWNER)
    return (principal,)

"""Whose memory a turn reads and writes: the one place a principal identity becomes a memory key.

A turn carries its principal (``TurnContext.principal``, chalie.wire.principals): the
owner's memories are keyed ``owner``; an agent's are keyed ``agent:<token id>`` and
kept apart, so a new token that reuses a revoked token's name inherits none of them.
A turn without a principal falls back to its conversation's origin, which names the
token that started an inbound MCP conversation (``chalie.mcp_server.turns.origin``):
``agent:<token name>``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from chalie.mcp_server.turns import ORIGIN_PREFIX
from chalie.wire.principals import Principal

OWNER: Final = "owner"
AGENT_PREFIX: Final = "agent:"
# The key of an agent turn whose token is unknown.
UNKNOWN_AGENT: Final = AGENT_PREFIX + "?"
# Who may be allowed to read the owner's memories: every agent.
ALL_AGENTS: Final = "*"


def principal_of(channel: str, origin: str, who: Principal | None = None) -> str:
    """The memory key of a turn on ``channel`` by ``who``, whose conversation has ``origin``."""
    if who is not None:
        return OWNER if who.is_owner else AGENT_PREFIX + who.id
    if origin.startswith(ORIGIN_PREFIX):
        return AGENT_PREFIX + origin[len(ORIGIN_PREFIX) :]
    if channel == "external_agent":
        # An agent turn whose token is unknown must not read or write the owner's memories.
        return UNKNOWN_AGENT
    return OWNER


def is_agent(principal: str) -> bool:
    return principal.startswith(AGENT_PREFIX)


def agent_name(principal: str) -> str:
    return principal[len(AGENT_PREFIX) :] if is_agent(principal) else ""


def readable_by(
    principal: str, owner_readers: Collection[str], name: str | None = None
) -> tuple[str, ...]:
    """The memory keys a principal recalls from: its own, plus the owner's if the owner allows it.

    ``owner_readers`` is the owner's allow-list of agent token names (``*``: all agents);
    ``name`` is the agent's token name when the key holds its id.
    """
    if not is_agent(principal):
        return (OWNER,)
    if name is None:
        name = agent_name(principal)
    if name != "?" and (name in owner_readers or ALL_AGENTS in owner_readers):
        return (principal, OWNER)
    return (principal,)

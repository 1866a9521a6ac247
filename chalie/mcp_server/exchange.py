"""``loop_in_human``: the event that shows a person what an agent asked Chalie and what it answered.

Kept (:mod:`chalie.mcp_server.kept`, for owners who connect later), then published
twice per surfaced exchange (``phase`` "asked", then "answered") to every connected
chat client through :class:`HumansPort`; with
``[mcp_server] loop_in_human_asks`` also once per approval the turn needs
(``phase`` "permission", carrying the ``request_id`` an owner client answers
with its ``answer`` frame and a ``prompt`` naming the agent, its channel and
the call's parameters, one escaped line each). Only owner sessions receive
them (:class:`chalie.chat.session.ChatSession`), and only an owner's answer
counts (:func:`chalie.wire.principals.may_answer`): the agent never approves its
own request.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Protocol

import msgspec

from chalie.gate.display import one_line

Phase = Literal["asked", "answered", "permission"]


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
    # phase "permission" only: the pending request and what it would do.
    request_id: str = ""
    tool: str = ""
    permission: str = ""
    act_summary: str = ""
    expires_at: float = 0.0
    prompt: str = ""
    # A form to fill (a remote server's elicitation within the agent's turn): its schema;
    # answered like a permission_request with one (allow_once with content, or deny).
    form: dict[str, Any] | None = None
    # phase "answered": the calls Chalie made for the agent ("tool: status").
    calls: tuple[str, ...] = ()
    ts: float = msgspec.field(default_factory=time.time)
    # Its number among the kept exchanges (chalie.mcp_server.kept; 0: not kept).
    kept: int = 0


def summary(exchange: AgentExchange) -> str:
    """The exchange in one line, as every surface shows it (chat, the CLI, the Brain)."""
    who = (
        f"agent {one_line(exchange.agent_name, 128)!r} (token {one_line(exchange.token_name, 64)},"
        f" project {one_line(exchange.project, 128)!r})"
    )
    if exchange.phase == "asked":
        return f"{who} asked Chalie: {one_line(exchange.message, 400)}"
    if exchange.phase == "answered":
        calls = f" (calls: {one_line(', '.join(exchange.calls), 200)})" if exchange.calls else ""
        return f"Chalie answered {who}: {one_line(exchange.answer, 400)}{calls}"
    what = one_line(exchange.act_summary or exchange.tool or "an action", 200)
    return (
        f"{who} asked for something that needs your approval: {what}"
        f" ({one_line(exchange.permission or exchange.tool, 64)}), request {exchange.request_id}"
    )


class HumansPort(Protocol):
    """Where the people are: connected chat clients."""

    def humans_connected(self) -> int: ...

    def surface(self, exchange: AgentExchange) -> int:
        """Show the exchange to every connected chat client; how many deliveries were made."""
        ...

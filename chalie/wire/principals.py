"""Principals: who a caller is, before anything else, and what each kind may do.

Every caller is one :class:`Principal`: the **owner** (the person Chalie
serves: the local control socket, the local ZeroMQ chat socket, owner tokens
on the chat WebSocket), an **agent** (an inbound MCP token: ``talk_to_chalie``
only) or a **gateway** agent (an agent that may also call tools directly when
``[mcp_server] gateway`` is on). A token principal is keyed by the token's
stable id, never its name: a new token reusing a revoked one's name is a new
principal and inherits nothing.

The rules of who may do what live here, once:

- :func:`may_chat`: only an owner opens a chat session.
- :func:`may_answer`: only an owner answers a permission request, and never the
  principal whose turn raised it unless that principal is the owner itself
  (the person answering their own chat turn).
- :func:`may_use_gateway`: only a gateway token calls tools directly.
- :func:`may_see`: the owner sees every conversation; anyone else only its own.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

Scope = Literal["owner", "agent", "gateway"]
SCOPES: Final[tuple[Scope, ...]] = ("owner", "agent", "gateway")
# What ``chalie token create NAME`` makes without a flag: least privilege.
DEFAULT_SCOPE: Final[Scope] = "agent"
# The principal id of the local control and ZeroMQ chat sockets (0600, the OS user).
LOCAL_ID: Final = "local"


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """One caller: its scope, a stable id (a token id, or ``local``), and a name to show."""

    scope: Scope
    id: str
    name: str = ""

    @property
    def is_owner(self) -> bool:
        return self.scope == "owner"

    def shown(self) -> str:
        """How a log line or a prompt names this principal (never a secret)."""
        if self.id == LOCAL_ID:
            return "the local owner"
        return f"{self.scope} token {self.name or '?'} ({self.id})"


LOCAL_OWNER: Final = Principal(scope="owner", id=LOCAL_ID, name="local")


def principal_id(who: Principal | None, channel: str = "") -> str:
    """The id a record (the trail) keeps for a caller: a token id, or ``local`` for the owner.

    A turn without a principal is the owner's local or operator call, except on the
    ``external_agent`` channel, where it is an agent whose token is unknown: ``""``, never
    the owner's id.
    """
    if who is not None:
        return who.id
    return "" if channel == "external_agent" else LOCAL_ID


def check_scope(value: object) -> Scope:
    if value not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {str(value)[:40]!r}")
    return value  # type: ignore[return-value]


def may_chat(who: Principal | None) -> bool:
    return who is not None and who.is_owner


def may_use_gateway(who: Principal | None) -> bool:
    return who is not None and who.scope == "gateway"


def may_answer(who: Principal | None, requester: Principal | None) -> bool:
    """May ``who`` answer a permission request raised by the turn of ``requester``?

    Only an owner answers. The requester itself never does, unless it is the
    owner (the person answering their own chat turn's request). An agent,
    whatever path it takes (a chat frame, a control command, an agent_exchange
    prompt), never answers.
    """
    if who is None or not who.is_owner:
        return False
    return requester is None or requester.is_owner or requester.id != who.id


def may_see(who: Principal | None, owner_id: str) -> bool:
    """May ``who`` see (open, send into, cancel, delete) a conversation owned by ``owner_id``?"""
    if who is None:
        return False
    return who.is_owner or (bool(owner_id) and owner_id == who.id)

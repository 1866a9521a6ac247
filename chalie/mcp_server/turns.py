"""What the inbound MCP server needs from the conversations seam, and its view of their events.

:class:`ConversationsPort` is the Conversations actor as async code sees it (the daemon's
adapter bridges it to the Conversations actor; tests use an in-process
double). :func:`view` reads a conversation event (a msgspec Struct tagged by
``type``) into the one flat :class:`TurnEvent` the tool follows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NamedTuple, Protocol

import msgspec

CHANNEL: Final = "external_agent"
ORIGIN_PREFIX: Final = "mcp:"

EVENT_KINDS: Final = frozenset(
    {
        "turn_started",
        "text_delta",
        "tool_started",
        "tool_finished",
        "permission_request",
        "permission_settled",
        "background_result",
        "rich_payload",
        "tool_progress",
        "turn_finished",
        "error",
    }
)


class TurnRefused(Exception):
    """The conversations refused the message; ``code`` is a stable error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Sent(NamedTuple):
    conversation_id: str
    turn_id: str | None


class Closeable(Protocol):
    def close(self) -> None: ...


class ConversationsPort(Protocol):
    """The conversations port for async callers: never blocks the event loop."""

    async def send(
        self,
        *,
        conversation_id: str | None,
        text: str,
        client_msg_id: str,
        origin: str,
        human_present: bool = False,
    ) -> Sent:
        """Start (or queue) a turn; ``human_present``: a person answers this turn's asks."""
        ...

    async def cancel(self, conversation_id: str) -> bool: ...

    async def events(self, conversation_id: str, after_seq: int, limit: int) -> list[Any]: ...

    def subscribe(self, conversation_id: str, callback: Callable[[Any], None]) -> Closeable:
        """Live events of one conversation; ``callback`` runs on the publisher's thread."""
        ...


class TurnEvent(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of a conversation event the inbound tool follows."""

    kind: str
    conversation_id: str = ""
    seq: int = 0
    turn_id: str | None = None
    client_msg_id: str | None = None
    call_id: str | None = None
    tool: str | None = None
    act_summary: str | None = None
    status: str | None = None
    code: str | None = None
    text: str | None = None
    reason: str | None = None
    message: str | None = None
    request_id: str | None = None
    permission: str | None = None
    expires_at: float | None = None


_FIELDS: Final = tuple(f for f in TurnEvent.__struct_fields__ if f != "kind")
_NUMBERS: Final = ("seq", "expires_at")


def kind_of(event: Any) -> str | None:
    """The ``type`` tag of a conversation event (None for anything else)."""
    config = getattr(type(event), "__struct_config__", None)
    tag = getattr(config, "tag", None)
    if isinstance(tag, str) and tag in EVENT_KINDS:
        return tag
    return None


def view(event: Any) -> TurnEvent | None:
    kind = kind_of(event)
    if kind is None:
        return None
    values: dict[str, Any] = {}
    for name in _FIELDS:
        value = getattr(event, name, None)
        if value is not None:
            values[name] = value if name in _NUMBERS else str(value)
    for name in _NUMBERS:
        if name in values and (
            not isinstance(values[name], (int, float)) or isinstance(values[name], bool)
        ):
            values.pop(name)
    if "seq" in values and not isinstance(values["seq"], int):
        values.pop("seq")
    return TurnEvent(kind=kind, **values)


def origin(token_name: str) -> str:
    """How a turn's origin names the token that asked for it."""
    return f"{ORIGIN_PREFIX}{token_name}"

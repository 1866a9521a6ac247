"""What a client asks of the conversations (:class:`SendMessage`) and what it gets back.

These are the types of the Conversations actor's seam that the chat bridges
and the inbound MCP server build on; :func:`check_send` is the one place a
message is validated before anything is stored.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

import msgspec

from chalie.process.control import Args
from chalie.wire.messages import Busy, Id
from chalie.wire.principals import Principal

ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CLIENT_ID_MAX: Final = 128
ORIGIN_MAX: Final = 128


class SendMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A user message. ``conversation_id`` None starts a new conversation on ``channel``."""

    conversation_id: str | None
    channel: str
    text: str
    client_msg_id: str
    busy: Busy = "queue"
    origin: str = ""
    # A person will answer this turn's asks although its channel has none (an inbound
    # agent's loop_in_human turn, chalie/mcp_server/talk.py); this turn only.
    human_present: bool = False
    # Who sends it (chalie.wire.principals); None: the local owner. A new conversation
    # belongs to it; an existing one accepts only its owner principal or the owner.
    principal: Principal | None = None
    # An inbound agent's turn with [mcp_server] park_asks: an ask that would be a deny
    # becomes a request the owner answers later (chalie.gate.approvals); this turn only.
    park_asks: bool = False
    # The W3C trace context the turn continues (chalie.process.telemetry; '' or malformed: none).
    traceparent: Annotated[str, msgspec.Meta(max_length=64)] = ""


class ConversationError(ValueError):
    """A request the conversations refuse; ``code`` is listed in chalie/errors.py."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_id(value: str, what: str = "conversation_id") -> str:
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise ConversationError(
            "invalid-message", f"{what} must be 1 to 64 letters, digits, '-' or '_'"
        )
    return value


def check_send(msg: SendMessage, *, channels: frozenset[str], max_chars: int) -> None:
    """Refuse a malformed, oversized or hostile message before anything is stored."""
    if msg.conversation_id is not None:
        check_id(msg.conversation_id)
    if msg.channel not in channels:
        raise ConversationError(
            "unknown-channel",
            f"no channel {msg.channel[:64]!r}; known: {', '.join(sorted(channels))}",
        )
    if not isinstance(msg.text, str) or not msg.text.strip():
        raise ConversationError("invalid-message", "the message text is empty")
    if len(msg.text) > max_chars:
        raise ConversationError(
            "invalid-message",
            f"the message is {len(msg.text)} characters; the limit is {max_chars}",
        )
    if "\x00" in msg.text:
        raise ConversationError("invalid-message", "the message holds a NUL character")
    if len(msg.client_msg_id) > CLIENT_ID_MAX:
        raise ConversationError(
            "invalid-message", f"client_msg_id is longer than {CLIENT_ID_MAX} characters"
        )
    if len(msg.origin) > ORIGIN_MAX:
        raise ConversationError("invalid-message", f"origin is longer than {ORIGIN_MAX} characters")


# -- control commands (``chalie ask``, ``chalie conversations ...``) ----------------------


class AskArgs(Args):
    """A one-shot turn without a human."""

    text: Annotated[str, msgspec.Meta(min_length=1, max_length=100_000)]
    channel: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "subconscious"
    conversation_id: Id | None = None
    timeout: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 600.0


class ConversationsListArgs(Args):
    limit: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 50


class ConversationArgs(Args):
    conversation_id: Id

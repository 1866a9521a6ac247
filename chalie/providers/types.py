"""The provider-neutral shape of a model exchange: messages, a request, a response, an error.

A conversation's history is stored in this shape; each wire format
(:mod:`chalie.providers.formats`) translates it to and from its provider's.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

Role = Literal["user", "assistant", "tool", "background"]
StopReason = Literal["final", "tool_calls", "length", "other"]

# How many seconds of Retry-After the turn will honour before giving up.
MAX_RETRY_AFTER: Final = 60.0


class ToolCallPart(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One tool call the model asked for. ``arguments`` is None when they were not valid JSON."""

    id: str
    name: str
    arguments: dict[str, Any] | None = None
    raw: str = ""  # the unparsed text, kept only when it did not parse


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One history entry.

    ``user``: what a person (or a calling agent) typed. ``assistant``: the
    model's text and tool calls. ``tool``: the envelope answering
    ``call_id``. ``background``: a background result delivered later, shown
    to the model as a user-side note.
    """

    role: Role
    text: str = ""
    tool_calls: tuple[ToolCallPart, ...] = ()
    call_id: str = ""
    tool: str = ""


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


class ModelRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One model step: system prompt, history, descriptors (name, description, input_schema)."""

    system: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[dict[str, Any], ...] = ()
    max_tokens: int = 4096
    # The answer asked for after a success: its output is free text even where steps are
    # structured (held to a step object, the 1.5B model called the tool again or stored
    # the result in memory instead of answering; in words it answered).
    free: bool = False


class ModelResponse(msgspec.Struct, frozen=True, kw_only=True):
    text: str = ""
    tool_calls: tuple[ToolCallPart, ...] = ()
    usage: Usage = Usage()
    stop: StopReason = "final"


class ProviderError(Exception):
    """A model request failed. ``retryable`` failures (429, 5xx, refused, dropped) are retried.

    ``code`` is a stable kebab-case code from :mod:`chalie.errors`; the
    message never holds a key or a header.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds only; an HTTP date is ignored)."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0:  # NaN or negative
        return None
    return min(seconds, MAX_RETRY_AFTER)

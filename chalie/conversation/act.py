"""The act loop's pure rules: the context budget, the guards, the checks on a model's tool calls.

The TurnActor (actors/conversation/turn.py) sequences a turn; every decision it makes
about what to send and when to stop is a function here, tested without actors.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
import zoneinfo
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from chalie.calls.dispatch import envelope_name
from chalie.calls.envelope import parse as parse_envelope
from chalie.calls.envelope import render
from chalie.conversation.channels import Channel
from chalie.providers.rescue import loads, rescue
from chalie.providers.types import ChatMessage, ModelResponse, ToolCallPart
from chalie.result import ToolResult
from chalie.wire.events import FinishReason

# A rough, tokenizer-free estimate: about four characters a token, plus framing.
CHARS_PER_TOKEN: Final = 4
MESSAGE_OVERHEAD: Final = 4
_encode: Final = msgspec.json.Encoder().encode
DROPPED_RESULT: Final = "[tool result dropped to fit the model's context window]"

GUARD_LINES: Final[dict[str, str]] = {
    "guard-steps": "I stopped: this turn reached its limit of {limit} model steps.",
    "guard-repeat": "I stopped: the same tool call with the same arguments came {limit} times.",
    "guard-time": "I stopped: this turn ran past its time budget of {limit:g} seconds.",
    "guard-tokens": "I stopped: this turn used up its budget of {limit} tokens.",
}


def with_today(prompt: str, zone: str, now: float) -> str:
    """The system prompt with the day it is where the person is (a model that does not know
    the date invents one: the real 1.5B model asked the calendar about October 2023 for
    "tomorrow"). The date only, not the time: the prompt, the start of every request, stays
    the same all day, so the model server's prompt cache keeps serving it."""
    try:
        tz: dt.tzinfo = zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        tz, zone = dt.UTC, "UTC"
    today = dt.datetime.fromtimestamp(now, tz)
    return f"{prompt} Today is {today:%A %Y-%m-%d}; the user's time zone is {zone}."


def estimate_tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN + 1


def _json_chars(value: Any) -> int:
    """The length of ``value`` as JSON text (msgspec: every step of every turn counts these)."""
    return len(_encode(value))


def message_tokens(m: ChatMessage) -> int:
    n = MESSAGE_OVERHEAD + estimate_tokens(m.text)
    for call in m.tool_calls:
        n += estimate_tokens(call.name) + (
            estimate_tokens(call.raw)
            if call.arguments is None
            else _json_chars(call.arguments) // CHARS_PER_TOKEN + 1
        )
    return n


def tools_tokens(tools: Sequence[dict[str, Any]]) -> int:
    return sum(_json_chars(t) // CHARS_PER_TOKEN + 1 for t in tools)


@dataclass
class Fitted:
    messages: list[ChatMessage]
    notes: list[str] = field(default_factory=list)


def fit_context(
    messages: Sequence[ChatMessage],
    current_start: int,
    budget: int,
    sizes: Sequence[int] | None = None,
) -> Fitted:
    """The history within ``budget`` tokens; the current turn (from ``current_start``) is kept.

    First the oldest tool results are shortened, then the oldest whole turns
    (a user message up to the next one) are dropped. Dropping whole turns keeps
    every tool call beside its result. ``sizes``: each message's
    :func:`message_tokens`, when the caller keeps them (else counted here).
    """
    out = list(messages)
    if sizes is not None and len(sizes) == len(out):
        sizes = list(sizes)  # trimmed below: the caller's stay as they are
    else:
        sizes = [message_tokens(m) for m in out]
    total = sum(sizes)
    if total <= budget:
        return Fitted(out)
    notes: list[str] = []
    shortened = 0
    for i in range(min(current_start, len(out))):
        if total <= budget:
            break
        m = out[i]
        if m.role in ("tool", "background") and m.text != DROPPED_RESULT:
            replacement = ChatMessage(
                role=m.role, call_id=m.call_id, tool=m.tool, text=DROPPED_RESULT
            )
            new = message_tokens(replacement)
            total -= sizes[i] - new
            sizes[i] = new
            out[i] = replacement
            shortened += 1
    if shortened:
        notes.append(f"context: shortened {shortened} old tool result(s)")
    dropped_turns = 0
    start = 0
    limit = min(current_start, len(out))
    while total > budget and start < limit:
        end = start + 1
        while end < limit and out[end].role != "user":
            end += 1
        total -= sum(sizes[start:end])
        start = end
        dropped_turns += 1
    if dropped_turns:
        notes.append(f"context: dropped the {dropped_turns} oldest turn(s)")
        out = out[start:]
    if total > budget:
        notes.append("context: the current turn alone exceeds the model's window")
    return Fitted(out, notes)


@dataclass
class Guards:
    """One turn's counters against its channel's limits."""

    channel: Channel
    started: float = field(default_factory=time.monotonic)
    steps: int = 0
    tokens: int = 0
    seen: Counter[str] = field(default_factory=Counter)

    def before_step(self, now: float | None = None) -> FinishReason | None:
        """Whether the turn must stop before asking the model again."""
        now = time.monotonic() if now is None else now
        if now - self.started >= self.channel.wall_clock:
            return "guard-time"
        if self.tokens >= self.channel.token_budget:
            return "guard-tokens"
        if self.steps >= self.channel.max_steps:
            return "guard-steps"
        return None

    def record_call(self, call: ToolCallPart) -> bool:
        """Count a tool call; True when it is the Nth identical one (the repeat guard trips)."""
        key = call_key(call)
        self.seen[key] += 1
        return self.seen[key] >= self.channel.max_repeat

    def line(self, reason: FinishReason) -> str:
        limit: Any = {
            "guard-steps": self.channel.max_steps,
            "guard-repeat": self.channel.max_repeat,
            "guard-time": self.channel.wall_clock,
            "guard-tokens": self.channel.token_budget,
        }.get(reason, 0)
        return GUARD_LINES.get(reason, "The turn ended.").format(limit=limit)


def call_key(call: ToolCallPart) -> str:
    """What makes two calls the same: the name and the arguments (act_summary aside)."""
    if call.arguments is None:
        args = call.raw
    else:
        args = json.dumps(
            {k: v for k, v in call.arguments.items() if k != "act_summary"},
            sort_keys=True,
            default=str,
        )
    return f"{call.name}\x00{args}"


# The one-line notes a small model needs to stop calling and answer (issue 24: after a
# result, 9 of 9 replays called again; with this note or without tools, 6 of 6 answered).
REPEAT_NOTE: Final = (
    "You already have this result. Answer the user in plain words; do not call a tool again."
)
EMPTY_NUDGE: Final = "Answer the user in words."
EMPTY_LINE: Final = "The model gave no answer."
RESULT_SHOWN: Final = 600


def model_notes(envelope: str) -> list[str]:
    """An error envelope's lines meant for the model: its message and its hint."""
    try:
        parsed = parse_envelope(envelope)
    except ValueError:
        return []
    out: list[str] = []
    for env in parsed:
        if env.attrs.get("status") != "error":
            continue
        for line in env.content.splitlines():
            line = line.removeprefix("hint: ").strip()
            if line and not line.startswith("valid values:"):
                out.append(" ".join(line.split()).lower())
    return out


def recites_a_note(text: str, notes: Collection[str]) -> bool:
    """Whether an answer is only a note meant for the model (a hint it could not act on)."""
    said = " ".join(text.split()).lower().strip(" .")
    return bool(said) and any(said == n.strip(" .") for n in notes)


def repeated_result(envelope: str) -> str:
    """The earlier result of a call the model repeated, with the note to answer."""
    return f"{envelope}\n{REPEAT_NOTE}"


def result_for_user(tool: str, envelope: str) -> str:
    """A successful call's result as a line for the user (when a guard ends the turn)."""
    try:
        parsed = parse_envelope(envelope)
    except ValueError:
        parsed = []
    body = parsed[0].content if parsed else envelope
    body = " ".join(body.split())
    if len(body) > RESULT_SHOWN:
        body = body[: RESULT_SHOWN - 3] + "..."
    return f"The result of {tool}: {body}"


def rescued_response(response: ModelResponse, offered: Collection[str]) -> ModelResponse | None:
    """The response with the calls it wrote as text made calls (None: none to rescue)."""
    if response.tool_calls:
        return None
    found = rescue(response.text, offered)
    if found is None:
        return None
    parts = tuple(
        ToolCallPart(
            id=f"call_{uuid.uuid4().hex[:24]}",
            name=c.name,
            arguments=c.arguments,
            raw="" if c.arguments is not None else c.raw,
        )
        for c in found.calls
    )
    return ModelResponse(text=found.text, tool_calls=parts, usage=response.usage, stop="tool_calls")


def loose_arguments(call: ToolCallPart) -> tuple[dict[str, Any] | None, Any]:
    """(the arguments as an object, or the bare value they are) for a call whose arguments
    did not parse as an object: ``["clock"]`` is bare, a template's doubled braces
    ``{{"zone": "UTC"}}`` are the object. (None, None): not JSON at all (or too deep)."""
    if call.arguments is not None:
        return call.arguments, None
    if not call.raw.strip():
        return None, None
    try:
        value = loads(call.raw)
    except ValueError:
        return None, None
    if isinstance(value, dict):
        return value, None
    return None, value


def malformed_arguments(call: ToolCallPart) -> str:
    """The error envelope the model gets for a call whose arguments are not a JSON object."""
    return render(
        envelope_name(call.name),
        ToolResult.error(
            "invalid-param",
            "The arguments of this call are not a valid JSON object.",
            hint="Call the tool again with arguments as one JSON object matching its schema.",
        ),
    )


def closed_call(tool: str, code: str, message: str) -> str:
    """The result a call gets when its turn ends before it does (cancel, guard, crash)."""
    return render(envelope_name(tool), ToolResult.error(code, message))

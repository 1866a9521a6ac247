"""The scripted model's script: what it answers, step by step or by reaction, in all three formats.

A script is JSON::

    {"steps": [STEP, ...], "on_user": STEP, "on_tool": STEP}

``steps`` are replayed in order, one per request. When they run out (or
there are none) the reactive steps answer: ``on_tool`` when the request's
last message is a tool result, else ``on_user``. With neither, the answer is
HTTP 500 "script exhausted". A STEP is an object:

- ``text``: the answer's text (``{last_user}`` is replaced by the last user text);
- ``tool_calls``: ``[{"name": ..., "arguments": {...}}]`` (several make parallel
  calls); ``"raw": "..."`` instead of ``arguments`` sends that text verbatim
  (malformed JSON);
- ``status`` (with ``retry_after``, ``body``): answer an HTTP error instead;
- ``hang``: never answer; ``drop_after``: close the connection after N stream chunks;
- ``delay``: seconds to wait before answering; ``chunk``: characters per text delta;
  ``chunk_delay``: seconds between two stream frames (a model writing at its own pace).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec


class ToolCallStep(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    arguments: dict[str, Any] | None = None
    raw: str | None = None
    id: str | None = None

    def arguments_text(self) -> str:
        if self.raw is not None:
            return self.raw
        return json.dumps(self.arguments or {})


class Step(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    text: str = ""
    tool_calls: list[ToolCallStep] = []
    status: int | None = None
    retry_after: str | None = None
    body: str | None = None
    hang: bool = False
    drop_after: int | None = None
    delay: float = 0.0
    chunk: int = 0
    chunk_delay: float = 0.0
    input_tokens: int = 10
    output_tokens: int = 5


class Script(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    steps: list[Step] = []
    on_user: Step | None = None
    on_tool: Step | None = None


def load_script(text: str | bytes) -> Script:
    return msgspec.json.decode(text, type=Script)


@dataclass
class Player:
    """Chooses the step for each request; thread-safe enough for one loop."""

    script: Script
    position: int = 0
    served: list[dict[str, Any]] = field(default_factory=list)

    def next_step(self, last_is_tool: bool) -> Step | None:
        if self.position < len(self.script.steps):
            step = self.script.steps[self.position]
            self.position += 1
            return step
        return self.script.on_tool if last_is_tool else self.script.on_user


def last_user_text(fmt: str, body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = [b.get("text", "") for b in content if b.get("type") == "text"]
            if texts:
                return " ".join(texts)
    return ""


def last_is_tool(fmt: str, body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    if not messages:
        return False
    last = messages[-1]
    if last.get("role") == "tool":
        return True
    content = last.get("content")
    return (
        isinstance(content, list)
        and bool(content)
        and isinstance(content[-1], dict)
        and content[-1].get("type") == "tool_result"
    )


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:20]

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
  ``chunk_delay``: seconds between two stream frames (a model writing at its own pace);
- ``cases``: ``[{"tools": bool, "offered": NAME, "result_has": TEXT, "then": STEP}]``:
  the first case whose every given condition holds answers instead (``tools``: the
  request offers any tool; ``offered``: it offers NAME; ``result_has``: the last tool
  result contains TEXT; ``described``: the offered tools' descriptions contain TEXT, as
  a model copying an example value would; ``user_has``: the last user message contains
  TEXT, e.g. a note the runtime added), so a script can react the way a model would.

In ``text``, ``{last_result}`` is the content of the last tool result the request
carries. A tool call named ``$suggested`` calls the first valid value of the last
tool result (an unknown-tool error's closest tool); with none, the step answers
the result's hint as text instead (what small models do with a hint).

``"schema": "honour"`` (beside ``steps``) answers a request that carries an output
schema (OpenAI's ``response_format``, Ollama's ``format``) the way a server with a
grammar does: the step's first call, or its text, written as the one step object
the schema allows (:func:`as_step_object`).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from chalie.providers.signatures import listed


class ToolCallStep(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    arguments: dict[str, Any] | None = None
    raw: str | None = None
    id: str | None = None

    def arguments_text(self) -> str:
        if self.raw is not None:
            return self.raw
        return json.dumps(self.arguments or {})


class Case(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    tools: bool | None = None
    offered: str | None = None
    result_has: str | None = None
    described: str | None = None
    user_has: str | None = None
    then: Step


class Step(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    cases: list[Case] = []
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
    # A JSON schema sent for the output (structured steps): "ignore" it, as a server without
    # the feature does, or "honour" it as llama.cpp's grammar does (a step object in text).
    schema: Literal["ignore", "honour"] = "ignore"


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


def offered_tools(fmt: str, body: dict[str, Any]) -> list[str]:
    """The names of the tools the request offers, in any of the three formats."""
    out = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else tool.get("name")
        if isinstance(name, str):
            out.append(name)
    return out or listed(system_text(fmt, body))


def system_text(fmt: str, body: dict[str, Any]) -> str:
    """The request's system prompt, in any of the three formats."""
    system = body.get("system")
    if isinstance(system, list):  # anthropic's blocks
        return " ".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    if isinstance(system, str):
        return system
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "system":
            return str(message.get("content") or "")
    return ""


def last_result(fmt: str, body: dict[str, Any]) -> str:
    """The text of the last tool result in the request ("" when there is none)."""
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "tool":
            return str(message.get("content") or "")
        content = message.get("content")
        if isinstance(content, list):
            for block in reversed(content):
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    inner = block.get("content")
                    if isinstance(inner, list):
                        return " ".join(str(b.get("text", "")) for b in inner)
                    return str(inner or "")
    return ""


def result_content(envelope: str) -> str:
    """An envelope's content lines (between its tags; a note the runtime added after the
    closing tag is not content), or the text as it is."""
    lines = envelope.splitlines()
    ends = [i for i, line in enumerate(lines) if line.startswith("[end:")]
    if len(lines) >= 2 and lines[0].startswith("[") and ends:
        return "\n".join(lines[1 : ends[-1]])
    return envelope


def _first_valid(envelope: str) -> str | None:
    for line in envelope.splitlines():
        if line.startswith("valid values: "):
            try:
                values = json.loads(line[len("valid values: ") :])
            except ValueError:
                return None
            return str(values[0]) if values else None
    return None


def _hint(envelope: str) -> str:
    for line in envelope.splitlines():
        if line.startswith("hint: "):
            return line[len("hint: ") :]
    return result_content(envelope)


def resolve(step: Step, fmt: str, body: dict[str, Any]) -> Step:
    """The step that answers this request: its first matching case, placeholders filled."""
    offered = offered_tools(fmt, body)
    result = last_result(fmt, body)
    for case in step.cases:
        if case.tools is not None and case.tools != bool(offered):
            continue
        if case.offered is not None and case.offered not in offered:
            continue
        if case.result_has is not None and case.result_has not in result:
            continue
        shown = json.dumps(body.get("tools")) + system_text(fmt, body)
        if case.described is not None and case.described not in shown:
            continue
        if case.user_has is not None and case.user_has not in last_user_text(fmt, body):
            continue
        return resolve(case.then, fmt, body)
    if any(tc.name == "$suggested" for tc in step.tool_calls):
        suggested = _first_valid(result)
        if suggested is None:
            return msgspec.structs.replace(step, tool_calls=[], text=_hint(result))
        calls = [
            msgspec.structs.replace(tc, name=suggested) if tc.name == "$suggested" else tc
            for tc in step.tool_calls
        ]
        step = msgspec.structs.replace(step, tool_calls=calls)
    if "{last_result}" in step.text:
        step = msgspec.structs.replace(
            step, text=step.text.replace("{last_result}", result_content(result))
        )
    return step


def output_schema(fmt: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema the request holds the output to, if any."""
    if fmt == "ollama":
        found = body.get("format")
    else:
        found = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
    return found if isinstance(found, dict) else None


def as_step_object(step: Step, schema: dict[str, Any]) -> Step:
    """``step`` as a grammar-held server answers it: one object of the schema, as text.

    A call becomes ``{"name": ..., "arguments": ...}`` (the first call only: the schema
    allows one); text becomes the answer alternative (the last one, named by its const).
    """
    if step.status is not None or step.hang:
        return step
    if step.tool_calls:
        call = step.tool_calls[0]
        obj: dict[str, Any] = {"name": call.name, "arguments": call.arguments or {}}
    else:
        answer = (schema.get("oneOf") or [{}])[-1]
        name = answer.get("properties", {}).get("name", {}).get("const", "reply")
        obj = {"name": name, "arguments": {"text": step.text}}
    return msgspec.structs.replace(step, text=json.dumps(obj), tool_calls=[])

"""Structured steps: each model step is one JSON object, a call of an offered tool or the answer.

A small local model given tools often writes a call as prose ("you can call the
clock function with ..."), a Python snippet, or markup instead of making it; asked
for the answer it may describe the call again. Model servers that run local models
(llama.cpp, Ollama, LM Studio, vLLM) can hold the output to a JSON schema with a
grammar. With structured steps on, the request keeps its tools and also carries
:func:`schema`: exactly one of ``{"name": <offered tool>, "arguments": <its
parameters>}`` or ``{"name": "reply", "arguments": {"text": <the answer>}}``. The
answer cannot be markup or a narrated call, a name cannot be invented, and
arguments follow the tool's schema. :func:`read` turns the object back into a plain
answer or a tool call, so nothing above the model client knows the step was
structured; :class:`ReplyText` streams the answer's text out of the JSON as it is
written.

The object has the shape the 1.5B model itself wrote when it wrote a call as text
(``{"name": ..., "arguments": ...}``). A tool's ``act_summary`` becomes optional and
last in the grammar (a grammar writes required keys first: the model wrote the
summary and stopped before ``zone``); the dispatcher's healing fills it when absent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any, Final, Literal
from urllib.parse import urlsplit

import msgspec

from chalie.net.loopback import is_loopback
from chalie.providers.types import ModelResponse, ToolCallPart

Structured = Literal["auto", "on", "off"]
# The wires whose servers take a JSON schema for the output (OpenAI's response_format,
# Ollama's format).
STRUCTURED_WIRES: Final = frozenset({"openai", "ollama"})
REPLY: Final = "reply"
SUMMARY: Final = "act_summary"


def enabled(setting: Structured, provider: str, base_url: str) -> bool:
    """Whether steps are structured: "on" on a wire that can; "auto" where the model server
    runs on this machine (where small models are served: llama.cpp, Ollama, LM Studio)."""
    if provider not in STRUCTURED_WIRES or setting == "off":
        return False
    if setting == "on":
        return True
    return is_loopback(urlsplit(base_url).hostname or "")


def reply_name(offered: Collection[str]) -> str:
    """The answer's name in the step object: "reply", unless a tool is called that."""
    name = REPLY
    while name in offered:
        name += "_to_user"
    return name


def _arguments(parameters: Any) -> dict[str, Any]:
    """A tool's parameters as the grammar takes them: act_summary optional and last."""
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        return {"type": "object"}
    if SUMMARY not in (parameters.get("properties") or {}):
        return parameters
    props = dict(parameters["properties"])
    summary = props.pop(SUMMARY, None)
    if summary is not None:
        props[SUMMARY] = summary
    required = [r for r in parameters.get("required") or () if r != SUMMARY and r in props]
    out = {**parameters, "properties": props}
    if required:
        out["required"] = required
    else:
        out.pop("required", None)
    return out


def schema(tools: Collection[Mapping[str, Any]]) -> dict[str, Any]:
    """One step's output: a call of one of ``tools`` (descriptors: name, input_schema) or
    the answer."""
    names = [str(t["name"]) for t in tools]
    alternatives = [
        _step(str(t["name"]), _arguments(t.get("input_schema") or {"type": "object"}))
        for t in tools
    ]
    text = {"type": "string", "minLength": 1}
    answer = {
        "type": "object",
        "properties": {"text": text},
        "required": ["text"],
        "additionalProperties": False,
    }
    alternatives.append(_step(reply_name(names), answer))
    return {"oneOf": alternatives}


def _step(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


_FENCE: Final = re.compile(r"\A\s*```[A-Za-z]*[ \t]*\n")


def unfenced(text: str) -> str:
    """``text`` without a Markdown code fence around it: where nothing holds the output to
    the step object (a free step), the 1.5B model wrote it in a ```json fence."""
    opened = _FENCE.match(text)
    if opened is None:
        return text
    inner = text[opened.end() :].rstrip()
    return inner[:-3] if inner.endswith("```") else inner


_DECODER: Final = json.JSONDecoder()
_TRAILING_SCAN: Final = 8_000  # a step object is short; prose before it is not searched further


def trailing_object(text: str) -> dict[str, Any] | None:
    """The step object a free step's text ends with, after words of its own: "To say
    'good morning' in Spanish, you would say: ```json {"name": "reply", ...}```" (the
    1.5B model, shown the compact listing); None when the text does not end with one."""
    tail = text.rstrip()
    if tail.endswith("```"):
        tail = tail[:-3].rstrip()
    if not tail.endswith("}"):
        return None
    start = max(0, len(tail) - _TRAILING_SCAN)
    at = tail.find("{", start)
    while at >= 0:
        try:
            value, end = _DECODER.raw_decode(tail, at)
        except (ValueError, RecursionError):
            value, end = None, -1
        if end == len(tail):
            step_like = isinstance(value, dict) and isinstance(value.get("name"), str)
            return value if step_like else None
        at = tail.find("{", at + 1)
    return None


def read(response: ModelResponse, offered: Collection[str], new_id: str) -> ModelResponse:
    """The step object as the plain answer or the tool call it holds; a response that is
    not such an object (cut off by the token limit, or a server that ignored the schema)
    is returned as it came (the rescue and the answer check read it as text)."""
    if response.tool_calls or not response.text.strip():
        return response
    try:
        step = json.loads(unfenced(response.text))
    except (ValueError, RecursionError):
        step = trailing_object(response.text)
        if step is None:
            return response
    if not isinstance(step, dict) or not isinstance(step.get("name"), str):
        return response
    name, arguments = step["name"], step.get("arguments")
    if not isinstance(arguments, dict):
        return response
    if name == reply_name(offered):
        text = arguments.get("text")
        if not isinstance(text, str):
            return response
        return msgspec.structs.replace(response, text=text, stop="final")
    if name not in offered:
        # Only a free step can name another tool (a grammar holds a structured one to
        # the offered names): left as text, the answer check refuses the call written
        # out, and the retry is held to the offered tools.
        return response
    call = ToolCallPart(id=new_id, name=name, arguments=arguments)
    return msgspec.structs.replace(response, text="", tool_calls=(call,), stop="tool_calls")


# The grammar writes the name first, then the answer's one key: its text starts after this.
_REPLY_START: Final = r'\A\s*\{\s*"name"\s*:\s*"%s"\s*,\s*"arguments"\s*:\s*\{\s*"text"\s*:\s*"'
_NAME: Final = re.compile(r'\A\s*\{\s*"name"\s*:\s*"([^"]*)"')
_LONGEST_START: Final = 200  # whitespace the grammar allows between the keys, and more
_ESCAPES: Final = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r"}
_ESCAPES["t"] = "\t"


class ReplyText:
    """Streams the answer's text out of a step object as the model writes it; a call shows
    nothing; text that is not an object at all (the server ignored the schema) shows as is."""

    def __init__(self, offered: Collection[str]) -> None:
        self._reply = reply_name(offered)
        self._start = re.compile(_REPLY_START % re.escape(self._reply))
        self._raw = ""
        self._at = -1  # where the text's next unread character is, once it has started
        self._done = False
        self._surrogate = ""
        self._plain = False

    def feed(self, delta: str) -> str:
        if self._done:
            return ""
        self._raw += delta
        if not self._plain and self._at < 0 and self._raw.lstrip().startswith("`"):
            # A fenced object (a free step): read past the fence's line when an object
            # follows it; anything else in a fence is text, shown as written.
            head = self._raw.lstrip()
            fence = _FENCE.match(head)
            if fence is None:
                if (head.startswith("```") or len(head) < 3) and "\n" not in head:
                    return ""  # the fence's line has not ended yet
            else:
                body = head[fence.end() :].lstrip()
                if not body:
                    return ""
                if body.startswith("{"):
                    self._raw = body
        if self._plain or (self._raw.strip() and not self._raw.lstrip().startswith("{")):
            # Not a step object: a server that ignored the schema. Its text goes on as
            # written (the rescue and the answer check read it).
            shown = delta if self._plain else self._raw
            self._plain = True
            return shown
        if self._at < 0:
            found = self._start.match(self._raw)
            if found is None:
                named = _NAME.match(self._raw)
                if (named and named.group(1) != self._reply) or len(self._raw) > _LONGEST_START:
                    self._done = True
                return ""
            self._at = found.end()
        return self._decode()

    def _decode(self) -> str:
        out: list[str] = []
        raw, i = self._raw, self._at
        while i < len(raw):
            ch = raw[i]
            if ch == '"':
                self._done = True
                break
            if ch != "\\":
                out.append(ch)
                i += 1
                continue
            if i + 1 >= len(raw):
                break  # the escape's next character has not come yet
            kind = raw[i + 1]
            if kind != "u":
                out.append(_ESCAPES.get(kind, kind))
                i += 2
                continue
            if i + 6 > len(raw):
                break
            unit = raw[i : i + 6]
            i += 6
            code = int(unit[2:], 16) if re.fullmatch(r"\\u[0-9a-fA-F]{4}", unit) else 0xFFFD
            if 0xD800 <= code < 0xDC00:
                self._surrogate = unit
                continue
            if self._surrogate and 0xDC00 <= code < 0xE000:
                out.append(json.loads(f'"{self._surrogate}{unit}"'))
            else:
                out.append(chr(code) if not 0xDC00 <= code < 0xE000 else "\ufffd")
            self._surrogate = ""
        self._at = i
        return "".join(out)

"""Tool calls a model wrote as text, read back as calls; and the stream held while one may come.

Many local models and servers (llama.cpp, Ollama, LM Studio templates) never
return structured ``tool_calls``: the model writes the call into its content
as bare JSON, in a ```json fence, between ``<tool_call>`` tags, or with the
template's doubled braces ``{{"name": ...}}``. :func:`rescue` finds such a
call when a response carries no structured one, and keeps the text around it
as text. A call found inside prose is taken only when it names an offered
tool; a message that is nothing but a call (bare, fenced or tagged) is taken
whatever it names, since the dispatcher refuses a name the turn may not call
(and answers it with the closest real tools).

:class:`HeldText` sits between the stream and the user: from a line that
starts like a call, text is held until the answer is complete, so JSON that
turns out to be a call is never shown as an answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

Rescue = Literal["auto", "off"]
# The wires whose models commonly write calls as text ("auto" means on for these).
RESCUE_WIRES: Final = frozenset({"openai", "ollama"})
MAX_RESCUE_CHARS: Final = 200_000
MAX_CALLS: Final = 32
MAX_DEPTH: Final = 64  # brackets; a call's arguments nest a few levels, never dozens

_TAG: Final = re.compile(
    r"<(tool_call|tool_calls|function_call|functioncall)>\s*(.*?)\s*(?:</\1>|$)", re.S | re.I
)
_FENCE: Final = re.compile(r"```[ \t]*([A-Za-z_]*)[ \t]*\n?(.*?)(?:```|$)", re.S)
# How a call may begin on a line: what HeldText holds back from.
MARKERS: Final = ("{", "[", "```", "<tool_call", "<function", "<functioncall")
_NAME_KEYS: Final = ("name", "tool", "tool_name", "function", "recipient_name")
_ARG_KEYS: Final = ("arguments", "parameters", "args", "input", "tool_input", "params")


def enabled(setting: Rescue, provider: str) -> bool:
    return setting == "auto" and provider in RESCUE_WIRES


@dataclass(frozen=True)
class TextCall:
    """One call read from text; ``arguments`` is None when they are not an object (see raw).

    ``explicit``: the arguments sat under an arguments key ("arguments", "parameters", ...),
    so the JSON is call-shaped even when its name is not one we know.
    """

    name: str
    arguments: dict[str, Any] | None
    raw: str = ""
    explicit: bool = True


@dataclass(frozen=True)
class Rescued:
    calls: tuple[TextCall, ...]
    text: str  # what the model wrote around the calls


def loads(text: str) -> Any:
    """JSON, or the same with a template's doubled braces collapsed or a line comment
    left out (``"start": "...", // start of tomorrow``); ValueError otherwise.

    Nesting deeper than :data:`MAX_DEPTH` is refused before parsing (the parser
    would recurse until the interpreter's limit).
    """
    if _too_deep(text):
        raise ValueError("nested too deeply")
    try:
        return json.loads(text)
    except ValueError:
        uncommented = _LINE_COMMENT.sub("", text)
        if "{{" not in text and "}}" not in text and uncommented == text:
            raise
    if uncommented != text:
        try:
            return json.loads(uncommented)
        except ValueError:
            text = uncommented
    return json.loads(text.replace("{{", "{").replace("}}", "}"))


# A comment a model writes after a JSON value: whitespace, //, to the end of the line, with
# no quote after it (so "http://..." inside a string is not one).
_LINE_COMMENT: Final = re.compile(r'[ \t]+//[^"\n]*$', re.M)


def _too_deep(text: str) -> bool:
    """Whether brackets in ``text`` open deeper than MAX_DEPTH (strings not excluded: a bound)."""
    depth = 0
    for ch in text:
        if ch in "{[":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif ch in "}]":
            depth = max(0, depth - 1)
    return False


def _as_call(value: Any) -> TextCall | None:
    if not isinstance(value, dict):
        return None
    inner = value.get("function")
    if isinstance(inner, dict):  # {"type": "function", "function": {"name", "arguments"}}
        value = {**inner, **{k: v for k, v in value.items() if k != "function"}}
    if _is_schema(value.get("parameters")):
        return None  # a tool's definition recited, not a call of it
    name = next((value[k] for k in _NAME_KEYS if isinstance(value.get(k), str)), None)
    if name is None:
        if len(value) == 1:  # {"calculator": {"expression": ...}}
            only, body = next(iter(value.items()))
            if isinstance(body, dict) and re.fullmatch(r"[A-Za-z_][\w.-]{0,127}", only):
                return TextCall(only, body, explicit=False)
        return None
    name = name.strip()
    if not name or len(name) > 128:
        return None
    key = next((k for k in _ARG_KEYS if k in value), None)
    args: Any = value[key] if key is not None else None
    if key is None:  # {"name": "clock", "zone": "UTC"}: the rest are the arguments
        args = {k: v for k, v in value.items() if k not in (*_NAME_KEYS, "type", "id")}
    explicit = key is not None
    if isinstance(args, str):
        try:
            args = loads(args) if args.strip() else {}
        except ValueError:
            return TextCall(name, None, args[:2000], explicit)
    if isinstance(args, dict):
        return TextCall(name, args, "", explicit)
    return TextCall(name, None, json.dumps(args)[:2000], explicit)


def _is_schema(value: Any) -> bool:
    return isinstance(value, dict) and (
        value.get("type") == "object" or isinstance(value.get("properties"), dict)
    )


# A tool named as the one to call: "use the `calendar` function", "call clock with".
_NAMED: Final = re.compile(
    r"\b(?:call|use|invoke|run)\w*\s+(?:the\s+)?[`'\"*]*([A-Za-z_][\w-]{0,127})[`'\"*]*", re.I
)


def _described(text: str, offered: Collection[str]) -> Rescued | None:
    """A call described in prose: exactly one offered tool named, and exactly one JSON
    object, its arguments ("use the `calendar` function with the following parameters:
    ```json {"action": "list", ...}```", as the real 1.5B model wrote)."""
    names = {m.group(1) for m in _NAMED.finditer(text)} & set(offered)
    if len(names) != 1:
        return None
    objects = [
        (start, end, value)
        for start, end, value in _objects(text)
        if isinstance(value, dict) and value and not _is_schema(value)
    ]
    if len(objects) != 1:
        return None
    start, end, value = objects[0]
    if any(k in value for k in _NAME_KEYS) or "function" in value:
        return None  # call-shaped after all, and not taken above: not ours to guess
    outside = _FENCE.sub("", text[:start] + text[end:]).strip()
    return Rescued((TextCall(names.pop(), value, explicit=False),), outside)


def _calls(value: Any, offered: Collection[str]) -> list[TextCall] | None:
    """The calls a parsed JSON value stands for, or None when it is not call-shaped.

    A call naming a tool that is not offered counts only with explicit arguments.
    """
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    if not items or len(items) > MAX_CALLS:
        return None
    found = [_as_call(item) for item in items]
    calls = [c for c in found if c is not None and (c.explicit or c.name in offered)]
    return calls if len(calls) == len(items) else None


def _objects(text: str) -> Iterator[tuple[int, int, Any]]:
    """Every top-level JSON object or array in ``text``: (start, end, value)."""
    decoder = json.JSONDecoder()
    if _too_deep(text):
        return
    i = 0
    while i < len(text):
        if text[i] not in "{[":
            i += 1
            continue
        found = None
        try:
            value, end = decoder.raw_decode(text, i)
            found = (i, end, value)
        except ValueError:
            if text.startswith("{{", i):
                close = text.find("}}", i)
                if close > 0:
                    try:
                        found = (i, close + 2, loads(text[i : close + 2]))
                    except ValueError:
                        found = None
        if found is None:
            i += 1
            continue
        yield found
        i = found[1]


def rescue(text: str, offered: Collection[str]) -> Rescued | None:
    """The calls written in ``text``, or None when it holds none we may take."""
    if not text or len(text) > MAX_RESCUE_CHARS:
        return None
    whole = text.strip()
    # A message that is nothing but a call (bare, fenced or tagged): taken whatever it names.
    for pattern in (_TAG, _FENCE):
        spans = list(pattern.finditer(text))
        calls: list[TextCall] = []
        for match in spans:
            body = match.group(2).strip()
            try:
                found = _calls(loads(body), offered)
            except ValueError:
                found = None
            if found:
                calls.extend(found)
        if calls:
            outside = pattern.sub("", text).strip()
            if outside and not any(c.name in offered for c in calls):
                return None  # a fenced example inside prose, naming nothing we offer
            return Rescued(tuple(calls[:MAX_CALLS]), outside)
    try:
        found = _calls(loads(whole), offered)
    except ValueError:
        found = None
    if found:
        return Rescued(tuple(found), "")
    # Inside prose: only a call naming an offered tool.
    for start, end, value in _objects(text):
        found = _calls(value, offered)
        if found and all(c.name in offered for c in found):
            outside = (text[:start] + text[end:]).strip()
            return Rescued(tuple(found), outside)
    return _described(text, offered)


class HeldText:
    """Passes streamed text on, holding back from the first line that starts like a call."""

    def __init__(self) -> None:
        self._held: list[str] = []
        self._pending = ""  # the current line's start, while it may still become a marker
        self._line_start = True
        self.holding = False

    def feed(self, text: str) -> str:
        """What may be shown now."""
        if self.holding:
            self._held.append(text)
            return ""
        out: list[str] = []
        for i, ch in enumerate(text):
            if not self._line_start:
                out.append(ch)
                self._line_start = ch == "\n"
                continue
            self._pending += ch
            start = self._pending.lstrip()
            if not start:
                if ch == "\n":
                    out.append(self._pending)
                    self._pending = ""
                continue
            if start.startswith(MARKERS):
                self.holding = True
                self._held.extend((self._pending, text[i + 1 :]))
                self._pending = ""
                break
            if any(m.startswith(start) for m in MARKERS):
                continue  # may still become a marker
            out.append(self._pending)
            self._pending = ""
            self._line_start = ch == "\n"
        return "".join(out)

    def release(self) -> str:
        """Everything held back (the answer held no call after all)."""
        text = self._pending + "".join(self._held)
        self._held.clear()
        self._pending = ""
        self._line_start = True
        self.holding = False
        return text

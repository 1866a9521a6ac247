"""Rendering a ToolResult into the one envelope the model sees, and reading it back.

Shape::

    [weather(status=success)]
    {"location":"Valletta, MT"}
    [end:weather]

    [memory(status=error, code=no-query-or-location, action=recall)]
    recall requires either a query or a location.
    hint: pass query= to search by topic.
    valid values: ["a","b"]
    [end:memory]

Escaping rule (the only one): envelope tags are whole lines that begin with
``[``. In every content line (body, message, hint), a line that begins with
zero or more backslashes followed by ``[`` gets one more backslash in front.
So no content line can ever begin with ``[``, and the first line after the
opening tag that begins with ``[`` is the closing tag: a body holding
``[end:weather]`` renders as ``\\[end:weather]`` and cannot close or forge an
envelope. Reading strips exactly one backslash from such lines, so the rule
is lossless. Carriage returns and other line breaks are normalised to
``\\n`` only where they would start a new line (``str.splitlines`` breaks).

Meta values in the opening tag are written bare when they are made only of
``[A-Za-z0-9_.:/@+-]`` (and are not ``true``/``false``/``null`` or a number
lookalike), otherwise as a JSON string whose brackets, parentheses, commas
and ``=`` are \\u-escaped, so the opening tag never contains structure
characters except its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final, NamedTuple

import msgspec

from chalie.result import Scalar, ToolResult

TOOL_NAME: Final = re.compile(r"^_?[a-z][a-z0-9_]{0,127}$")
_BARE: Final = re.compile(r"^[A-Za-z_/@+][A-Za-z0-9_.:/@+-]*$")
_NEEDS_ESCAPE: Final = re.compile(r"^(\\*)\[", re.MULTILINE)
_ESCAPED: Final = re.compile(r"^\\(\\*)\[", re.MULTILINE)
_OPEN: Final = re.compile(r"^\[(_?[a-z][a-z0-9_]*)\((.*)\)\]$")
_PAIR: Final = re.compile(r'\s*([a-z][a-z0-9_]*)=("(?:[^"\\]|\\.)*"|[^,]*)\s*(?:,|$)')
_TAG_SAFE: Final = str.maketrans(
    {
        "[": "\\u005b",
        "]": "\\u005d",
        "(": "\\u0028",
        ")": "\\u0029",
        ",": "\\u002c",
        "=": "\\u003d",
        "\u2028": "\\u2028",
        "\u2029": "\\u2029",
    }
)


def _lines(text: str) -> list[str]:
    # splitlines breaks on \r, \x0b, \x1c, \u2028 ... too: every one of them
    # could start a visual line, so each becomes a real line we can escape.
    return text.splitlines() or [""]


def escape_content(text: str) -> str:
    """Apply the escaping rule to one block of content text."""
    if text.isprintable() and not text.startswith(("[", "\\")):
        return text  # one line (no break is printable) that needs no backslash: as it is
    return _NEEDS_ESCAPE.sub(lambda m: "\\" + m.group(1) + "[", "\n".join(_lines(text)))


def unescape_content(text: str) -> str:
    return _ESCAPED.sub(lambda m: m.group(1) + "[", text)


def _meta_value(value: Scalar) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if _BARE.match(value) and value not in ("true", "false", "null"):
        return value
    return json.dumps(value, ensure_ascii=False).translate(_TAG_SAFE)


def opening_tag(tool: str, result: ToolResult, meta: Mapping[str, Scalar] | None = None) -> str:
    """The opening tag; ``meta`` (default: the result's own) is the meta it shows."""
    parts = [f"status={result.status}"]
    if result.code:
        parts.append(f"code={result.code}")
    for k, v in (result.meta if meta is None else meta).items():
        parts.append(f"{k}={_meta_value(v)}")
    return f"[{tool}({', '.join(parts)})]"


def render(tool: str, result: ToolResult, meta: Mapping[str, Scalar] | None = None) -> str:
    """The envelope for one call. ``tool`` must be a valid tool name.

    ``meta``: the meta to show instead of the result's own (checked by the caller, as
    :meth:`ToolResult.with_meta` would), so adding a key costs no copy of the result.
    """
    if not TOOL_NAME.match(tool):
        raise ValueError(f"invalid tool name for an envelope: {tool!r}")
    out = [opening_tag(tool, result, meta), escape_content(result.body)]
    if result.status == "error":
        if result.hint:
            out.append(escape_content("hint: " + result.hint))
        if result.valid_values is not None:
            vals = msgspec.json.encode(list(result.valid_values)).decode()
            out.append(escape_content("valid values: " + vals))
    out.append(f"[end:{tool}]")
    return "\n".join(out)


class ParsedEnvelope(NamedTuple):
    tool: str
    attrs: dict[str, Scalar]
    content: str  # unescaped; for errors includes the hint/valid-values lines


class EnvelopeSyntaxError(ValueError):
    pass


def _parse_value(raw: str) -> Scalar:
    raw = raw.strip()
    if raw.startswith('"'):
        return str(json.loads(raw))
    if raw in ("true", "false", "null") or re.match(r"^-?[0-9]", raw):
        return json.loads(raw)  # type: ignore[no-any-return]
    return raw


def parse(text: str) -> list[ParsedEnvelope]:
    """Read envelopes back (clients, tests). Strict: anything else is an error."""
    lines = text.split("\n")
    found: list[ParsedEnvelope] = []
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            raise EnvelopeSyntaxError(f"line {i + 1}: expected an opening tag")
        tool, inner = m.group(1), m.group(2)
        attrs: dict[str, Scalar] = {}
        pos = 0
        while pos < len(inner):
            pm = _PAIR.match(inner, pos)
            if not pm or pm.end() == pos:
                raise EnvelopeSyntaxError(f"line {i + 1}: bad attribute at {pos}")
            attrs[pm.group(1)] = _parse_value(pm.group(2))
            pos = pm.end()
        j = i + 1
        while j < len(lines) and not lines[j].startswith("["):
            j += 1
        if j >= len(lines) or lines[j] != f"[end:{tool}]":
            raise EnvelopeSyntaxError(f"envelope {tool!r} opened on line {i + 1} is not closed")
        found.append(ParsedEnvelope(tool, attrs, unescape_content("\n".join(lines[i + 1 : j]))))
        i = j + 1
    return found

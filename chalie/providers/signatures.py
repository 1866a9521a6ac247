"""Tools as compact signatures in the system prompt, for models held to structured steps.

A chat template renders the request's tools as their whole JSON schema: with the
three pinned tools and one seeded tool the 1.5B model's first request was 906
prompt tokens, most of them braces, quotes and ``"type": "string"``. Where every
step is held to a step object (:mod:`chalie.providers.steps`) the grammar already
carries each tool's exact schema, so the model only needs to know which tools there
are, what each is for, and what its arguments are called. :func:`listing` writes
one line a tool::

    - weather(place?, days?: integer, units?: imperial|metric): Weather: ...

A name without ``?`` is required; a bare name is a string; ``a|b`` is an enum;
``[x]`` a list. ``act_summary`` and ``async`` are left out: the grammar allows them,
the dispatcher's healing fills the summary, and the model never needed them.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any, Final

from chalie.providers.steps import SUMMARY

# Arguments the model is not shown: filled by the framework, or rarely wanted.
HIDDEN: Final = frozenset({SUMMARY, "async"})
# A parameter's description is shown when it is this short (longer ones cost more than
# they tell a small model).
SHORT_DESCRIPTION: Final = 60
TOOLS_HEADING: Final = "Tools:"
_LISTED: Final = re.compile(r"^- ([^\s(]+)\(", re.MULTILINE)
_SCALARS: Final = {"integer": "integer", "number": "number", "boolean": "boolean"}


def _type(schema: Any) -> str:
    """A parameter's type in a few characters ("" for a plain string)."""
    if not isinstance(schema, Mapping):
        return ""
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return "|".join(str(v) for v in enum)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "array":
        inner = _type(schema.get("items")) or "string"
        return f"[{inner}]"
    if kind == "object":
        return "object"
    return _SCALARS.get(str(kind), "")


def _parameter(name: str, schema: Any, required: bool) -> str:
    kind = _type(schema)
    text = name + ("" if required else "?") + (f": {kind}" if kind else "")
    description = schema.get("description") if isinstance(schema, Mapping) else None
    if isinstance(description, str) and 0 < len(description) <= SHORT_DESCRIPTION:
        text += f" ({description.strip()})"
    return text


def signature(tool: Mapping[str, Any]) -> str:
    """One tool as ``- name(arguments): description``."""
    schema = tool.get("input_schema")
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    required = set(schema.get("required") or ()) if isinstance(schema, Mapping) else set()
    params = []
    if isinstance(props, Mapping):
        # Required arguments first: the order the model is shown is the order it writes.
        ordered = sorted(props.items(), key=lambda item: item[0] not in required)
        params = [
            _parameter(str(name), spec, name in required)
            for name, spec in ordered
            if name not in HIDDEN
        ]
    description = " ".join(str(tool.get("description") or "").split())
    return f"- {tool['name']}({', '.join(params)}): {description}".rstrip(": ")


def listing(tools: Collection[Mapping[str, Any]], reply: str) -> str:
    """The tools of a step and how to call one or answer, for the end of the system prompt."""
    lines = [
        "Each reply is one JSON object: "
        '{"name": <a tool>, "arguments": {...}} to call a tool, or '
        f'{{"name": "{reply}", "arguments": {{"text": <your answer>}}}} to answer the user.',
        TOOLS_HEADING,
    ]
    lines.extend(signature(t) for t in tools)
    return "\n".join(lines)


def listed(system: str) -> list[str]:
    """The names of the tools a system prompt lists (what a model server sees offered:
    the scripted model server and the benchmark's recorder read it)."""
    _, heading, tools = system.rpartition("\n" + TOOLS_HEADING + "\n")
    return _LISTED.findall(tools) if heading else []

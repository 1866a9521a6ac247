"""Tools: call any tool from a form made from its argument schema, as the signed-in owner on
the chat channel, through the gate (the operation ``tool_call``); the answer and its trail
row are shown. The form's fields are ``arguments.NAME``, each read as typed text
(:mod:`chalie.calls.typed_text`), as the CLI's ``key=value`` is."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chalie.brain.operations import Backend
from chalie.brain.pages.page import Operations, Page
from chalie.calls.schema_types import json_types


@dataclass(frozen=True)
class Field:
    """One argument's input: ``kind`` is select, number, checkbox-like select, text or json."""

    name: str
    kind: str
    required: bool
    description: str
    options: tuple[str, ...] = ()


def fields(schema: Mapping[str, Any]) -> list[Field]:
    """The form's inputs for a tool's argument schema, required ones first."""
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    defs = schema.get("$defs")
    out = []
    for name, prop in props.items():
        if name == "async" or not isinstance(prop, dict):
            continue
        types = json_types(prop, defs)
        values = prop.get("enum")
        if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
            kind, options = "select", tuple(values)
        elif types and types <= {"boolean", "null"}:
            kind, options = "select", ("true", "false")
        elif types and types <= {"integer", "number", "null"}:
            kind, options = "number", ()
        elif "string" in types or not types:
            kind, options = "text", ()
        else:
            kind, options = "json", ()
        description = str(prop.get("description") or "")[:300]
        # act_summary: written for the call when left empty ("NAME called from the Brain").
        out.append(
            Field(name, kind, name in required and name != "act_summary", description, options)
        )
    return sorted(out, key=lambda f: (not f.required, f.name == "act_summary", f.name))


async def load(brain: Operations, query: Mapping[str, str]) -> dict[str, Any]:
    tools = await brain.op(Backend.tools)
    chosen = query.get("tool", "")
    tool = next((t for t in tools if t.name == chosen), None)
    return {
        "tools": tools,
        "tool": tool,
        "fields": fields(tool.input_schema) if tool is not None else [],
    }


PAGE = Page("tools", "Tools", "tools.html", load, shows_results=True)

"""The JSON types a property schema admits, and whether a value is of one: the reading that
healing (a model's call) and typed text (a person's ``key=value``, a dashboard field) share.
Imports nothing of the runtime, so a CLI command can use it and stay quick."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def json_types(spec: Any, defs: Mapping[str, Any] | None = None, depth: int = 0) -> set[str]:
    """The JSON types a property schema admits: ``type``, ``anyOf``/``oneOf`` (msgspec's
    Optional), ``enum``/``const`` values, and local ``#/$defs/`` references in ``defs``."""
    if not isinstance(spec, Mapping) or depth > 8:
        return set()
    found: set[str] = set()
    kind = spec.get("type")
    if isinstance(kind, str):
        found.add(kind)
    elif isinstance(kind, list):
        found.update(k for k in kind if isinstance(k, str))
    for option in (*spec.get("anyOf", ()), *spec.get("oneOf", ())):
        found |= json_types(option, defs, depth + 1)
    ref = spec.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and defs:
        found |= json_types(defs.get(ref.rsplit("/", 1)[-1]), defs, depth + 1)
    values = spec["enum"] if isinstance(spec.get("enum"), list) else []
    if "const" in spec:
        values = [spec["const"]]
    if values and not found:
        found.update(json_type(v) for v in values)
    return found


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, Mapping) else "other"


def fits(value: Any, types: set[str]) -> bool:
    """Whether ``value`` is of one of the JSON ``types`` (an integer is a number too)."""
    kind = json_type(value)
    return kind in types or (kind == "integer" and "number" in types)

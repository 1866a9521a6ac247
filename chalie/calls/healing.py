"""Healing a model's tool-call arguments where its intent is unambiguous, and saying so.

Small local models get the shape of a call wrong in a few recurring ways:
the arguments as a bare array, a JSON object or array sent as a string, a
number or a boolean as a string, one value where an array is expected, a
parameter under another name, no ``act_summary`` (or its description copied).
Each rule here repairs exactly one of these, only when a single reading
exists, and returns a note for the trail. Anything else is left for
pre-validation to refuse, with :func:`shape` in its hint.

Healing runs before pre-validation, so the permission gate classifies the
healed arguments: a healing changes how a value is written, never which
action is asked for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from chalie.ability import Ability
from chalie.calls.schema_types import fits, json_types
from chalie.calls.schema_types import json_type as json_type  # dispatch names it through healing
from chalie.gate.display import one_line
from chalie.wire.tool_names import ACT_SUMMARY_DESCRIPTION, FRAMEWORK_FIELDS

MAX_SUMMARY: Final = 200
SUMMARY_ARG_CHARS: Final = 40
_NUMBER: Final = re.compile(r"^\s*-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\s*$")
_INTEGER: Final = re.compile(r"^\s*-?\d+\s*$")
_PLACEHOLDER: Final = re.compile(r"^\s*<[^<>]*>\s*$")
FRAMEWORK: Final = FRAMEWORK_FIELDS


class Healed(msgspec.Struct, frozen=True):
    """The arguments after healing, and one note per change (empty when nothing changed)."""

    arguments: dict[str, Any]
    notes: tuple[str, ...] = ()


def _properties(cls: type[Ability]) -> Mapping[str, Any]:
    props = cls.parameters.get("properties", {})
    return props if isinstance(props, Mapping) else {}


def _required(cls: type[Ability]) -> list[str]:
    required = cls.parameters.get("required", [])
    return [r for r in required if isinstance(r, str) and r not in FRAMEWORK]


def heal_bare(cls: type[Ability], value: Any) -> Healed | None:
    """Arguments sent as a bare value (``["clock"]``): the object, when one reading exists.

    One reading exists when the tool has exactly one required parameter and
    the value has that parameter's type. None otherwise (the call is refused
    with the tool's shape).
    """
    required = _required(cls)
    if len(required) != 1:
        return None
    name = required[0]
    if isinstance(value, Mapping) or not fits(value, json_types(_properties(cls).get(name))):
        return None
    kind = "array" if isinstance(value, list) else json_type(value)
    return Healed({name: value}, (f"a bare {kind} was read as {name}",))


# Per ability class: its parameters mapping (to notice a change) and each property's types.
_TYPES_CACHE: dict[type[Ability], tuple[Any, dict[str, set[str]]]] = {}
_TYPES_CACHE_MAX: Final = 4096


def _property_types(cls: type[Ability]) -> dict[str, set[str]]:
    """Each declared property's JSON types, worked out once per class (and parameters)."""
    params = cls.parameters
    found = _TYPES_CACHE.get(cls)
    if found is not None and found[0] is params:
        return found[1]
    types = {name: json_types(spec) for name, spec in _properties(cls).items()}
    if len(_TYPES_CACHE) >= _TYPES_CACHE_MAX:
        _TYPES_CACHE.clear()  # classes made at run time (MCP proxies) cannot grow it for good
    _TYPES_CACHE[cls] = (params, types)
    return types


# The JSON type names a Python value of this exact type has (bool before int: its own type).
_FITS: Final[dict[type, tuple[str, ...]]] = {
    str: ("string",),
    bool: ("boolean",),
    int: ("integer", "number"),
    float: ("number",),
    type(None): ("null",),
    list: ("array",),
    dict: ("object",),
}


def heal(cls: type[Ability], params: Mapping[str, Any]) -> Healed:
    """The ability's parameters (framework fields taken out) with every unambiguous fix."""
    props = _properties(cls)
    aliases = cls.aliases
    out: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in params.items():
        target = key
        if key not in props:
            real = aliases.get(key)
            if real is not None and real in props and real not in params and real not in out:
                target = real
                notes.append(f"parameter {one_line(key, 40)!r} was read as {real!r}")
        out[target] = value
    declared = _property_types(cls)
    required = set(_required(cls))
    for key, value in list(out.items()):
        if key not in required and _empty_refused(value, props.get(key), declared.get(key)):
            # An optional parameter given as "" that its schema refuses: left out. A model
            # held to a schema (structured steps) wrote every optional key, empty.
            del out[key]
            notes.append(f"empty {one_line(key, 40)!r} was left out")
            continue
        types = declared.get(key)
        if not types:
            continue
        kinds = _FITS.get(type(value))
        if kinds is not None and not types.isdisjoint(kinds):
            continue  # the common case, decided without json_type
        if fits(value, types):
            continue
        fixed = _fix_value(value, types)
        if fixed is not _NOTHING:
            out[key] = fixed
            notes.append(f"{key}: {json_type(value)} was read as {json_type(fixed)}")
    return Healed(out, tuple(notes))


def _empty_refused(value: Any, spec: Any, types: set[str] | None) -> bool:
    """Whether ``value`` is an empty string that the property ``spec`` cannot take."""
    if not isinstance(value, str) or value.strip() or not isinstance(spec, Mapping):
        return False
    if types and "string" not in types:
        return True
    return _refuses_empty(spec)


def _refuses_empty(spec: Any) -> bool:
    """Whether no alternative of the schema ``spec`` takes an empty string."""
    if not isinstance(spec, Mapping):
        return False
    alternatives = spec.get("anyOf") or spec.get("oneOf")
    if isinstance(alternatives, list):
        return all(_refuses_empty(alt) for alt in alternatives)
    kind = spec.get("type")
    if kind is not None and kind != "string" and not (isinstance(kind, list) and "string" in kind):
        return True
    enum = spec.get("enum")
    return bool(
        (isinstance(enum, list) and "" not in enum)
        or int(spec.get("minLength") or 0) > 0
        or spec.get("pattern")
        or spec.get("format")
    )


_NOTHING: Final = object()
MAX_DEPTH: Final = 32  # the dispatcher's own bound on nesting (chalie.calls.dispatch.MAX_DEPTH)


def _shallow(text: str) -> bool:
    """Whether a JSON text nests at most MAX_DEPTH brackets (checked before parsing it)."""
    depth = 0
    for ch in text:
        if ch in "{[":
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif ch in "}]":
            depth -= 1
    return True


def _fix_value(value: Any, types: set[str]) -> Any:
    """One reading of ``value`` in one of ``types``, or ``_NOTHING``."""
    if isinstance(value, str):
        text = value.strip()
        if types & {"object", "array"} and text[:1] in ("{", "[") and _shallow(text):
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = _NOTHING
            if parsed is not _NOTHING and fits(parsed, types):
                return parsed
        if "integer" in types and _INTEGER.match(text):
            return int(text)
        if "number" in types and _NUMBER.match(text):
            number = float(text)
            return int(number) if number.is_integer() and _INTEGER.match(text) else number
        if "boolean" in types and text.lower() in ("true", "false"):
            return text.lower() == "true"
    if "array" in types and not isinstance(value, list | Mapping) and value is not None:
        return [value]  # one value where a list is expected: a list of one
    return _NOTHING


def is_copied_summary(text: str, cls: type[Ability]) -> bool:
    """Whether an act_summary says nothing of its own: a description or a placeholder copied."""
    said = " ".join(text.split()).lower()
    return said in _copies(cls) or bool(_PLACEHOLDER.match(said))


_COPIES_CACHE: dict[tuple[str, str], frozenset[str]] = {}


def _copies(cls: type[Ability]) -> frozenset[str]:
    """The texts an act_summary copied from the descriptor would say (once per summary)."""
    key = (cls.summary, cls.tooltip)
    found = _COPIES_CACHE.get(key)
    if found is None:
        found = frozenset({ACT_SUMMARY_DESCRIPTION.lower(), key[0].lower(), key[1].lower()})
        if len(_COPIES_CACHE) >= _TYPES_CACHE_MAX:
            _COPIES_CACHE.clear()
        _COPIES_CACHE[key] = found
    return found


def written_summary(cls: type[Ability], params: Mapping[str, Any]) -> str:
    """The act_summary the framework writes: the tooltip and the arguments, on one line."""
    parts = []
    for key, value in params.items():
        if key in cls.sensitive:
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        parts.append(f"{one_line(key, 40)}={one_line(shown, SUMMARY_ARG_CHARS)}")
    text = cls.tooltip.strip() + (f" ({', '.join(parts)})" if parts else "")
    return one_line(text, MAX_SUMMARY)


def summary_for(cls: type[Ability], given: Any, params: Mapping[str, Any]) -> tuple[str, str]:
    """(the act_summary to use, a healing note or ``""``) for a model's call."""
    if isinstance(given, str) and given.strip() and not is_copied_summary(given, cls):
        return given.strip()[:MAX_SUMMARY], ""  # the model's own words: shown escaped
    why = "missing" if given is None else "copied" if isinstance(given, str) and given else "empty"
    if given is not None and not isinstance(given, str):
        why = "not text"
    return written_summary(cls, params), f"act_summary {why}: written from the tooltip"


def _placeholder(name: str, spec: Any) -> str:
    types = json_types(spec)
    if "array" in types:
        return f'["<{name}>"]'
    if types & {"integer", "number"}:
        return f"<{name}: number>"
    if "boolean" in types:
        return "true"
    if "object" in types:
        return "{...}"
    return f'"<{name}>"'


def shape(cls: type[Ability]) -> str:
    """The correct shape of a call, with placeholders: ``{"query": ["<query>"], ...}``."""
    props = _properties(cls)
    names = _required(cls)
    if cls.actions and cls.action_param in props and cls.action_param not in names:
        names.insert(0, cls.action_param)
    fields = [f'"{n}": {_placeholder(n, props.get(n))}' for n in names]
    fields.append(f'"act_summary": "{ACT_SUMMARY_DESCRIPTION}"')
    return "{" + ", ".join(fields) + "}"

"""What a value a person typed as text means for a tool's parameter (the CLI's ``key=value``,
a dashboard form's field): one rule, for every surface a person calls a tool from.

A text that parses as JSON is that JSON, else it is the text; but where the parameter takes
a string and not the JSON's type, the text as typed (``query=2123`` for a ``string | null``
query is ``"2123"``; ``query=null`` is null). A decoded value nested deeper than
:data:`MAX_VALUE_DEPTH` or holding an integer msgpack cannot carry is a
:class:`TypedTextError`.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from chalie.calls.schema_types import fits, json_types

MAX_VALUE_DEPTH: Final = 32
INT_RANGE: Final = (-(2**63), 2**64 - 1)


class TypedTextError(ValueError):
    """The text cannot be a value; the message names the parameter."""


_TOO_DEEP: Final = object()


def _decode(raw: str) -> tuple[bool, object]:
    """(True, value) when ``raw`` is JSON, else (False, None); too deep gives _TOO_DEEP."""
    try:
        return True, msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return False, None
    except RecursionError:
        return True, _TOO_DEEP


def keeps_text(schema: dict[str, Any] | None, key: str, value: object) -> bool:
    """Whether the typed text stays text: the parameter takes a string and not the type
    the text would decode to."""
    if schema is None:
        return False
    prop = (schema.get("properties") or {}).get(key)
    types = json_types(prop, schema.get("$defs"))
    return "string" in types and not fits(value, types)


def check_value(key: str, value: object) -> None:
    """TypedTextError when a decoded value nests too deep or holds an integer out of range."""
    todo: list[tuple[object, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_VALUE_DEPTH:
            raise TypedTextError(f"the value of {key!r} nests deeper than {MAX_VALUE_DEPTH} levels")
        if isinstance(item, int) and not isinstance(item, bool):
            if not INT_RANGE[0] <= item <= INT_RANGE[1]:
                raise TypedTextError(
                    f"the integer in {key!r} is out of range (-2**63 .. 2**64-1); "
                    "quote it to pass it as a string"
                )
        elif isinstance(item, list):
            todo.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            todo.extend((v, depth + 1) for v in item.values())


def typed(schema: dict[str, Any] | None, key: str, raw: str) -> object:
    """The value the text ``raw`` typed for parameter ``key`` means (see the module doc)."""
    parsed, value = _decode(raw)
    if parsed and keeps_text(schema, key, [] if value is _TOO_DEEP else value):
        return raw
    if value is _TOO_DEEP:
        raise TypedTextError(f"the value of {key!r} nests deeper than {MAX_VALUE_DEPTH} levels")
    if not parsed:
        return raw
    check_value(key, value)
    return value

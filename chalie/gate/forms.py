"""Forms a person fills: a question whose answer is an object checked against a JSON schema.

A remote MCP server's form-mode elicitation is one (``elicitation/create``): it
becomes a durable permission request carrying the requested schema
(:class:`chalie.wire.messages.PermissionRequest` ``form``), and the owner's answer is
checked here before anything reaches the server. The rules live in this one
place: the shape an answer may have (a flat object of primitives, or lists of
strings), the schema it must fit, and which fields are credentials, which are
never filled on the owner's behalf (such a form is declined before anyone is asked).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import jsonschema
from jsonschema.exceptions import SchemaError

MAX_FIELDS: Final = 32
# A field that holds a credential by its name or its format: never filled for the owner.
SECRET_FIELD: Final = re.compile(
    r"(?i)(passw(or)?d|passphrase|secret|token|api[_-]?key|auth|credential|private|cookie|pin|otp)"
)


class BadAnswer(ValueError):
    """An answer that does not fit the requested form."""


def secret_fields(schema: Mapping[str, Any]) -> list[str]:
    """The fields of a requested form that are credentials (never filled for the owner)."""
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return []
    out = []
    for name, prop in props.items():
        fmt = prop.get("format") if isinstance(prop, Mapping) else None
        if SECRET_FIELD.search(str(name)) or fmt == "password":
            out.append(str(name))
    return out


def fields(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The form's fields as the person is shown them (its ``properties``)."""
    props = schema.get("properties")
    return dict(props) if isinstance(props, Mapping) else {}


def check_answer(schema: Mapping[str, Any], content: Any) -> dict[str, Any]:
    """The answer once it fits the form (a flat object of primitives); BadAnswer."""
    if not isinstance(content, dict):
        raise BadAnswer("the answer must be an object of the form's fields")
    if len(content) > MAX_FIELDS:
        raise BadAnswer(f"the answer has more than {MAX_FIELDS} fields")
    for key, value in content.items():
        if isinstance(value, dict | list) and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            raise BadAnswer(f"field {str(key)[:40]!r} must be a string, number or boolean")
    try:
        jsonschema.validate(content, dict(schema))
    except jsonschema.ValidationError as exc:
        raise BadAnswer(f"the answer does not fit the form: {exc.message[:200]}") from None
    except SchemaError:
        raise BadAnswer("the form is not a valid schema") from None
    return content


__all__ = ["MAX_FIELDS", "SECRET_FIELD", "BadAnswer", "check_answer", "fields", "secret_fields"]

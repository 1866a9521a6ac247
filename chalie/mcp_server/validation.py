"""The arguments of ``talk_to_chalie``: one msgspec type, its JSON Schema and its itemised check.

:class:`TalkRequest` is the one definition: each field's type, bounds, pattern and
description. The schema MCP clients see is generated from it (:func:`input_schema`),
and :func:`check` validates each field against its own annotated type, so every bad
field is named at once (msgspec alone stops at the first), each with a problem read
from the same constraints.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Annotated, Any, Final, get_args, get_origin, get_type_hints

import msgspec

from chalie.calls.schema_types import json_type
from chalie.conversation.requests import ID_PATTERN

TOOL_NAME: Final = "talk_to_chalie"
MESSAGE_MAX: Final = 32_000
NAME_MAX: Final = 100
CONVERSATION_ID_MAX: Final = 64
# Letters (any script), digits, space and ``_ - . : /``.
_SAFE_CHAR: Final = re.compile(r"[\w \-.:/]")
SAFE: Final = "letters, digits, space and _ - . : /"


def _bad_name(value: str) -> str:
    bad = sorted({c for c in value if not _SAFE_CHAR.fullmatch(c)})
    if not bad:
        return "must not be empty or blank"
    return f"only {SAFE} are allowed (found {', '.join(repr(c) for c in bad[:5])})"


def _bad_message(value: str) -> str:
    return "must not contain NUL characters" if "\x00" in value else "must not be empty or blank"


def _bad_id(_value: str) -> str:
    return "is not a conversation id Chalie returned"


def _name(description: str) -> msgspec.Meta:
    return msgspec.Meta(
        min_length=1,
        max_length=NAME_MAX,
        # safe characters only, and at least one that is not a space
        pattern=r"^(?=.*[^ ])[\w \-.:/]+$",
        description=f"{description} Safe characters: {SAFE}",
        extra={"pattern_problem": _bad_name},
    )


AgentName = Annotated[str, _name("Who is asking (your agent's name).")]
ProjectName = Annotated[str, _name("The project or task this is about.")]


class TalkRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A ``talk_to_chalie`` call: the one definition of its parameters."""

    message: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            max_length=MESSAGE_MAX,
            # something besides white space, and no NUL
            pattern=r"^(?=[\s\S]*\S)[^\x00]*$",
            description="What you want from Chalie, in natural language.",
            extra={"pattern_problem": _bad_message},
        ),
    ]
    agent_name: AgentName
    project_or_task_name: ProjectName
    loop_in_human: Annotated[
        bool,
        msgspec.Meta(
            description=(
                "True when the exchange involves a decision the user should know about "
                "or touches their personal data: Chalie surfaces it to them."
            )
        ),
    ] = False
    conversation_id: Annotated[
        Annotated[
            str,
            msgspec.Meta(
                max_length=CONVERSATION_ID_MAX,
                pattern=ID_PATTERN.pattern,
                extra={"pattern_problem": _bad_id},
            ),
        ]
        | None,
        msgspec.Meta(
            description=(
                "Continue an earlier exchange: the conversation_id a previous answer returned."
            )
        ),
    ] = None


FIELDS: Final = TalkRequest.__struct_fields__
_REQUIRED: Final = FIELDS[: len(FIELDS) - len(TalkRequest.__struct_defaults__)]


def call_signature(context: type, returns: type) -> inspect.Signature:
    """The signature a ``talk_to_chalie`` handler shows the MCP SDK, made from TalkRequest.

    The SDK reads a tool's parameters from its handler's signature: ``self``, the
    request context (annotated ``context``), then each of TalkRequest's fields, taken as
    it comes (``Any``, absent: None) so that :func:`check` names every bad field itself.
    """
    kw = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature(
        [
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
            inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=context),
            *(inspect.Parameter(name, kw, default=None, annotation=Any) for name in FIELDS),
        ],
        return_annotation=returns,
    )


class FieldError(msgspec.Struct, frozen=True):
    """One bad field: its name and what is wrong with it."""

    field: str
    problem: str


class InvalidArguments(Exception):
    """Every bad field of one call."""

    code: Final = "invalid-arguments"

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__(describe(errors))
        self.errors = errors


def describe(errors: list[FieldError]) -> str:
    items = "; ".join(f"{e.field}: {e.problem}" for e in errors)
    return f"invalid-arguments: {len(errors)} bad field{'s' if len(errors) != 1 else ''}: {items}"


def input_schema() -> dict[str, Any]:
    """The JSON Schema of :class:`TalkRequest`, inline (MCP clients want no ``$ref``)."""
    (ref,), components = msgspec.json.schema_components([TalkRequest])
    schema: dict[str, Any] = dict(components[ref["$ref"].rsplit("/", 1)[-1]])
    schema.pop("title", None)
    schema.pop("description", None)
    return schema


# -- the itemised check ----------------------------------------------------------------


_TYPES: Final = get_type_hints(TalkRequest, include_extras=True)
_KINDS: Final = {str: "a string", bool: "a boolean", int: "a number", float: "a number"}


_SHOWN: Final = {
    "null": "null",
    "boolean": "a boolean",
    "integer": "a number",
    "number": "a number",
    "string": "a string",
    "array": "an array",
    "object": "an object",
}


def _kind(value: Any) -> str:
    return _SHOWN.get(json_type(value), type(value).__name__)


def _base(annotation: Any) -> tuple[type, msgspec.Meta | None]:
    """The field's plain type and its constraints (``X | None`` read as ``X``)."""
    if get_origin(annotation) is Annotated:
        base, *metas = get_args(annotation)
        if get_origin(base) is not Annotated and type(None) not in get_args(base):
            return base, next((m for m in metas if isinstance(m, msgspec.Meta)), None)
        annotation = base
    args = [a for a in get_args(annotation) if a is not type(None)]
    return _base(args[0]) if args else (annotation, None)


def _problem(name: str, value: Any) -> str | None:
    """What is wrong with one field's value, read from its annotated type (None: nothing)."""
    annotation = _TYPES[name]
    try:
        msgspec.convert(value, annotation, strict=True)
        return None
    except msgspec.ValidationError:
        pass
    base, meta = _base(annotation)
    if not isinstance(value, base) or (base is not bool and isinstance(value, bool)):
        return f"must be {_KINDS.get(base, base.__name__)}, not {_kind(value)}"
    if meta is not None and isinstance(value, str):
        if meta.max_length is not None and len(value) > meta.max_length:
            return f"must be at most {meta.max_length} characters (got {len(value)})"
        if meta.min_length is not None and len(value) < meta.min_length:
            return "must not be empty or blank"
        explain: Callable[[str], str] | None = (meta.extra or {}).get("pattern_problem")
        if explain is not None:
            return explain(value)
    return "is not valid"


def check(arguments: dict[str, Any]) -> TalkRequest:
    """A TalkRequest, or InvalidArguments naming every bad field.

    A null is an absent field, and an empty ``conversation_id`` means a new exchange
    (clients often send ""). Names are stripped of surrounding spaces.
    """
    given = {k: v for k, v in arguments.items() if v is not None}
    if given.get("conversation_id") == "":
        del given["conversation_id"]
    errors = [FieldError(name, "required") for name in _REQUIRED if name not in given]
    errors += [
        FieldError(name, problem)
        for name in FIELDS
        if name in given and (problem := _problem(name, given[name])) is not None
    ]
    unknown = sorted(k for k in given if k not in FIELDS)
    errors += [FieldError(key[:64], f"is not a parameter of {TOOL_NAME}") for key in unknown[:10]]
    if errors:
        raise InvalidArguments(sorted(errors, key=_order))
    for name in ("agent_name", "project_or_task_name"):
        given[name] = given[name].strip()
    return msgspec.convert(given, TalkRequest, strict=True)


def _order(error: FieldError) -> int:
    return FIELDS.index(error.field) if error.field in FIELDS else len(FIELDS)

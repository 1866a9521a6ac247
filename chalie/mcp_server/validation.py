"""The arguments of ``talk_to_chalie``: their JSON Schema and one itemised check of every field.

The schema is what MCP clients see; :func:`check` is what the server enforces,
and it names every bad field at once (never only the first).
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from chalie.conversation.requests import ID_PATTERN

TOOL_NAME: Final = "talk_to_chalie"
MESSAGE_MAX: Final = 32_000
NAME_MAX: Final = 100
CONVERSATION_ID_MAX: Final = 64
# Letters (any script), digits, space and ``_ - . : /``.
_SAFE_CHAR: Final = re.compile(r"[\w \-.:/]")
SAFE: Final = "letters, digits, space and _ - . : /"
FIELDS: Final = (
    "message",
    "agent_name",
    "project_or_task_name",
    "loop_in_human",
    "conversation_id",
)


class FieldError(msgspec.Struct, frozen=True):
    """One bad field: its name and what is wrong with it."""

    field: str
    problem: str


class TalkRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A validated ``talk_to_chalie`` call."""

    message: str
    agent_name: str
    project_or_task_name: str
    loop_in_human: bool = False
    conversation_id: str | None = None


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
    name_rule = {
        "type": "string",
        "minLength": 1,
        "maxLength": NAME_MAX,
        "pattern": r"^[\w \-.:/]+$",
    }
    return {
        "type": "object",
        "properties": {
            "message": {
                "type": "string",
                "minLength": 1,
                "maxLength": MESSAGE_MAX,
                "description": "What you want from Chalie, in natural language.",
            },
            "agent_name": {
                **name_rule,
                "description": "Who is asking (your agent's name). Safe characters: " + SAFE,
            },
            "project_or_task_name": {
                **name_rule,
                "description": "The project or task this is about. Safe characters: " + SAFE,
            },
            "loop_in_human": {
                "type": "boolean",
                "default": False,
                "description": (
                    "True when the exchange involves a decision the user should know about "
                    "or touches their personal data: Chalie surfaces it to them."
                ),
            },
            "conversation_id": {
                "type": "string",
                "maxLength": CONVERSATION_ID_MAX,
                "description": (
                    "Continue an earlier exchange: the conversation_id a previous answer returned."
                ),
            },
        },
        "required": ["message", "agent_name", "project_or_task_name"],
        "additionalProperties": False,
    }


def _name_problem(value: Any) -> str | None:
    if value is None:
        return "required"
    if not isinstance(value, str):
        return f"must be a string, not {_kind(value)}"
    if not value.strip():
        return "must not be empty or blank"
    if len(value) > NAME_MAX:
        return f"must be at most {NAME_MAX} characters (got {len(value)})"
    bad = sorted({c for c in value if not _SAFE_CHAR.fullmatch(c)})
    if bad:
        shown = ", ".join(repr(c) for c in bad[:5])
        return f"only {SAFE} are allowed (found {shown})"
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def check(arguments: dict[str, Any]) -> TalkRequest:
    """A TalkRequest, or InvalidArguments naming every bad field."""
    errors: list[FieldError] = []
    message = arguments.get("message")
    if message is None:
        errors.append(FieldError("message", "required"))
    elif not isinstance(message, str):
        errors.append(FieldError("message", f"must be a string, not {_kind(message)}"))
    elif not message.strip():
        errors.append(FieldError("message", "must not be empty or blank"))
    elif len(message) > MESSAGE_MAX:
        errors.append(
            FieldError("message", f"must be at most {MESSAGE_MAX} characters (got {len(message)})")
        )
    elif "\x00" in message:
        errors.append(FieldError("message", "must not contain NUL characters"))
    for name in ("agent_name", "project_or_task_name"):
        problem = _name_problem(arguments.get(name))
        if problem:
            errors.append(FieldError(name, problem))
    loop = arguments.get("loop_in_human", False)
    if loop is None:
        loop = False
    if not isinstance(loop, bool):
        errors.append(FieldError("loop_in_human", f"must be a boolean, not {_kind(loop)}"))
    conv = arguments.get("conversation_id")
    if conv is not None:
        if not isinstance(conv, str):
            errors.append(FieldError("conversation_id", f"must be a string, not {_kind(conv)}"))
        elif not conv:
            conv = None  # an empty id means "a new exchange", as clients often send ""
        elif not ID_PATTERN.match(conv):
            errors.append(FieldError("conversation_id", "is not a conversation id Chalie returned"))
    unknown = sorted(k for k in arguments if k not in FIELDS)
    for key in unknown[:10]:
        errors.append(FieldError(key[:64], "is not a parameter of talk_to_chalie"))
    if errors:
        raise InvalidArguments(errors)
    assert isinstance(message, str)
    return TalkRequest(
        message=message,
        agent_name=str(arguments["agent_name"]).strip(),
        project_or_task_name=str(arguments["project_or_task_name"]).strip(),
        loop_in_human=bool(loop),
        conversation_id=conv if isinstance(conv, str) and conv else None,
    )

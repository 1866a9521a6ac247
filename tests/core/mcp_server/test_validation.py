"""talk_to_chalie's arguments: every bad field is named at once; good ones pass through."""

from __future__ import annotations

from typing import Any

import pytest

from chalie.mcp_server.validation import (
    MESSAGE_MAX,
    NAME_MAX,
    InvalidArguments,
    check,
    input_schema,
)

GOOD: dict[str, Any] = {
    "message": "what is on my calendar?",
    "agent_name": "claude-code",
    "project_or_task_name": "repo: chalie/v2",
}


def bad_fields(arguments: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InvalidArguments) as err:
        check(arguments)
    return {e.field: e.problem for e in err.value.errors}


def test_a_good_call_passes_with_defaults() -> None:
    req = check(GOOD)
    assert req.loop_in_human is False and req.conversation_id is None
    assert req.agent_name == "claude-code"


def test_every_bad_field_is_named_not_only_the_first() -> None:
    got = bad_fields(
        {
            "message": "",
            "agent_name": "bad$name",
            "project_or_task_name": 7,
            "loop_in_human": "yes",
            "conversation_id": ["x"],
        }
    )
    assert set(got) == {
        "message",
        "agent_name",
        "project_or_task_name",
        "loop_in_human",
        "conversation_id",
    }
    assert "'$'" in got["agent_name"]
    assert "number" in got["project_or_task_name"]


def test_missing_required_fields_are_each_reported() -> None:
    assert bad_fields({}) == {
        "message": "required",
        "agent_name": "required",
        "project_or_task_name": "required",
    }


def test_lengths_are_bounded() -> None:
    got = bad_fields(
        {**GOOD, "message": "x" * (MESSAGE_MAX + 1), "agent_name": "a" * (NAME_MAX + 1)}
    )
    assert f"at most {MESSAGE_MAX}" in got["message"]
    assert f"at most {NAME_MAX}" in got["agent_name"]
    assert check({**GOOD, "message": "x" * MESSAGE_MAX, "agent_name": "a" * NAME_MAX})


@pytest.mark.parametrize(
    "name", ["a\nb", "<script>", "a;b", "tab\there", "emoji🙂", "nbsp\u00a0x", "quote'"]
)
def test_names_outside_the_safe_set_are_refused(name: str) -> None:
    assert "agent_name" in bad_fields({**GOOD, "agent_name": name})


def test_letters_of_any_script_and_the_safe_punctuation_pass() -> None:
    assert check({**GOOD, "agent_name": "Zoë_agent-1.2:x/y", "project_or_task_name": "Проект 7"})


def test_blank_and_nul_messages_are_refused() -> None:
    assert "blank" in bad_fields({**GOOD, "message": "   "})["message"]
    assert "NUL" in bad_fields({**GOOD, "message": "a\x00b"})["message"]


def test_a_conversation_id_must_look_like_one() -> None:
    assert "conversation_id" in bad_fields({**GOOD, "conversation_id": "../../etc"})
    assert check({**GOOD, "conversation_id": ""}).conversation_id is None
    assert check({**GOOD, "conversation_id": "c_12-ab"}).conversation_id == "c_12-ab"


def test_unknown_parameters_are_named() -> None:
    assert bad_fields({**GOOD, "sudo": True}) == {"sudo": "is not a parameter of talk_to_chalie"}


def test_the_schema_publishes_the_same_rules() -> None:
    schema = input_schema()
    assert schema["required"] == ["message", "agent_name", "project_or_task_name"]
    assert schema["properties"]["message"]["maxLength"] == MESSAGE_MAX
    assert schema["properties"]["agent_name"]["maxLength"] == NAME_MAX
    assert schema["properties"]["loop_in_human"]["default"] is False


def test_the_schema_and_the_check_come_from_the_one_type() -> None:
    from chalie.mcp_server.validation import FIELDS, TalkRequest

    schema = input_schema()
    assert tuple(schema["properties"]) == FIELDS == TalkRequest.__struct_fields__
    assert schema["additionalProperties"] is False
    assert all(prop.get("description") for prop in schema["properties"].values())
    assert "$ref" not in str(schema)


def test_the_handler_the_sdk_reads_takes_exactly_the_types_fields() -> None:
    """The SDK builds the tool's argument model from the handler's signature: it is made
    from TalkRequest, so a field added to the type reaches the handler with no other edit."""
    from mcp.server.mcpserver.tools.base import Tool

    from chalie.mcp_server.talk import TalkToChalie
    from chalie.mcp_server.validation import FIELDS

    class Bare(TalkToChalie):
        def __init__(self) -> None:  # the signature is all this test reads
            pass

    tool = Tool.from_function(Bare().__call__, name="talk_to_chalie")
    assert tool.context_kwarg == "ctx"
    assert tuple(tool.fn_metadata.arg_model.model_fields) == FIELDS
    given = tool.fn_metadata.arg_model.model_validate({"message": "hi", "sudo": 1})
    assert tool.fn_metadata.arg_model.model_dump_one_level(given) == {
        name: ("hi" if name == "message" else None) for name in FIELDS
    }

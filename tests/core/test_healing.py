"""Healing a model's arguments: each rule where one reading exists, and nothing else."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
import pytest

from abilities.calculator import Calculator
from abilities.clock import Clock
from abilities.find_tools import FindTools
from chalie.ability import Ability, AbilityDefinitionError
from chalie.calls import healing
from chalie.result import ToolResult

EX = ("one", "two", "three", "four", "five", "six")


Short = Annotated[str, msgspec.Meta(min_length=2)]


class ShapesParams(msgspec.Struct, forbid_unknown_fields=True):
    items: dict[str, int] | None = None
    label: Short | None = None
    note: str | None = None
    tags: list[str] | None = None
    count: int = 1
    ratio: float = 1.0
    loud: bool = False
    mode: Literal["a", "b"] = "a"


class Shapes(Ability):
    name = "shapes"
    summary = "Shapes."
    tooltip = "Shapes"
    examples = EX
    Params = ShapesParams
    aliases = {"n": "count"}

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success("ok")


def test_a_bare_array_is_the_one_required_array_parameter() -> None:
    healed = healing.heal_bare(FindTools, ["clock"])
    assert healed is not None and healed.arguments == {"query": ["clock"]}
    assert healed.notes == ("a bare array was read as query",)


def test_a_bare_value_is_refused_where_two_readings_exist() -> None:
    assert healing.heal_bare(Clock, ["now"]) is None  # clock has no required parameter
    assert healing.heal_bare(Shapes, ["x"]) is None
    assert healing.heal_bare(Calculator, ["2+2"]) is None  # an array is not a string
    found = healing.heal_bare(Calculator, "2+2")
    assert found is not None and found.arguments == {"expression": "2+2"}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"items": '{"a": 1}'}, {"items": {"a": 1}}),
        ({"tags": '["x", "y"]'}, {"tags": ["x", "y"]}),
        ({"tags": "x"}, {"tags": ["x"]}),
        ({"count": "3"}, {"count": 3}),
        ({"ratio": "2.5"}, {"ratio": 2.5}),
        ({"loud": "true"}, {"loud": True}),
        ({"loud": "False"}, {"loud": False}),
        ({"n": 4}, {"count": 4}),
    ],
)
def test_each_unambiguous_shape_is_healed_and_noted(
    given: dict[str, Any], expected: dict[str, Any]
) -> None:
    healed = healing.heal(Shapes, given)
    assert healed.arguments == expected
    assert len(healed.notes) == 1


def test_an_empty_optional_value_its_schema_refuses_is_left_out() -> None:
    # What the real 1.5B model wrote held to a schema: every optional key, empty.
    given = {"label": "", "count": " ", "mode": "", "items": "", "note": "", "tags": []}
    healed = healing.heal(Shapes, given)
    # "" is a valid note (no bound on it) and [] a valid list: both stay as given.
    assert healed.arguments == {"note": "", "tags": []}
    assert len(healed.notes) == 4 and "empty 'label' was left out" in healed.notes


@pytest.mark.parametrize(
    "given",
    [
        {"count": "three"},
        {"ratio": "1,5"},
        {"loud": "yes"},
        {"items": "{not json"},
        {"items": "[1]"},  # an array where an object is expected stays wrong
        {"mode": "c"},
        {"n": 4, "count": 5},  # the real name is there: the alias is just unknown
        {"unknown": 1},
    ],
)
def test_what_has_two_readings_or_none_is_left_for_validation(given: dict[str, Any]) -> None:
    healed = healing.heal(Shapes, given)
    assert healed.arguments == given and healed.notes == ()


def test_correct_arguments_are_never_changed() -> None:
    given = {"items": {"a": 1}, "tags": ["x"], "count": 2, "ratio": 3, "loud": True}
    assert healing.heal(Shapes, given) == healing.Healed(given)


def test_the_shape_shows_placeholders_never_values() -> None:
    assert healing.shape(FindTools) == (
        '{"query": ["<query>"], "act_summary": "<what this call does, in a few words>"}'
    )
    assert healing.shape(Clock).startswith('{"action": "<action>"')


def test_copied_descriptions_and_placeholders_are_not_summaries() -> None:
    for text in (healing.ACT_SUMMARY_DESCRIPTION, Calculator.tooltip, "<expression>", "  "):
        summary, note = healing.summary_for(Calculator, text, {"expression": "2*3"})
        assert summary == "Arithmetic and math expressions (expression=2*3)" and note
    assert healing.summary_for(Calculator, "Working out 2*3", {}) == ("Working out 2*3", "")


def test_an_alias_must_name_a_declared_parameter() -> None:
    with pytest.raises(AbilityDefinitionError, match="aliases"):

        class Bad(Ability):
            name = "bad_alias"
            summary = "Bad."
            tooltip = "Bad"
            examples = EX
            Params = ShapesParams
            aliases = {"x": "missing"}


def test_shipped_descriptions_hold_no_copyable_example_values() -> None:
    from chalie.ability import descriptor_of

    for cls in (Calculator, Clock, FindTools):
        described = descriptor_of(cls, allow_async=True)
        text = str({k: v for k, v in described.items() if k != "name"})
        for copied in ("e.g.", "Europe/Malta", "17.5", "clock", "convert a time between"):
            assert copied not in text, (cls.name, copied)


def test_a_hostile_json_string_is_not_parsed_past_the_depth_bound() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    healed = healing.heal(Shapes, {"tags": deep, "items": "{" * 50_000})
    assert healed.arguments["tags"] == [deep]  # one value for the list: validation refuses it
    assert healed.arguments["items"] == "{" * 50_000

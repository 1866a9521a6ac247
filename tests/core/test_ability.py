"""The ability contract: load-time rules, the sealed assembler, deterministic descriptors."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Literal

import msgspec
import pytest

from chalie.ability import Ability, AbilityDefinitionError
from chalie.result import ToolResult

EXAMPLES = tuple(f"example phrase {i}" for i in range(6))


def make(**attrs: Any) -> type[Ability]:
    base: dict[str, Any] = {
        "name": "sample_tool",
        "summary": "Does a sample thing.",
        "tooltip": "Sample",
        "examples": EXAMPLES,
        "run": lambda self, p: ToolResult.success("ok"),
    }
    base.update(attrs)
    return type("Sample", (Ability,), base)


@pytest.mark.parametrize(
    ("attrs", "rule"),
    [
        ({"name": "Bad-Name"}, "snake case"),
        ({"name": "x" * 65}, "at most 64"),
        ({"name": "trailing_"}, "snake case"),
        ({"name": "9lives"}, "snake case"),
        ({"name": ""}, "non-empty"),
        ({"examples": EXAMPLES[:5]}, "6 to 8 examples, has 5"),
        ({"examples": (*EXAMPLES, "a", "b", "c")}, "6 to 8 examples, has 9"),
        ({"examples": ("",) * 6}, "non-empty strings"),
        ({"summary": "  "}, "summary"),
        ({"tooltip": ""}, "tooltip"),
        ({"parameters": {"type": "array"}}, "JSON Schema object"),
        (
            {"parameters": {"type": "object", "properties": {"a": {"type": "nonsense"}}}},
            "valid JSON Schema",
        ),
        (
            {"parameters": {"type": "object", "properties": {"act_summary": {"type": "string"}}}},
            "framework fields",
        ),
        ({"isolation": "thread"}, "isolation"),
        ({"timeout": 0}, "timeout"),
        (
            {
                "actions": {"delete": ("event_id",)},
                "parameters": {"type": "object", "properties": {"action": {"type": "string"}}},
            },
            "lacks",
        ),
        ({"sensitive": frozenset({"password"})}, "sensitive"),
    ],
)
def test_load_time_validation_names_the_ability_and_the_rule(
    attrs: dict[str, Any], rule: str
) -> None:
    with pytest.raises(AbilityDefinitionError) as info:
        make(**attrs)
    message = str(info.value)
    assert rule in message
    assert "Sample" in message  # names the class (and the ability name where it has one)


def test_redefining_the_assembler_is_rejected_at_class_creation() -> None:
    with pytest.raises(TypeError, match=r"Forger.*sealed descriptor assembler"):

        class Forger(Ability):
            name = "forger"
            summary = "s"
            tooltip = "t"
            examples = EXAMPLES

            @classmethod
            def descriptor(cls, *, allow_async: bool = False) -> dict[str, Any]:
                return {"name": "forger"}


def test_redefining_the_injection_is_rejected_even_on_an_abstract_base() -> None:
    with pytest.raises(TypeError, match="Sneaky"):

        class Sneaky(Ability):
            abstract = True

            @staticmethod
            def _inject_framework_fields(schema: dict[str, Any], allow_async: bool) -> None:
                pass


def test_a_mixin_cannot_slip_in_its_own_assembler() -> None:
    class Mixin:
        @classmethod
        def descriptor(cls, *, allow_async: bool = False) -> dict[str, Any]:
            return {"name": "forged"}

    with pytest.raises(TypeError, match=r"Sneaky.*through .*Mixin.*descriptor"):

        class Sneaky(Mixin, Ability):
            name = "sneaky"
            summary = "s"
            tooltip = "t"
            examples = EXAMPLES


def test_a_sealed_name_from_an_ability_base_is_also_rejected() -> None:
    class Injector:
        input_schema = staticmethod(lambda **k: {})

    with pytest.raises(TypeError, match="input_schema"):

        class Base(Injector, Ability):
            abstract = True


def test_the_registry_assembles_through_ability_itself() -> None:
    from chalie.ability import descriptor_of

    cls = make()
    assert descriptor_of(cls) == Ability.descriptor.__func__(cls)  # type: ignore[attr-defined]


def test_replacing_the_assembler_after_creation_is_rejected() -> None:
    cls = make()
    with pytest.raises(TypeError, match="sealed"):
        cls.descriptor = classmethod(lambda c, **k: {})  # type: ignore[method-assign]


def test_descriptor_injects_act_summary_and_async_only_where_allowed() -> None:
    cls = make(
        parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    )
    plain = cls.descriptor()
    assert set(plain) == {"name", "description", "input_schema"}
    props = plain["input_schema"]["properties"]
    assert props["act_summary"]["type"] == "string"
    assert "async" not in props
    assert plain["input_schema"]["required"] == ["q", "act_summary"]
    with_async = cls.descriptor(allow_async=True)["input_schema"]["properties"]
    assert with_async["async"] == {"type": "boolean", "description": "Run in the background."}
    # the class's own schema is untouched by assembly
    assert "act_summary" not in cls.parameters["properties"]


def test_a_descriptor_is_assembled_once_until_a_declaration_changes() -> None:
    cls = make(parameters={"type": "object", "properties": {"q": {"type": "string"}}})
    first = cls.descriptor()
    assert cls.descriptor() is first  # every model step asks; one assembly
    assert cls.descriptor(allow_async=True) is not first
    child = type("Child", (cls,), {"name": "child_tool"})
    assert child.descriptor()["name"] == "child_tool"  # not the parent's memo
    assert cls.descriptor()["name"] == "sample_tool"
    cls.parameters = {"type": "object", "properties": {"r": {"type": "integer"}}}
    changed = cls.descriptor()
    assert changed is not first and set(changed["input_schema"]["properties"]) == {
        "r",
        "act_summary",
    }
    cls.summary = "Does another thing."
    assert cls.descriptor()["description"] == "Does another thing."
    assert cls.input_schema() is not cls.input_schema()  # a copy of one's own, always


def test_params_struct_is_the_single_source_of_the_schema() -> None:
    class P(msgspec.Struct):
        """Look something up."""

        unit: Literal["c", "f"] = "c"
        city: str = ""

    cls = make(Params=P)
    schema = cls.parameters
    assert schema["type"] == "object"
    assert schema["properties"]["unit"]["enum"] == ["c", "f"]
    assert "$ref" not in json.dumps(schema)


def test_default_classify_uses_only_declared_actions() -> None:
    cls = make(
        parameters={
            "type": "object",
            "properties": {"action": {"type": "string"}, "id": {"type": "string"}},
        },
        actions={"delete_event": ("id",), "list": ()},
    )
    inst = cls()
    assert inst.classify({"action": "delete_event", "id": "1"}) == "delete_event"
    assert inst.classify({"action": "drop_tables"}) is None


_DUMP = (
    "import json; from chalie.calls.registry import Registry;"
    "print(json.dumps(Registry.collect(entry_points=False).descriptors(allow_async=True),"
    " sort_keys=False))"
)


@pytest.mark.slow  # two interpreters, each importing every ability
def test_descriptors_are_byte_identical_across_processes() -> None:
    outs = [
        subprocess.run(
            [sys.executable, "-c", _DUMP],
            capture_output=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            cwd=".",
        ).stdout
        for seed in ("1", "2")
    ]
    assert outs[0] == outs[1]
    assert b'"name": "clock"' in outs[0]

"""ToolResult: frozen, exactly two constructors, validated fields."""

from __future__ import annotations

import pytest

from chalie.result import ToolResult


def test_direct_construction_is_refused() -> None:
    with pytest.raises(TypeError, match="success"):
        ToolResult("success", "body")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ToolResult()


def test_result_is_frozen() -> None:
    r = ToolResult.success("x")
    with pytest.raises(AttributeError):
        r.body = "y"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del r.body


def test_success_renders_dict_and_list_bodies_as_compact_json() -> None:
    assert ToolResult.success({"a": 1, "b": [1, 2]}).body == '{"a":1,"b":[1,2]}'
    assert ToolResult.success([1, "x"]).body == '[1,"x"]'
    assert ToolResult.success("  verbatim\n text ").body == "  verbatim\n text "


def test_success_rejects_non_json_bodies_and_nested_meta() -> None:
    with pytest.raises(TypeError):
        ToolResult.success({"a": object()})
    with pytest.raises(TypeError):
        ToolResult.success(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="flat scalar"):
        ToolResult.success("x", meta={"k": [1]})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="reserved"):
        ToolResult.success("x", meta={"status": "error"})
    with pytest.raises(ValueError):
        ToolResult.success("x", meta={"Bad Key": 1})


def test_error_needs_a_kebab_case_code_and_message() -> None:
    e = ToolResult.error("invalid-param", "zone is wrong", hint="use UTC", valid_values=["UTC"])
    assert (e.status, e.code, e.hint, e.valid_values) == (
        "error",
        "invalid-param",
        "use UTC",
        ("UTC",),
    )
    assert not e.ok
    for bad in ("InvalidParam", "invalid_param", "-x", "x-", "", "a--b"):
        with pytest.raises(ValueError):
            ToolResult.error(bad, "m")
    with pytest.raises(ValueError):
        ToolResult.error("invalid-param", "   ")


def test_hint_is_forced_to_one_line() -> None:
    e = ToolResult.error("invalid-param", "m", hint="first\nsecond\r\nthird")
    assert e.hint == "first second third"


def test_with_meta_keeps_the_result_and_adds_meta() -> None:
    e = ToolResult.error("no-query", "m", hint="h", meta={"a": 1}).with_meta(action="recall")
    assert e.meta == {"action": "recall", "a": 1}
    assert e.code == "no-query"


def test_meta_rejects_non_finite_numbers() -> None:
    with pytest.raises(ValueError, match="finite"):
        ToolResult.success("x", meta={"a": float("inf")})

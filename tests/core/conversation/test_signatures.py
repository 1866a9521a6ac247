"""Tools as compact signatures (chalie.providers.signatures): what a structured step's
model is shown of its tools, and reading the names back as a model server sees them."""

from __future__ import annotations

from typing import Any

from chalie.providers import signatures

WEATHER: dict[str, Any] = {
    "name": "weather",
    "description": "Weather:  the current conditions\n and the forecast.",
    "input_schema": {
        "type": "object",
        "properties": {
            "act_summary": {"type": "string", "description": "<what this call does>"},
            "async": {"type": "boolean"},
            "action": {"enum": ["current", "forecast"], "default": "current"},
            "place": {"type": "string", "description": "a city or place"},
            "days": {"type": "integer", "minimum": 1},
            "tags": {"type": "array", "items": {"type": "integer"}},
            "note": {"type": ["string", "null"], "description": "x" * 61},
            "where": {"type": "object"},
            "exact": {"type": "boolean"},
        },
        "required": ["act_summary", "place"],
    },
}


def test_a_tool_is_one_line_of_names_and_short_types() -> None:
    line = signatures.signature(WEATHER)
    assert line == (
        "- weather(place (a city or place), action?: current|forecast, days?: integer, "
        "tags?: [integer], note?, where?: object, exact?: boolean): "
        "Weather: the current conditions and the forecast."
    )
    # The framework's own arguments are not shown (the grammar still allows them).
    assert "act_summary" not in line and "async" not in line


def test_a_tool_without_arguments_or_description_is_its_name() -> None:
    assert signatures.signature({"name": "ping"}) == "- ping()"
    odd = {"name": "odd", "input_schema": {"type": "object", "properties": {"q": "text"}}}
    assert signatures.signature(odd) == "- odd(q?)"


def test_the_listing_says_how_to_call_and_answer_and_its_names_read_back() -> None:
    tools = [WEATHER, {"name": "srv_mcp_x.y-z", "description": "Remote."}]
    text = signatures.listing(tools, "reply_to_user")
    assert '{"name": "reply_to_user", "arguments": {"text": <your answer>}}' in text
    system = "You are Chalie.\n- not(a tool)\n\n" + text
    assert signatures.listed(system) == ["weather", "srv_mcp_x.y-z"]
    assert signatures.listed("You are Chalie.\n- weather(place)") == []

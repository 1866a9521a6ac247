"""The scripted model's reactions: cases, the last result, a suggested call, in each wire format."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tools.fake_llm import load_script
from tools.fake_llm.script import resolve

ERROR = (
    "[multiply(status=error, code=unknown-tool)]\nno tool named 'multiply'.\n"
    'hint: call calculator instead.\nvalid values: ["calculator"]\n[end:multiply]'
)
PLAIN_ERROR = "[x(status=error, code=unknown-tool)]\nno tool named 'x'.\nhint: answer.\n[end:x]"


def body(fmt: str, result: str, tools: list[str]) -> dict[str, Any]:
    if fmt == "anthropic":
        return {
            "tools": [{"name": t, "description": "d"} for t in tools],
            "messages": [{"role": "user", "content": [{"type": "tool_result", "content": result}]}],
        }
    return {
        "tools": [{"type": "function", "function": {"name": t}} for t in tools],
        "messages": [{"role": "tool", "content": result}],
    }


def step(script: dict[str, Any]) -> Any:
    return load_script(json.dumps({"steps": [script]})).steps[0]


@pytest.mark.parametrize("fmt", ["openai", "ollama", "anthropic"])
def test_a_suggested_call_takes_the_first_valid_value_or_recites_the_hint(fmt: str) -> None:
    s = step({"tool_calls": [{"name": "$suggested", "arguments": {"expression": "1"}}]})
    chosen = resolve(s, fmt, body(fmt, ERROR, ["calculator"]))
    assert [tc.name for tc in chosen.tool_calls] == ["calculator"]
    recited = resolve(s, fmt, body(fmt, PLAIN_ERROR, []))
    assert recited.tool_calls == [] and recited.text == "answer."


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_the_first_matching_case_answers_and_the_last_result_fills_the_text(fmt: str) -> None:
    s = step(
        {
            "cases": [
                {"tools": False, "then": {"text": "no tools"}},
                {
                    "offered": "clock",
                    "result_has": "valid values",
                    "then": {"text": "{last_result}"},
                },
            ],
            "text": "default",
        }
    )
    assert resolve(s, fmt, body(fmt, ERROR, [])).text == "no tools"
    assert resolve(s, fmt, body(fmt, ERROR, ["clock"])).text.startswith("no tool named")
    assert resolve(s, fmt, body(fmt, "plain", ["clock"])).text == "default"

"""Tool calls written as text: each form read back, prose kept, a stream held while one may come."""

from __future__ import annotations

import pytest

from chalie.providers.rescue import HeldText, enabled, rescue

OFFERED = frozenset({"clock", "calculator", "find_tools"})
CALL = '{"name": "clock", "arguments": {"zone": "Asia/Tokyo"}}'


@pytest.mark.parametrize(
    "text",
    [
        CALL,
        f"  {CALL}\n",
        f"```json\n{CALL}\n```",
        f"```\n{CALL}\n```",
        f"<tool_call>\n{CALL}\n</tool_call>",
        f"<tool_call>{CALL}",  # the closing tag never came
        '{{"name": "clock", "arguments": {{"zone": "Asia/Tokyo"}}}}',
        '{"name": "clock", "parameters": {"zone": "Asia/Tokyo"}}',
        '{"type": "function", "function": {"name": "clock", '
        '"arguments": "{\\"zone\\": \\"Asia/Tokyo\\"}"}}',
        '{"tool_calls": [{"function": {"name": "clock", "arguments": {"zone": "Asia/Tokyo"}}}]}',
        '[{"name": "clock", "arguments": {"zone": "Asia/Tokyo"}}]',
        '{"clock": {"zone": "Asia/Tokyo"}}',
        '{"name": "clock", "zone": "Asia/Tokyo"}',
    ],
)
def test_every_written_form_of_a_call_is_read_back(text: str) -> None:
    found = rescue(text, OFFERED)
    assert found is not None
    assert [(c.name, c.arguments) for c in found.calls] == [("clock", {"zone": "Asia/Tokyo"})]
    assert found.text == ""


def test_text_around_a_call_stays_text() -> None:
    found = rescue(f"Let me check.\n```json\n{CALL}\n```\nOne moment.", OFFERED)
    assert found is not None and found.text == "Let me check.\n\nOne moment."
    inline = rescue(f"I will call {CALL} now", OFFERED)
    assert inline is not None and inline.text == "I will call  now"


def test_arguments_that_are_not_an_object_are_kept_raw_for_the_dispatcher() -> None:
    found = rescue('{"name": "find_tools", "arguments": ["clock"]}', OFFERED)
    assert found is not None
    assert found.calls[0].arguments is None and found.calls[0].raw == '["clock"]'


@pytest.mark.parametrize(
    "text",
    [
        "It is 9 o'clock.",
        '{"name": "John", "age": 30}',  # JSON the user asked for, not a call
        'For example {"name": "teleport", "arguments": {}} would be a call.',  # prose
        'Here is one:\n```json\n{"name": "teleport", "arguments": {}}\n```\nas you asked.',
        "```python\nprint(1)\n```",
        "{not json at all",
        "",
    ],
)
def test_prose_and_data_are_not_calls(text: str) -> None:
    assert rescue(text, OFFERED) is None


def test_a_message_that_is_only_a_call_is_taken_whatever_it_names() -> None:
    found = rescue('{"name": "multiply", "arguments": {"a": 2, "b": 3}}', OFFERED)
    assert found is not None and found.calls[0].name == "multiply"  # the dispatcher refuses it


def test_rescue_is_on_by_default_for_the_local_wires_only() -> None:
    assert enabled("auto", "openai") and enabled("auto", "ollama")
    assert not enabled("auto", "anthropic") and not enabled("off", "openai")


def test_a_held_stream_shows_prose_and_holds_a_call() -> None:
    held = HeldText()
    shown = "".join(held.feed(p) for p in ["Sure.\n", "``", "`json\n", CALL, "\n```"])
    assert shown == "Sure.\n"
    assert held.release() == f"```json\n{CALL}\n```"
    plain = HeldText()
    text = "The answer is {5} and [x].\nNext line."
    assert "".join(plain.feed(ch) for ch in text) == text  # mid-line braces are not held
    assert plain.release() == ""


def test_a_line_that_only_looks_like_a_marker_start_is_released() -> None:
    held = HeldText()
    assert held.feed("<b>bold</b>\n") == "<b>bold</b>\n"
    assert held.feed("`code` here") == "`code` here"


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"name": "clock", "arguments": ' + "[" * 50_000 + "]" * 50_000 + "}",
        "{" * 300_000,
        "```json\n" + "{" * 10_000,
        "<tool_call>" * 10_000,
        "\x00\ud800{\x1b[2J",
    ],
)
def test_hostile_text_is_never_an_error_and_never_a_call(text: str) -> None:
    assert rescue(text, OFFERED) is None


# What the real Qwen2.5-Coder-1.5B wrote on llama.cpp (tools/bench/bench_real_model.py).
def test_a_call_described_in_prose_with_its_arguments_is_read_as_the_call() -> None:
    text = (
        "To find the time there, you can use the `clock` function with the following "
        'parameters:\n\n```json\n{\n  "zone": "Asia/Tokyo"\n}\n```'
    )
    found = rescue(text, OFFERED)
    assert found is not None
    assert [(c.name, c.arguments) for c in found.calls] == [("clock", {"zone": "Asia/Tokyo"})]
    assert "```" not in found.text
    # a tool mentioned beside some JSON, without being the one to call, is no call
    assert rescue('The clock shows {"zone": "UTC"} here.', OFFERED) is None
    # two tools named: no one reading
    both = 'Call the `clock` or use the `calculator` with {"zone": "UTC"}.'
    assert rescue(both, OFFERED) is None


def test_a_tool_definition_recited_is_not_a_call() -> None:
    recital = (
        "I will use the calculator function. Here's the call:\n<tools>\n"
        '{"type": "function", "function": {"name": "calculator", "description": "Evaluates", '
        '"parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}'
        "\n</tools>"
    )
    assert rescue(recital, OFFERED) is None


def test_a_comment_after_a_json_value_does_not_hide_the_call() -> None:
    text = (
        '```json\n{\n  "name": "clock",\n  "arguments": {\n'
        '    "zone": "Asia/Tokyo" // where the user asked\n  }\n}\n```'
    )
    found = rescue(text, OFFERED)
    assert found is not None and found.calls[0].arguments == {"zone": "Asia/Tokyo"}
    url = rescue('{"name": "clock", "arguments": {"zone": "UTC", "note": "http://x.org"}}', OFFERED)
    assert url is not None and url.calls[0].arguments == {"zone": "UTC", "note": "http://x.org"}

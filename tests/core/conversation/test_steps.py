"""Structured steps (chalie.providers.steps): the schema a step is held to, the step object
read back as an answer or a call, and the answer's text streamed out of the object."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chalie.providers import steps
from chalie.providers.formats import WIRES
from chalie.providers.types import ChatMessage, ModelRequest, ModelResponse, Usage

CLOCK: dict[str, Any] = {
    "name": "clock",
    "description": "Tells the time.",
    "input_schema": {
        "type": "object",
        "properties": {
            "act_summary": {"type": "string"},
            "action": {"enum": ["now", "convert"]},
            "zone": {"type": "string"},
        },
        "required": ["act_summary", "action"],
        "additionalProperties": False,
    },
}


def test_the_schema_allows_a_call_of_each_offered_tool_or_the_answer() -> None:
    schema = steps.schema([CLOCK, {"name": "ping"}])
    names = [alt["properties"]["name"]["const"] for alt in schema["oneOf"]]
    assert names == ["clock", "ping", "reply"]
    clock = schema["oneOf"][0]["properties"]["arguments"]
    # act_summary is optional and last: a grammar writes required keys first, and the
    # model wrote the summary and stopped before the zone.
    assert list(clock["properties"]) == ["action", "zone", "act_summary"]
    assert clock["required"] == ["action"] and clock["additionalProperties"] is False
    assert schema["oneOf"][1]["properties"]["arguments"] == {"type": "object"}
    answer = schema["oneOf"][2]["properties"]["arguments"]
    assert answer["required"] == ["text"] and answer["properties"]["text"]["minLength"] == 1
    # A tool named reply does not take the answer's name.
    named = steps.schema([{"name": "reply"}])
    assert [a["properties"]["name"]["const"] for a in named["oneOf"]] == [
        "reply",
        "reply_to_user",
    ]


def response(text: str) -> ModelResponse:
    return ModelResponse(text=text, usage=Usage(input_tokens=5, output_tokens=3))


def test_a_step_object_is_read_back_as_the_answer_or_the_call() -> None:
    answer = steps.read(
        response('{"name": "reply", "arguments": {"text": "It is 09:00."}}'), ["clock"], "c1"
    )
    assert (answer.text, answer.tool_calls, answer.stop) == ("It is 09:00.", (), "final")
    assert answer.usage.input_tokens == 5
    call = steps.read(
        response('{"name": "clock", "arguments": {"zone": "Asia/Tokyo"}}'), ["clock"], "c2"
    )
    assert call.text == "" and call.stop == "tool_calls"
    ((part),) = call.tool_calls
    assert (part.id, part.name, part.arguments) == ("c2", "clock", {"zone": "Asia/Tokyo"})


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "reply", "arguments": {"text": "cut off by the tok',  # the token limit
        "It is nine.",  # a server that ignored the schema
        '["clock"]',
        '{"name": "clock", "arguments": "zone=Tokyo"}',
        '{"name": "reply", "arguments": {"text": 9}}',
        "[" * 5000,
    ],
)
def test_what_is_not_a_step_object_comes_back_as_it_came(text: str) -> None:
    assert steps.read(response(text), ["clock"], "c") == response(text)


ODD = 'Line one\nTab\there "quoted" \\ back/slash é 😀 \u2028 end'


@pytest.mark.parametrize("reply", ["reply", "reply_to_user"])
def test_the_answer_streams_out_of_the_object_however_it_is_cut(reply: str) -> None:
    offered = ["clock", "reply"] if reply != "reply" else ["clock"]
    for ascii_only in (True, False):
        whole = json.dumps(
            {"name": reply, "arguments": {"text": ODD}}, ensure_ascii=ascii_only, indent=1
        )
        for cut in range(1, len(whole)):
            text = steps.ReplyText(offered)
            assert text.feed(whole[:cut]) + text.feed(whole[cut:]) == ODD, (cut, whole)
        text = steps.ReplyText(offered)
        assert "".join(text.feed(ch) for ch in whole) == ODD


def test_a_call_streams_nothing_and_plain_text_streams_as_written() -> None:
    call = '{"name": "clock", "arguments": {"text": "not an answer"}}'
    text = steps.ReplyText(["clock"])
    assert "".join(text.feed(ch) for ch in call) == ""
    plain = steps.ReplyText(["clock"])
    assert plain.feed("  It is") + plain.feed(" nine {ok}") == "  It is nine {ok}"


FENCED = (
    '```json\n{\n  "name": "reply",\n  "arguments": {\n    "text": "You\'re welcome!"\n  }\n}\n```'
)


def test_a_fenced_object_is_read_and_streamed_as_the_object() -> None:
    # What the 1.5B model wrote in a free step shown the compact listing ("Thanks, that's
    # all for now."); the rescue had made it a call of a tool named reply.
    answer = steps.read(response(FENCED), ["memory"], "c")
    assert (answer.text, answer.tool_calls) == ("You're welcome!", ())
    for cut in range(1, len(FENCED)):
        text = steps.ReplyText(["memory"])
        assert text.feed(FENCED[:cut]) + text.feed(FENCED[cut:]) == "You're welcome!", cut
    call = steps.read(response('```\n{"name": "memory", "arguments": {}}\n```'), ["memory"], "c")
    assert call.tool_calls[0].name == "memory"
    # Anything else in a fence is text, streamed and kept as written.
    code = "```python\nprint(17 * 23)\n```"
    assert steps.read(response(code), ["memory"], "c") == response(code)
    for cut in range(1, len(code)):
        text = steps.ReplyText(["memory"])
        assert text.feed(code[:cut]) + text.feed(code[cut:]) == code, cut
    quoted = steps.ReplyText(["memory"])
    assert quoted.feed("`ls` lists") == "`ls` lists"


def test_a_step_object_after_words_of_its_own_is_read_as_the_object() -> None:
    # The 1.5B model in a free step: "To say 'good morning' in Spanish, you would say:"
    # and a fenced reply object, accepted as the answer with its JSON before this.
    said = 'To say "good morning" in Spanish, you would say:\n\n' + FENCED
    assert steps.read(response(said), ["memory"], "c").text == "You're welcome!"
    call = 'I will store it. {"name": "memory", "arguments": {"action": "list"}}'
    assert steps.read(response(call), ["memory"], "c").tool_calls[0].arguments == {"action": "list"}
    # A tool nobody offered, or not a step object at the end: the text as it came (the
    # answer check reads it).
    invented = 'Call it: {"name": "find_capital", "arguments": {"q": "France"}}'
    assert steps.read(response(invented), ["memory"], "c") == response(invented)
    for text in ('Use {"a": 1} here.', "A set: {1, 2}", 'Odd: {"name": 5}', "{" * 3000 + "}"):
        assert steps.read(response(text), ["memory"], "c") == response(text)


@pytest.mark.parametrize(
    ("setting", "provider", "url", "on"),
    [
        ("auto", "openai", "http://127.0.0.1:8080/v1", True),
        ("auto", "ollama", "http://localhost:11434", True),
        ("auto", "openai", "http://[::1]:8080/v1", True),
        ("auto", "openai", "https://api.example.com/v1", False),
        ("on", "openai", "https://api.example.com/v1", True),
        ("off", "ollama", "http://127.0.0.1:11434", False),
        ("on", "anthropic", "http://127.0.0.1:9000", False),
    ],
)
def test_structured_steps_are_on_for_a_model_served_on_this_machine(
    setting: steps.Structured, provider: str, url: str, on: bool
) -> None:
    assert steps.enabled(setting, provider, url) is on


def test_each_wire_that_can_carries_the_schema_in_its_own_key() -> None:
    request = ModelRequest(
        system="s", messages=(ChatMessage(role="user", text="hi"),), tools=(CLOCK,)
    )
    schema = steps.schema(request.tools)
    openai = WIRES["openai"].body(request, "m", stream=True)
    WIRES["openai"].constrain(openai, schema, 0.0)
    assert openai["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "step", "schema": schema},
    }
    assert openai["temperature"] == 0.0  # a step is a decision: sampled at 0 by default
    ollama = WIRES["ollama"].body(request, "m", stream=True)
    WIRES["ollama"].constrain(ollama, schema, None)
    assert ollama["format"] == schema and "temperature" not in ollama.get("options", {})
    WIRES["ollama"].constrain(ollama, schema, 0.2)
    assert ollama["options"]["temperature"] == 0.2
    with pytest.raises(ValueError):
        WIRES["anthropic"].constrain(
            WIRES["anthropic"].body(request, "m", stream=True), schema, None
        )

"""What counts as an answer, a channel's prompt as sent, and what a framework seed offers.

Each text below is one the real Qwen2.5-Coder-1.5B wrote on llama.cpp as its
final answer (tools/bench/bench_real_model.py transcripts, December 2026).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from chalie.conversation.answers import unfit
from chalie.conversation.channels import SHIPPED
from chalie.discovery.cascade import SEED_CEILING, EntryOutcome, FindResult, confident

OFFERED = ("find_tools", "find_skills", "memory", "clock", "calculator")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("```", "markup"),
        ("<tools></tools>", "markup"),
        ("<tool_response> [end:clock] </tool_response>", "markup"),
        (
            '<tools> {"query": ["time", "sydney"], "act_summary": "Get the time."} </tools>',
            "markup",
        ),
        ('[clock(status=success)]\n{"zone":"UTC"}\n[end:clock]', "markup"),
        ('{"type": "object", "properties": {"query": {"type": "string"}}}', "schema"),
        (
            "To find the time in Tokyo, you can call the `clock` function with action `now` "
            "and zone `Asia/Tokyo`.",
            "described-call",
        ),
        ("you can use the `find_tools` function with the query 'weather'", "described-call"),
        (
            "To find out the weather in Valletta, you can use the find_weather function.",
            "described-call",
        ),
        (
            "To calculate 17*23, I would use the calculator function with the expression 23 * 17.",
            "described-call",
        ),
        (
            "You can use the following Python code:\n```python\nprint(17 * 23)\n```",
            "described-call",
        ),
        ("you would use the following function call:", "described-call"),
        (
            # a call of a tool nobody offered, written out (the compact listing's shape)
            'Let\'s call it "find_capital_of_france".\n\n{"name": "find_capital_of_france", '
            '"arguments": {"query": "The capital of France"}}',
            "described-call",
        ),
    ],
)
def test_what_the_real_model_wrote_instead_of_an_answer_is_refused(text: str, why: str) -> None:
    assert unfit(text, OFFERED) == why


@pytest.mark.parametrize(
    "text",
    [
        "It is 21:14 in Tokyo (Monday).",
        "17 \u00d7 23 = 391.",
        "Your calendar shows a dentist appointment tomorrow at 15:00.",
        "Hello! How can I help you today?",
        "I used the clock: it is 10:00 in Tokyo.",
        "You can call the bakery to order a cake.",
        "Paris is the capital of France.",
        "I have no tool for exchange rates; at about 0.92 euros a dollar, 300 USD is 276 EUR.",
    ],
)
def test_plain_answers_pass_even_when_they_name_a_tool(text: str) -> None:
    assert unfit(text, OFFERED) == ""


def test_a_prompt_never_names_a_meta_tool_its_channel_does_not_offer() -> None:
    background = SHIPPED["subconscious"]
    assert "find_tools" in background.prompt()
    closed = replace(background, find_tools=False)
    assert "find_tools" not in closed.prompt() and "find_skills" not in closed.prompt()
    assert closed.prompt().startswith("You are Chalie") and "plain-text answer" in closed.prompt()
    for channel in SHIPPED.values():
        if not channel.find_tools:
            assert "find_tools" not in channel.prompt(), channel.name


def _vector(query: str, *hits: tuple[str, float]) -> EntryOutcome:
    return EntryOutcome(
        query, "vector", tuple(n for n, _ in hits), distances=tuple(d for _, d in hits)
    )


def test_a_seed_offers_only_what_clearly_fits() -> None:
    found = FindResult(
        entries=[
            _vector("what time is it in Tokyo", ("clock", 0.0), ("calendar", 0.148)),
            _vector("thanks, that's all", ("clock", 0.686), ("weather", 0.769)),
            _vector("email to maria", ("contacts", 0.498), ("reminder", 0.568), ("email", 0.632)),
            EntryOutcome("web_search", "exact", ("web_search",)),
        ]
    )
    assert confident(found) == ["clock", "contacts", "web_search"]
    far = FindResult(entries=[_vector("hm", ("weather", SEED_CEILING + 0.01))])
    assert confident(far) == []

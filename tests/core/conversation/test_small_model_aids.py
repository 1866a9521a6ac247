"""The small-model aids, each against what the real 1.5B model did (the real-models issue).

The scripted model reacts the way Qwen2.5-Coder-1.5B was seen to on llama.cpp:
it calls a tool only when the tool is offered, describes a call in words or
writes only markup, says how it would compute a result instead of giving it,
and calls find_skills where find_tools was meant. Each test runs it through a
real daemon on the ``small`` model (the aids as shipped); the same script on a
model with the aids off shows what they change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from actors.gate.policy import PolicyActor
from chalie.conversation import act, answers
from chalie.wire.events import TextDelta, ToolFinished
from chalie.wire.messages import TurnContext
from tests.core.conversation.harness import Harness
from tools.fake_llm.script import offered_tools
from tools.fake_llm.sloppy import call, clock, step
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

TIME = "what time is it in Tokyo right now"
QUESTION = "What's my sister's name?"
# What the model writes when it has no clock offered, or is not yet told to answer.
DESCRIBED = "To find the time in Tokyo, you can call the `clock` function with zone Asia/Tokyo."
ANSWER = {"text": "It is {last_result}"}


def channels() -> str:
    return "\n".join(
        [
            "[channels.plain-bg]",  # the aids off, the same model otherwise
            'model = "default"',
            "[channels.small-chat]",  # the shipped chat channel's set-up on the small model
            'model = "small"',
            "human_present = true",
            'policy_channel = "chat"',
            'pinned = ["memory"]',
            "[chat]",
            "port = 0",
            "[mcp_server]",
            "port = 0",
        ]
    )


@pytest.fixture(scope="module")
def h() -> Iterator[Harness]:
    harness = Harness(channels() + "\n")
    policy = harness.rt.child("policy", PolicyActor)
    for tool in ("clock", "calculator"):
        policy.call(PolicyActor.set, "subconscious", tool, "allow")
    # The seed needs the index: a turn before it is built gets no seed (and its model no tool).
    discovery = harness.rt.services.discovery
    assert discovery is not None
    wait_until(lambda: "clock" in discovery.find(["clock"]).names, 120, "the tool index")
    try:
        yield harness
    finally:
        harness.close()


def tools_of(h: Harness, i: int) -> list[str]:
    return offered_tools("openai", h.server.requests[i]["body"])


def last_user(h: Harness, i: int) -> str:
    messages = h.server.requests[i]["body"]["messages"]
    return str([m for m in messages if m["role"] == "user"][-1]["content"])


def run(h: Harness, script: dict[str, Any], text: str, channel: str = "small-bg") -> Any:
    h.script(script)
    accepted = h.send(text, channel)
    return accepted, h.finished(accepted, 90)  # a seed embeds the message: slow on a busy machine


def last_result(h: Harness, i: int) -> str:
    return str(h.server.requests[i]["body"]["messages"][-1]["content"])


# After a result: the answer when told to give one, else how it would do it (as seen).
HOW = "To calculate 17*23, I would use the calculator function with the expression 23 * 17."
TOLD = {"cases": [{"result_has": "Answer the user now", "then": ANSWER}], "text": HOW}


def test_the_seed_offers_a_tool_that_clearly_fits_in_the_first_request(h: Harness) -> None:
    # The model calls the clock when it sees one and describes the call otherwise.
    script = {
        "on_user": {"cases": [{"offered": "clock", "then": step(clock())}], "text": DESCRIBED},
        "on_tool": ANSWER,
    }
    accepted, end = run(h, script, TIME)
    assert end.reason == "final" and "Asia/Tokyo" in end.text, end.text
    assert "clock" in tools_of(h, 0)  # offered at step one, no find_tools step
    assert len(h.server.requests) == 2
    finished = h.of(accepted.conversation_id, ToolFinished)
    assert [(e.tool, e.status) for e in finished] == [("clock", "success")]  # the seed: no step
    # Without the aids the same model never gets the clock and describes the call.
    _, plain = run(h, script, TIME, "plain-bg")
    assert "clock" not in tools_of(h, 0) and plain.text == DESCRIBED


def step_names(body: dict[str, Any]) -> list[str]:
    """The names a step object may carry, from the request's output schema."""
    schema = body["response_format"]["json_schema"]["schema"]
    return [alt["properties"]["name"]["const"] for alt in schema["oneOf"]]


def test_a_free_step_answered_as_a_fenced_step_object_is_the_answer(h: Harness) -> None:
    # What the 1.5B model wrote to "Thanks, that's all for now." (no tool fits, so the
    # step is free text) once the compact listing had shown it the step object's shape:
    # the rescue read it as a call of a tool named reply.
    fenced = '```json\n{"name": "reply", "arguments": {"text": "You are welcome!"}}\n```'
    accepted, end = run(h, {"on_user": {"text": fenced, "chunk": 4}}, "Thanks, that's all.")
    assert end.reason == "final" and end.text == "You are welcome!", end
    assert "response_format" not in h.server.requests[0]["body"]  # a free step
    assert h.of(accepted.conversation_id, ToolFinished) == []
    shown = "".join(e.text for e in h.of(accepted.conversation_id, TextDelta))
    assert shown == end.text


def test_a_structured_step_is_a_call_or_an_answer_and_the_answer_streams_as_text(
    h: Harness,
) -> None:
    # The server holds the output to the step schema, as llama.cpp's grammar does; the
    # seed offered the calculator, and the model answers without it.
    script = {"schema": "honour", "on_user": {"text": "It is 391.", "chunk": 3}}
    accepted, end = run(h, script, "What is 17 * 23?")
    assert end.reason == "final" and end.text == "It is 391.", end
    first = h.server.requests[0]["body"]
    assert step_names(first) == ["find_tools", "find_skills", "calculator", "reply"]
    # The tools are listed at the end of the system prompt, one line each, not as the
    # request's tools (their whole schemas are the grammar's).
    assert "tools" not in first and tools_of(h, 0) == step_names(first)[:-1]
    system = first["messages"][0]["content"]
    assert "\n- calculator(expression" in system and '"name": "reply"' in system
    # The answer came as an object; the person saw its text stream, never the JSON.
    shown = "".join(e.text for e in h.of(accepted.conversation_id, TextDelta))
    assert shown == end.text
    # A model with the aid off (plain-bg: structured_steps off) gets no schema, and its
    # tools as the request's tools.
    run(h, script, "What is 17 * 23?", "plain-bg")
    plain = h.server.requests[0]["body"]
    assert "response_format" not in plain and "find_tools" in json.dumps(plain["tools"])
    assert "\n- find_tools(" not in plain["messages"][0]["content"]


def test_a_step_without_a_discovered_tool_is_free_text(h: Harness) -> None:
    # Held to an object with only the channel's own tools, the real model called
    # find_skills or memory for "Who wrote Hamlet?" instead of answering.
    _, end = run(h, {"schema": "honour", "on_user": {"text": "Shakespeare."}}, "Who wrote Hamlet?")
    assert end.reason == "final" and end.text == "Shakespeare."
    assert "response_format" not in h.server.requests[0]["body"]


def test_a_structured_call_is_made_and_the_answer_after_it_is_free_text(h: Harness) -> None:
    calc = call("calculator", {"expression": "17*23"})  # no act_summary: optional there
    script = {
        "schema": "honour",
        "on_user": {"cases": [{"offered": "calculator", "then": step(calc)}], "text": HOW},
        "on_tool": TOLD,
    }
    accepted, end = run(h, script, "What is 17 * 23?")
    assert end.reason == "final" and end.text.startswith("It is") and "391" in end.text, end
    assert "calculator" in step_names(h.server.requests[0]["body"])
    finished = h.of(accepted.conversation_id, ToolFinished)
    assert [(e.tool, e.status) for e in finished] == [("calculator", "success")]
    # Held to an object after a success, the real model called the tool again or stored
    # the result in memory; the answer after a success is asked for in words.
    assert "response_format" not in h.server.requests[1]["body"]
    assert last_result(h, 1).endswith(answers.ANSWER_NOTE)


def test_the_seed_offers_a_tool_the_message_names_when_nothing_else_fits(h: Harness) -> None:
    # Nothing came near enough for the seed on its own (the real-model run: 0.62).
    text = "Search the web: when is the Grand Harbour Maritime Museum open?"
    _, end = run(h, {"on_user": {"text": "9 to 5."}}, text)
    assert end.reason == "final"
    assert "web_search" in tools_of(h, 0), tools_of(h, 0)


def test_the_seed_offers_nothing_for_chit_chat(h: Harness) -> None:
    _, end = run(h, {"on_user": {"text": "You're welcome!"}}, "Thanks, that's all for now.")
    assert end.reason == "final" and end.text == "You're welcome!"
    assert sorted(tools_of(h, 0)) == ["find_skills", "find_tools"]  # the channel's own only


def test_a_described_call_is_not_an_answer_and_the_model_is_asked_to_make_it(
    h: Harness,
) -> None:
    made = {
        "cases": [{"user_has": "Do not describe", "then": step(clock())}],
        "text": DESCRIBED,
        "chunk": 9,  # streamed in small pieces, as a model writes
    }
    accepted, end = run(h, {"on_user": made, "on_tool": ANSWER}, "hm, Tokyo?")
    assert end.reason == "final" and end.text.startswith("It is"), end.text
    # the person saw only the answer stream: the described call was held, never shown
    shown = "".join(e.text for e in h.of(accepted.conversation_id, TextDelta))
    assert shown == end.text
    assert last_user(h, 1) == answers.retry_note("described-call")
    # the refused text never joined the history
    assert all(DESCRIBED not in str(m) for m in h.server.requests[1]["body"]["messages"])


@pytest.mark.parametrize(
    "markup", ["```", "<tools></tools>", "<tool_response> [end:clock] </tool_response>"]
)
def test_markup_twice_ends_the_turn_without_a_final_answer(h: Harness, markup: str) -> None:
    _, end = run(h, {"on_user": {"text": markup}}, "hm?")
    assert end.reason == "empty-answer" and end.text == act.EMPTY_LINE
    assert len(h.server.requests) == 2 and last_user(h, 1) == answers.retry_note("markup")


def test_after_a_success_the_model_is_asked_for_the_answer_with_the_result(h: Harness) -> None:
    calc = call("calculator", {"expression": "17*23", "act_summary": "multiplying"})
    accepted, end = run(h, {"steps": [step(calc)], "on_tool": TOLD}, "What is 17 * 23?")
    assert end.reason == "final" and "391" in end.text, end.text
    assert last_result(h, 1).endswith(answers.ANSWER_NOTE)
    # the note is for that request only: the stored result is the tool's own
    assert answers.ANSWER_NOTE not in str(h.history(accepted.conversation_id))
    # Without the aids the description was taken as the answer (what the real model got).
    _, plain = run(h, {"steps": [step(calc)], "on_tool": TOLD}, "What is 17 * 23?", "plain-bg")
    assert plain.reason == "final" and plain.text == HOW


def test_a_result_described_even_after_the_note_ends_with_the_result_not_the_description(
    h: Harness,
) -> None:
    calc = call("calculator", {"expression": "17*23", "act_summary": "multiplying"})
    script = {"steps": [step(calc)], "on_tool": {"text": HOW}, "on_user": {"text": HOW}}
    _, end = run(h, script, "What is 17 * 23?")
    assert end.reason == "empty-answer" and HOW not in end.text
    assert "391" in end.text  # the result in hand reaches the person


def test_find_skills_taken_for_find_tools_still_reaches_the_tool(h: Harness) -> None:
    skills = call("find_skills", {"query": ["multiply two numbers"], "act_summary": "looking"})
    calc = call("calculator", {"expression": "17*23", "act_summary": "multiplying"})
    on_tool = {
        "cases": [
            {"result_has": "Answer the user now", "then": ANSWER},
            {"offered": "calculator", "then": step(calc)},
        ],
        "text": HOW,
    }
    _, end = run(h, {"steps": [step(skills)], "on_tool": on_tool}, "hm")
    assert end.reason == "final" and "391" in end.text, end.text
    assert "calculator" not in tools_of(h, 0) and "calculator" in tools_of(h, 1)
    assert "No playbook matched" in last_result(h, 1)


def test_a_find_that_finds_nothing_says_no_such_tool_exists(h: Harness) -> None:
    find = call("find_tools", {"query": ["tell me a joke"], "act_summary": "x"})
    script = {"steps": [step(find)], "on_tool": {"text": "I cannot convert currencies."}}
    _, end = run(h, script, "hm")
    assert end.reason == "final"
    assert "No tool exists" in last_result(
        h, 1
    ) and "answer the user from what you know" in last_result(h, 1)


def test_a_turn_with_a_human_carries_what_memory_holds_about_the_message(h: Harness) -> None:
    store = call(
        "memory", {"action": "store", "text": "My sister's name is Ana.", "act_summary": "noting"}
    )
    _, stored = run(
        h, {"steps": [step(store)], "on_tool": {"text": "Noted."}}, "remember it", "small-chat"
    )
    assert stored.reason == "final", stored.text
    desk = h.rt.services.memory
    assert desk is not None
    owner = TurnContext(conversation_id="c", turn_id="t", channel="chat")
    wait_until(  # a memory is recalled once the store's index has it
        lambda: desk.book.recall(desk.readable(owner), query=QUESTION, k=5), 30, "the memory"
    )
    accepted, end = run(h, {"on_user": {"text": "Ana."}}, "What's my sister's name?", "small-chat")
    assert end.reason == "final"
    asked = last_user(h, 0)
    assert asked.endswith("What's my sister's name?") and "My sister's name is Ana." in asked
    assert asked.startswith("What you remember")
    # the brief is the request's only: the stored message is the person's words
    assert h.history(accepted.conversation_id)[0].text == "What's my sister's name?"
    # no human, no brief; nothing relevant, no brief
    run(h, {"on_user": {"text": "Ana."}}, "What's my sister's name?", "small-bg")
    assert last_user(h, 0) == "What's my sister's name?"
    run(h, {"on_user": {"text": "Hi."}}, "zq xv wk", "small-chat")
    assert last_user(h, 0) == "zq xv wk"


def test_the_tools_a_matched_playbook_names_become_callable(h: Harness) -> None:
    skills = call("find_skills", {"query": ["research a question online"], "act_summary": "x"})
    script = {"steps": [step(skills)], "on_tool": {"text": "I will search."}}
    run(h, script, "hm")
    assert "research_a_question" in last_result(h, 1)
    assert "web_search" in tools_of(h, 1) and "web_search" not in tools_of(h, 0)

"""A sloppy small model: each of its habits followed through the real daemon to the outcome."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from actors.gate.policy import PolicyActor
from chalie.wire.events import TextDelta, ToolStarted
from tests.core.conversation.harness import Harness
from tools.fake_llm.sloppy import Sloppy, library
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

LIBRARY = library()


def channels_toml() -> str:
    lines = []
    for wire in ("openai", "ollama"):
        lines += [f"[channels.sloppy-finding-{wire}]", f'model = "{wire}"']
        lines += [
            f"[channels.sloppy-direct-{wire}]",
            f'model = "{wire}"',
            'pinned = ["clock", "calculator"]',
            "find_tools = false",
        ]
    lines += ["[chat]", "port = 0", "[mcp_server]", "port = 0"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def h() -> Iterator[Harness]:
    harness = Harness(channels_toml())
    policy = harness.rt.child("policy", PolicyActor)
    for tool in ("clock", "calculator"):
        policy.call(PolicyActor.set, "subconscious", tool, "allow")
    try:
        yield harness
    finally:
        harness.close()


def run(h: Harness, case: Sloppy) -> Any:
    h.script(case.script)
    accepted = h.send(case.prompt, f"sloppy-{case.kind}-{case.wire}")
    return accepted, h.finished(accepted)


@pytest.mark.parametrize("case", LIBRARY, ids=[c.name for c in LIBRARY])
def test_each_sloppy_habit_ends_with_the_right_answer(h: Harness, case: Sloppy) -> None:
    _, end = run(h, case)
    assert end.reason == "final", (end.reason, end.text)
    assert case.expect in end.text, end.text


def case_named(name: str) -> Sloppy:
    return next(c for c in LIBRARY if c.name == name)


def trail_rows(h: Harness, conversation_id: str) -> list[Any]:
    from actors.calls.dispatcher import DispatcherActor

    rows: list[Any] = h.rt.child("dispatcher", DispatcherActor).call(
        DispatcherActor.trail, conversation_id=conversation_id, limit=50
    )
    return rows


def test_each_healing_is_recorded_on_the_trail(h: Harness) -> None:
    accepted, _ = run(h, case_named("summary-missing"))
    (row,) = trail_rows(h, accepted.conversation_id)
    assert row.status == "success" and row.healed == "act_summary missing: written from the tooltip"
    assert row.act_summary == "Arithmetic and math expressions (expression=1234*5678)"
    started = [e for e in h.stored(accepted.conversation_id) if isinstance(e, ToolStarted)]
    assert [e.act_summary for e in started] == [row.act_summary]  # the user sees the same
    accepted, _ = run(h, case_named("bare-array"))
    finds = [r for r in trail_rows(h, accepted.conversation_id) if r.tool == "find_tools"]
    assert finds[0].healed.startswith("a bare array was read as query")


def test_a_call_written_as_text_is_never_streamed_as_an_answer(h: Harness) -> None:
    accepted, end = run(h, case_named("text-prose-direct"))
    shown = "".join(e.text for e in h.stored(accepted.conversation_id) if isinstance(e, TextDelta))
    assert "Let me work that out." in shown  # the prose around the call is text
    assert '"name"' not in shown and "```" not in shown.split("Here it is")[0]
    assert end.reason == "final"


def test_an_unknown_name_is_answered_with_the_closest_tool_and_it_is_injected(h: Harness) -> None:
    _, end = run(h, case_named("invented-multiply-finding"))
    second = h.server.requests[1]["body"]
    result = second["messages"][-1]["content"]
    assert "code=unknown-tool" in result and 'valid values: ["calculator"]' in result
    assert "calculator" in [t["function"]["name"] for t in second["tools"]]
    assert end.reason == "final"


def test_a_repeat_after_a_result_is_not_run_and_the_next_request_has_no_tools(h: Harness) -> None:
    accepted, end = run(h, case_named("repeat-after-result-direct"))
    rows = trail_rows(h, accepted.conversation_id)
    assert [r.tool for r in rows] == ["clock"]  # run once
    last = h.server.requests[-1]["body"]
    assert "tools" not in last or not last["tools"]
    assert "do not call a tool again" in last["messages"][-1]["content"]
    assert end.reason == "final"


def test_the_repeat_guard_after_a_success_gives_the_user_the_result(h: Harness) -> None:
    # The Anthropic wire keeps its tools (its API wants them beside tool blocks), so a
    # model that ignores the note reaches the guard, which hands over the result.
    again = {"tool_calls": [{"name": "calculator", "arguments": {"expression": "2+2"}}]}
    h.script({"on_user": again, "on_tool": again})
    accepted = h.send("2+2", "bg-anthropic")
    end = h.finished(accepted)
    assert end.reason == "guard-repeat"
    assert '"result":"4"' in end.text and end.text.startswith("I stopped")
    assert len(trail_rows(h, accepted.conversation_id)) == 1


def test_one_info_line_a_turn_without_content_or_arguments(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="chalie.turn"):
        accepted, _ = run(h, case_named("invented-multiply-direct"))
        wait_until(
            lambda: any("turn ended" in r.getMessage() for r in caplog.records), 10, "the line"
        )
    lines = [r.getMessage() for r in caplog.records if "turn ended" in r.getMessage()]
    assert len(lines) == 1
    line = lines[0]
    assert f"conversation={accepted.conversation_id}" in line
    assert "channel=sloppy-direct-openai" in line and "steps=3" in line
    assert "tools=multiply:unknown-tool,calculator:success" in line
    assert "reason=final" in line and "duration=" in line
    assert "please" not in line and "17*3" not in line  # no content, no arguments


def test_a_small_catalogue_does_not_bring_an_unrelated_tool_along(h: Harness) -> None:
    discovery = h.rt.services.discovery
    for query in ("time", "what time is it", "what time is it in Tokyo"):
        names = discovery.find([query]).names
        # the calendar, the one other built-in about times, may follow the clock; nothing else
        assert names[0] == "clock" and set(names) <= {"clock", "calendar"}, (query, names)
    for query in ("multiply", "math", "calculate percentage"):
        assert discovery.find([query]).names == ["calculator"], query


def test_with_rescue_off_a_call_written_as_text_is_the_answer(h: Harness) -> None:
    case = case_named("text-bare-direct")
    h.script(case.script)
    end = h.finished(h.send(case.prompt, "literal"))
    assert end.reason == "final" and end.text.startswith('{"name": "calculator"')


def test_with_answer_nudge_off_a_repeat_keeps_its_tools_but_is_not_run(h: Harness) -> None:
    case = case_named("repeat-after-result-direct")
    h.script(case.script)
    accepted = h.send(case.prompt, "literal")
    end = h.finished(accepted)
    assert end.reason == "final" and case.expect in end.text  # the note alone was enough
    assert [r.tool for r in trail_rows(h, accepted.conversation_id)] == ["clock"]
    assert h.server.requests[-1]["body"].get("tools")


def test_hostile_or_doubled_raw_arguments_never_break_the_turn(h: Harness) -> None:
    h.script(
        {
            "steps": [
                {"tool_calls": [{"name": "calculator", "raw": "[" * 5000}]},
                {"tool_calls": [{"name": "calculator", "raw": '{{"expression": "6*7"}}'}]},
                {"text": "Here it is: {last_result}"},
            ]
        }
    )
    end = h.finished(h.send("six times seven", "sloppy-direct-openai"))
    assert end.reason == "final" and '"result":"42"' in end.text
    first = h.server.requests[1]["body"]["messages"][-1]["content"]
    assert "code=invalid-param" in first

"""A background result that reaches an idle conversation starts a turn that tells the person."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chalie.calls.envelope import render
from chalie.result import ToolResult
from chalie.wire.events import BackgroundResult, TurnFinished, TurnStarted
from tests.core.conversation.harness import Harness, assert_valid_history
from tools.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def h() -> Iterator[Harness]:
    harness = Harness()
    try:
        yield harness
    finally:
        harness.close()


def result(cid: str, call_id: str, tool: str = "clock") -> BackgroundResult:
    return BackgroundResult(
        call_id=call_id,
        conversation_id=cid,
        tool=tool,
        envelope=render(tool, ToolResult.success({"iso": "2026-12-01T19:00:00+00:00"})),
        status="success",
    )


def test_an_idle_conversation_hears_about_a_background_result(h: Harness) -> None:
    h.script({"steps": [{"text": "Sure."}, {"text": "It is 19:00 UTC."}]})
    first = h.send("check the time later", "chat")
    cid = first.conversation_id
    assert h.finished(first).text == "Sure."
    h.rt.events.publish(cid, result(cid, "late-1"))
    finished = wait_until(
        lambda: [e for e in h.of(cid, TurnFinished) if e.turn_id != first.turn_id],
        30,
        "a turn started by the result",
    )
    assert finished[0].text == "It is 19:00 UTC."
    started = [e for e in h.of(cid, TurnStarted) if e.turn_id == finished[0].turn_id]
    assert started[0].text.startswith("[background: the clock call you started earlier")
    # the model saw the result itself in that turn's request
    assert "2026-12-01T19:00:00+00:00" in str(h.server.requests[-1]["body"]["messages"])
    # delivered again (a reconnect, a restart): no second announcement
    h.rt.events.publish(cid, result(cid, "late-1"))
    h.script({"steps": [{"text": "You're welcome."}]})
    last = h.send("thanks", "chat", conversation_id=cid)
    assert h.finished(last).text == "You're welcome."
    assert len(h.of(cid, TurnFinished)) == 3
    assert len(h.of(cid, BackgroundResult)) == 1
    assert_valid_history(h.history(cid))


def test_a_reminders_answer_is_shown_not_announced_again(h: Harness) -> None:
    h.script({"steps": [{"text": "Hi."}]})
    first = h.send("hello", "chat")
    cid = first.conversation_id
    h.finished(first)
    h.rt.events.publish(cid, result(cid, "reminder-1-1", tool="reminder"))
    wait_until(lambda: h.of(cid, BackgroundResult), 10, "the reminder in the chat")
    assert len(h.of(cid, TurnFinished)) == 1

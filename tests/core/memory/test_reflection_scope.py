"""Which conversations reflection reads, and whose memories it makes.

An agent's conversation (the ``external_agent`` channel, its token the principal) is reflected
on into that agent's memories, never the owner's; a ``subconscious`` conversation (a reminder's
turn) is never reflected on; the runtime's own follow-up text is not taken for anyone's words.
A real daemon, its scheduler on an injected clock, the scripted model on loopback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from actors.conversation.conversations import Conversations
from chalie.conversation.background import follow_up_text
from chalie.conversation.requests import SendMessage
from chalie.memory.reflection import reflection_request, transcript
from chalie.memory.whose import AGENT_PREFIX, OWNER
from chalie.providers.types import ChatMessage
from chalie.schedule.clock import ManualClock
from chalie.wire.events import BackgroundResult
from chalie.wire.messages import Accepted
from chalie.wire.principals import Principal
from tests.core.conversation.harness import Harness
from tests.core.memory.reflecting import reflection_harness, scheduler_status
from tools.waiting import wait_until

BOT = Principal(scope="agent", id="tok_reflect1", name="bookkeeper")
ANSWER = json.dumps(
    [
        {"text": "Invoices go to the Finance/2026 folder", "kind": "instruction"},
        {"text": "The quarterly report is due on 5 January", "kind": "event"},
    ]
)


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    return ManualClock(time.time())


@pytest.fixture(scope="module")
def h(clock: ManualClock) -> Iterator[Harness]:
    yield from reflection_harness(clock, tokens_per_day=5000)


status = scheduler_status


def send(h: Harness, text: str, channel: str, **kw: Any) -> str:
    accepted: Accepted = h.conversations.call(
        Conversations.submit,
        SendMessage(conversation_id=None, channel=channel, text=text, **kw),
    ).result(10)
    h.finished(accepted)
    return accepted.conversation_id


@pytest.mark.slow
def test_an_agents_conversation_makes_agent_memories_and_a_reminders_turn_none(
    h: Harness, clock: ManualClock
) -> None:
    h.script({"steps": [{"text": "Noted."}, {"text": "Reminder: call the bank."}]})
    agent_cid = send(
        h,
        "File every invoice under Finance/2026; the quarterly report is due 5 January.",
        "external_agent",
        principal=BOT,
        origin="mcp:bookkeeper",
        client_msg_id="a1",
    )
    send(
        h,
        "[reminder 1, due 2026-12-01 09:00 UTC]\nThe person asked to be reminded: call the bank",
        "subconscious",
        origin="scheduler",
        client_msg_id="r1",
    )
    h.script({"steps": [{"text": ANSWER}]})  # (the model's requests are counted from here)
    clock.advance(max(0.0, time.time() - clock.now()) + 61)
    wait_until(lambda: status(h)["reflections"] == 1, 30, "the agent conversation's pass")
    request = h.server.requests[-1]["body"]
    said = request["messages"][-1]["content"]
    assert "Agent: File every invoice" in said and "Person:" not in said
    assert len(h.server.requests) == 1  # one pass: the reminder's turn was not read

    book = h.rt.services.memory.book
    key = AGENT_PREFIX + BOT.id
    kept = {m.text: m for m in book.recent([key]) if m.source == "reflection"}
    assert set(kept) == {
        "Invoices go to the Finance/2026 folder",
        "The quarterly report is due on 5 January",
    }
    assert all(m.conversation_id == agent_cid and m.principal == key for m in kept.values())
    assert not [m for m in book.recent([OWNER]) if m.source == "reflection"]
    assert [h.memory.text for h in book.recall([OWNER], query="where do invoices go")] == []

    # Later wakes find nothing more to read: the subconscious conversation is never due.
    wakes = status(h)["wakes"]
    clock.advance(3600)
    wait_until(lambda: status(h)["wakes"] > wakes, 30, "the scheduler to look again")
    assert status(h)["reflections"] == 1 and len(h.server.requests) == 1


def test_the_runtimes_follow_up_is_nobodys_words() -> None:
    result = BackgroundResult(
        call_id="c1", conversation_id="x", tool="web_fetch", envelope="[...]", status="success"
    )
    messages = [
        ChatMessage(role="user", text="Fetch the menu of the Lisbon place"),
        ChatMessage(role="assistant", text="Started."),
        ChatMessage(role="user", text=follow_up_text(result)),
        ChatMessage(role="assistant", text="The menu has grilled sardines."),
    ]
    text = transcript(messages)
    assert "background" not in text
    assert text.count("Person:") == 1 and "grilled sardines" in text
    # A conversation of follow-ups alone has no one's words to read.
    assert reflection_request(messages[2:]) is None
    agent = reflection_request(messages[:2], agent=True)
    assert agent is not None and "agent" in agent.system and "Agent: Fetch" in str(agent.messages)

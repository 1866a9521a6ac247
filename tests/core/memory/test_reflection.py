"""Reflection: an idle conversation read by the model once, its memories stored, in budget."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from chalie.memory.reflection import parse_memories
from chalie.schedule.clock import ManualClock
from tests.core.conversation.harness import Harness
from tests.core.memory.reflecting import reflection_harness, scheduler_status
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

ANSWER = (
    "Here you go:\n```json\n"
    + json.dumps(
        [
            {"text": "Has a dog called Rex", "kind": "fact"},
            {"text": "Flying to Oslo", "kind": "event", "time": "2026-12-20", "place": "Oslo"},
            "junk",
            {"kind": "fact"},
            {"text": "Prefers aisle seats", "kind": "preference", "skill": "plan_a_trip"},
        ]
    )
    + "\n```"
)


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    return ManualClock(time.time())


@pytest.fixture(scope="module")
def h(clock: ManualClock) -> Iterator[Harness]:
    yield from reflection_harness(clock, tokens_per_day=300)


status = scheduler_status


def chat(h: Harness, text: str) -> str:
    h.script({"steps": [{"text": "Noted."}]})
    accepted = h.send(text, "chat")
    h.finished(accepted)
    return accepted.conversation_id


def test_an_idle_conversation_is_reflected_on_once_within_the_daily_budget(
    h: Harness, clock: ManualClock
) -> None:
    cid = chat(h, "My dog is called Rex, and I fly to Oslo on 20 December. Aisle seat please.")
    h.script({"steps": [{"text": ANSWER, "input_tokens": 200, "output_tokens": 60}]})
    clock.advance(time.time() + 1 - clock.now())  # the clock catches up with the chat's time
    clock.advance(30)  # not idle long enough yet
    assert status(h)["reflections"] == 0
    clock.advance(31)
    wait_until(lambda: status(h)["reflections"] == 1, 30, "a reflection pass")
    book = h.rt.services.memory.book
    mine = {m.text: m for m in book.recent(["owner"]) if m.source == "reflection"}
    assert set(mine) == {"Has a dog called Rex", "Flying to Oslo", "Prefers aisle seats"}
    assert mine["Flying to Oslo"].time == "2026-12-20" and mine["Flying to Oslo"].place == "Oslo"
    assert all(m.conversation_id == cid for m in mine.values())
    assert book.rules(["owner"], ["plan_a_trip"])["plan_a_trip"] == ["Prefers aisle seats"]
    request = h.server.requests[-1]["body"]
    assert "worth" not in request["messages"][-1]["content"]  # the transcript, not the prompt
    assert "Person: My dog is called Rex" in request["messages"][-1]["content"]
    assert "tools" not in request or not request["tools"]
    # no news in that conversation: no second pass
    clock.advance(120)
    assert status(h)["reflections"] == 1
    # 260 tokens of 300 spent: the next pass may run, the one after that may not
    chat(h, "I started learning the cello.")
    h.script({"steps": [{"text": "[]", "input_tokens": 40, "output_tokens": 2}]})
    clock.advance(max(0.0, time.time() - clock.now()) + 61)
    wait_until(lambda: status(h)["reflections"] == 2, 30, "the second pass")
    chat(h, "My sister moved to Gozo.")
    asked = len(h.server.requests)
    clock.advance(max(0.0, time.time() - clock.now()) + 61)
    assert status(h)["reflections"] == 2 and len(h.server.requests) == asked  # budget spent
    clock.advance(86400)  # a new UTC day, a new budget
    h.script({"steps": [{"text": "[]"}]})
    wait_until(lambda: status(h)["reflections"] == 3, 30, "the pass the next day")


def test_a_model_answer_is_read_leniently() -> None:
    assert [d.text for d in parse_memories(ANSWER)] == [
        "Has a dog called Rex",
        "Flying to Oslo",
        "Prefers aisle seats",
    ]
    for junk in ("", "no", "[", '{"text": "x"}', "[1, 2]", '[{"text": 5}]', "null"):
        assert parse_memories(junk) == []
    assert len(parse_memories(json.dumps([{"text": f"m{i}"} for i in range(50)]))) == 12

"""Compaction: a history past the model's window is summarised by the model, not only trimmed."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from actors.conversation.conversations import Conversations
from chalie.conversation.compaction import SUMMARY_HEAD, SummaryStore
from tests.core.conversation.harness import Harness, assert_valid_history

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def h() -> Iterator[Harness]:
    harness = Harness()
    try:
        yield harness
    finally:
        harness.close()


def test_old_turns_become_a_stored_summary_and_the_originals_stay(h: Harness) -> None:
    h.script({"steps": [{"text": "Noted, apricot. " + "y" * 4000}]})
    first = h.send("my code word is apricot " + "z " * 2000, "roomy")
    cid = first.conversation_id
    h.finished(first)
    h.script(
        {
            "steps": [
                {"text": "The person's code word is apricot.", "input_tokens": 50},
                {"text": "It was apricot."},
            ]
        }
    )
    second = h.send("what was my code word?", "roomy", conversation_id=cid)
    assert h.finished(second).text == "It was apricot."
    summary_request, step_request = (r["body"] for r in h.server.requests[-2:])
    # the model was asked to summarise the turn that no longer fits...
    asked = summary_request["messages"][-1]["content"]
    assert asked.startswith("Person: my code word is apricot") and "tools" not in summary_request
    # ...and the step carried the summary in its place, then the new question
    contents = [m["content"] for m in step_request["messages"]]
    assert contents[-2] == f"{SUMMARY_HEAD}\nThe person's code word is apricot."
    assert contents[-1] == "what was my code word?"
    assert "z z z" not in json.dumps(step_request["messages"])
    store = SummaryStore(h.rt.db_path)
    try:
        summary = store.get(cid)
    finally:
        store.close()
    assert summary is not None and summary.upto == 2
    # the originals are all still stored
    history = h.history(cid)
    assert history[0].text.startswith("my code word is apricot") and len(history) == 4
    assert_valid_history(history)
    turns = h.conversations.call(Conversations.show, cid)["turns"]
    assert any("summarised" in note for note in turns[-1].notes)
    # the next turn reuses the stored summary without asking again
    h.script({"steps": [{"text": "Yes."}]})
    third = h.send("ok", "roomy", conversation_id=cid)
    assert h.finished(third).text == "Yes."
    contents = [m["content"] for m in h.server.requests[-1]["body"]["messages"]]
    assert contents[-4:] == [
        f"{SUMMARY_HEAD}\nThe person's code word is apricot.",
        "what was my code word?",
        "It was apricot.",
        "ok",
    ]


def test_a_summary_the_model_cannot_write_falls_back_to_trimming(h: Harness) -> None:
    h.script({"steps": [{"text": "Noted. " + "y" * 4000}]})
    first = h.send("remember plum " + "z " * 2000, "roomy")
    cid = first.conversation_id
    h.finished(first)
    h.script({"steps": [{"status": 400, "body": "no"}, {"text": "Plum, I think."}]})
    second = h.send("which fruit?", "roomy", conversation_id=cid)
    assert h.finished(second).text == "Plum, I think."
    last = h.server.requests[-1]["body"]["messages"]
    assert [m["content"] for m in last][1:] == ["which fruit?"]  # after the system prompt

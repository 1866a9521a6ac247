"""Conversations supervises its TurnActors by the declared rule (chalie_app.root.TURNS)."""

from __future__ import annotations

import pytest

from actors.conversation.conversations import Conversations
from chalie_app.root import TURNS
from tests.core.conversation.harness import Harness
from tools.waiting import wait_until

# Starts a daemon and a scripted model: deselect with -m "not slow".
pytestmark = pytest.mark.slow


def test_a_turn_actor_failing_past_the_intensity_restarts_the_conversations_supervisor() -> None:
    """The declared rule (chalie_app.root.TURNS): past its restarts in its period, the
    conversations supervisor escalates, and the root tree restarts it; it serves again."""
    h = Harness()  # its own daemon: the restarts of other tests count in the same window
    try:
        h.script({"steps": [{"text": "first"}], "on_user": {"text": "served again"}})
        first = h.send("one", "bg-openai")
        cid = first.conversation_id
        h.finished(first)
        for restarts in range(TURNS.intensity + 1):

            def running(n: int = restarts) -> bool:
                children = h.conversations.call(Conversations.status)["children"]
                return any(c["id"] == cid and c["alive"] and c["restarts"] == n for c in children)

            wait_until(running, what=f"the turn actor after {restarts} restarts")
            h.conversations.call(Conversations.crash, cid)
        assert h.rt.supervisor is not None

        def escalated() -> bool:
            tree = h.rt.supervisor.proxy().status().get(timeout=10)["children"]  # type: ignore[union-attr]
            return any(
                c["id"] == "conversations" and c["restarts"] == 1 and c["alive"] for c in tree
            )

        wait_until(escalated, what="the conversations supervisor restarted by the tree")
        again = h.send("two", "bg-openai", conversation_id=cid)
        assert h.finished(again).text == "served again"
    finally:
        h.close()

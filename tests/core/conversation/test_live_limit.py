"""The limit on conversation actors in memory ([conversations] max_live), on a daemon of its own.

Its own module: the other turn tests share one module-scoped daemon, and two
daemons in one process would share a port and pykka's registry.
"""

from __future__ import annotations

import pytest

from actors.conversation.conversations import Conversations
from tests.core.conversation.harness import Harness
from tools.waiting import wait_until

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow


def test_past_max_live_the_least_recently_used_idle_actors_stop_and_come_back() -> None:
    h = Harness(conversations="max_live = 2\nidle_stop = 600.0")
    try:
        # By reaction, not by step: a background request (examples written for discovery)
        # may reach the same scripted model at any time.
        h.script({"on_user": {"text": "you said: {last_user}"}})
        cids = []
        for i in range(3):
            sent = h.send(f"message {i}", "bg-openai")
            h.finished(sent)
            cids.append(sent.conversation_id)
        # the third actor pushed the first (idle, least recently used) out
        wait_until(
            lambda: h.conversations.call(Conversations.live) == 2,
            timeout=10,
            what="the oldest idle actor to stop",
        )
        assert not h.conversations.call(Conversations.show, cids[0])["live"]
        assert h.conversations.call(Conversations.show, cids[2])["live"]
        again = h.send("and again", "bg-openai", conversation_id=cids[0])
        assert h.finished(again).text == "you said: and again"
        asked = [
            [m["content"] for m in r["body"]["messages"]]
            for r in h.server.requests
            if r["body"]["messages"][-1]["content"] == "and again"
        ]
        # its history came back from storage
        assert [c[1:] for c in asked] == [["message 0", "you said: message 0", "and again"]]
    finally:
        h.close()

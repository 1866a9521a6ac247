"""The turn follower: one turn's events of a conversation, in order, each once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from chalie.conversation.follow import TurnFollower, follow_turn
from chalie.conversation.requests import SendMessage
from chalie.wire.bus import EventBus
from chalie.wire.events import (
    BackgroundResult,
    PermissionRequest,
    TextDelta,
    TurnFinished,
    TurnStarted,
)
from chalie.wire.messages import Accepted


def started(seq: int, turn: str, client: str) -> TurnStarted:
    return TurnStarted(
        conversation_id="c", seq=seq, ts=time.time(), turn_id=turn, client_msg_id=client, text="x"
    )


def delta(seq: int, turn: str) -> TextDelta:
    return TextDelta(conversation_id="c", seq=seq, ts=time.time(), turn_id=turn, text="t")


def finished(seq: int, turn: str) -> TurnFinished:
    return TurnFinished(
        conversation_id="c", seq=seq, ts=time.time(), turn_id=turn, reason="final", text="done"
    )


def test_only_the_turn_of_the_clients_message_is_followed_each_event_once() -> None:
    async def go() -> list[Any]:
        follow = TurnFollower(asyncio.get_running_loop(), "mine")
        live = [delta(2, "other"), started(3, "t2", "mine"), delta(4, "t2"), finished(5, "t2")]
        for event in live[2:]:
            follow.push(event)
        await asyncio.sleep(0)
        # the backfill overlaps the live feed and arrives after it: merged by seq
        follow.backfill([started(1, "t1", "theirs"), *live[:3]])
        got = []
        while not got or not isinstance(got[-1], TurnFinished):
            got.append(await follow.next())
        return got

    got = asyncio.run(go())
    assert [(type(e).__name__, e.seq) for e in got] == [("TextDelta", 4), ("TurnFinished", 5)]


class ScriptedPort:
    """A port whose one turn is published after the send returns."""

    def __init__(self) -> None:
        self.bus = EventBus()
        self.cancelled: list[str] = []

    async def send(self, msg: SendMessage) -> Accepted:
        loop = asyncio.get_running_loop()
        events = [started(1, "t1", msg.client_msg_id), delta(2, "t1"), finished(3, "t1")]
        for event in events:
            loop.call_later(0.01, self.bus.publish, "c", event)
        return Accepted(conversation_id="c", turn_id="t1", queued=False, duplicate=False)

    async def cancel(self, conversation_id: str) -> bool:
        self.cancelled.append(conversation_id)
        return True

    async def events(self, conversation_id: str, after_seq: int, limit: int) -> list[Any]:
        return []

    async def answer(self, request_id: str, answer: str) -> bool:
        return False

    def subscribe(self, conversation_id: str, callback: Any) -> Any:
        return self.bus.subscribe(conversation_id, callback)


def test_follow_turn_sends_and_returns_the_turns_end() -> None:
    port = ScriptedPort()
    msg = SendMessage(conversation_id="c", channel="chat", text="hi", client_msg_id="m1")
    outcome = asyncio.run(follow_turn(port, msg, timeout=10))
    assert outcome.finished.text == "done" and outcome.accepted.turn_id == "t1"
    assert port.cancelled == []


def test_a_turn_that_does_not_end_in_time_is_cancelled() -> None:
    port = ScriptedPort()
    msg = SendMessage(conversation_id="c", channel="chat", text="hi", client_msg_id="other")

    async def go() -> None:
        port.send = _silent  # type: ignore[method-assign]
        await follow_turn(port, msg, timeout=0.05)

    try:
        asyncio.run(go())
    except TimeoutError:
        pass
    else:
        raise AssertionError("no timeout")
    assert port.cancelled == ["c"]


async def _silent(msg: SendMessage) -> Accepted:
    return Accepted(conversation_id="c", turn_id="t9", queued=False, duplicate=False)


def test_a_kind_filtered_subscription_hears_only_its_kinds() -> None:
    bus = EventBus()
    heard: list[Any] = []
    bus.subscribe(None, heard.append, kinds=(BackgroundResult,))
    bus.publish("c", delta(1, "t"))
    request = PermissionRequest(
        request_id="r", conversation_id="c", channel="chat", permission="p", tool="t", expires_at=0
    )
    bus.publish("c", request)
    result = BackgroundResult(
        call_id="k", conversation_id="c", tool="t", envelope="", status="success"
    )
    bus.publish("c", result)
    assert heard == [result]

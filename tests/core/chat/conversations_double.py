"""A double of the Conversations actor: exact in its interface, scripted in its turns.

It is a real actor (``actors.actor.Actor``, so its answers call back)
with the Conversations actor's proxy methods (``submit``, ``cancel``, ``events``,
``answer``; each but ``events`` answering with a future, as the actor does), the
conversations' own types (``chalie.conversation.events`` and ``requests``; events
numbered per conversation from 1, stored before they are published on the EventBus),
a queue of one running turn per conversation, and ``client_msg_id`` deduplication.
Its turns follow the user's text:

- ``ask ...``: a tool call gated by ask: ``tool_started`` and a
  ``permission_request``; the turn waits for :meth:`answer`;
- ``hang ...``: a turn that runs until cancelled;
- ``fail ...``: the model is unreachable (``error`` + ``turn_finished(model-error)``);
- ``flood N``: N text deltas;
- anything else: an echo, in two deltas.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from actors.actor import Actor
from chalie.conversation.events import ConversationEvent as Event
from chalie.conversation.events import (
    ErrorEvent,
    PermissionRequest,
    PermissionSettled,
    TextDelta,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from chalie.conversation.requests import Accepted, ConversationError, SendMessage
from chalie.events import EventBus
from chalie.principals import Principal, may_answer

__all__ = ["Accepted", "FakeConversations", "SendMessage"]


@dataclass
class _Conversation:
    cid: str
    events: list[Event] = field(default_factory=list)
    running: str | None = None
    queue: list[tuple[str, SendMessage]] = field(default_factory=list)
    sent: dict[str, str] = field(default_factory=dict)  # client_msg_id -> turn_id


class FakeConversations(Actor):
    def __init__(self, bus: EventBus) -> None:
        super().__init__()
        self._bus = bus
        self._convs: dict[str, _Conversation] = {}
        self._pending: dict[str, tuple[str, str, str]] = {}  # request -> (cid, turn, call)
        self._ids = itertools.count(1)
        self.sends: list[SendMessage] = []

    # -- the Conversations port -----------------------------------------------------------------
    def submit(self, msg: SendMessage) -> concurrent.futures.Future[Accepted]:
        """The seam's async entry: the turn is taken (or queued) at once here."""
        out: concurrent.futures.Future[Accepted] = concurrent.futures.Future()
        try:
            out.set_result(self._send(msg))
        except Exception as exc:
            out.set_exception(exc)
        return out

    def _send(self, msg: SendMessage) -> Accepted:
        self.sends.append(msg)
        cid = msg.conversation_id or f"c{next(self._ids)}"
        conv = self._convs.setdefault(cid, _Conversation(cid))
        if msg.client_msg_id in conv.sent:
            return Accepted(
                conversation_id=cid,
                turn_id=conv.sent[msg.client_msg_id],
                queued=False,
                duplicate=True,
            )
        turn_id = f"t{next(self._ids)}"
        conv.sent[msg.client_msg_id] = turn_id
        if conv.running is not None and msg.busy == "cancel":
            self._finish(conv, "cancelled", "")
        if conv.running is not None:
            conv.queue.append((turn_id, msg))
            return Accepted(conversation_id=cid, turn_id=turn_id, queued=True, duplicate=False)
        self._start(conv, turn_id, msg)
        return Accepted(conversation_id=cid, turn_id=turn_id, queued=False, duplicate=False)

    def cancel(self, conversation_id: str) -> concurrent.futures.Future[bool]:
        return _done(self._cancel(conversation_id))

    def _cancel(self, conversation_id: str) -> bool:
        conv = self._convs.get(conversation_id)
        if conv is None or conv.running is None:
            return False
        for rid, (cid, _t, _c) in list(self._pending.items()):
            if cid == conversation_id:
                del self._pending[rid]
        self._finish(conv, "cancelled", "")
        return True

    def events(self, conversation_id: str, after_seq: int, limit: int) -> list[Event]:
        conv = self._convs.get(conversation_id)
        if conv is None:
            return []
        return conv.events[after_seq : after_seq + limit]

    def answer(
        self, request_id: str, answer: str, by: Principal | None = None, content: Any = None
    ) -> concurrent.futures.Future[bool]:
        if not may_answer(by, None):
            raise ConversationError("forbidden", "only the owner answers")
        return _done(self._answer(request_id, answer))

    def _answer(self, request_id: str, answer: str) -> bool:
        found = self._pending.pop(request_id, None)
        if found is None:
            return False
        cid, turn_id, call_id = found
        conv = self._convs[cid]
        self._emit(conv, PermissionSettled, request_id=request_id, answer=answer)
        if answer == "deny":
            self._emit(
                conv,
                ToolFinished,
                turn_id=turn_id,
                call_id=call_id,
                tool="clock",
                status="error",
                code="permission-denied",
            )
            self._emit(conv, TextDelta, turn_id=turn_id, text="I was not allowed to look.")
            self._finish(conv, "final", "I was not allowed to look.")
        else:
            self._emit(
                conv,
                ToolFinished,
                turn_id=turn_id,
                call_id=call_id,
                tool="clock",
                status="success",
                code=None,
            )
            self._emit(conv, TextDelta, turn_id=turn_id, text="It is 09:00 in Tokyo.")
            self._finish(conv, "final", "It is 09:00 in Tokyo.")
        return True

    # -- test hooks -----------------------------------------------------------------
    def emit_out_of_band(self, conversation_id: str, text: str, publish: bool) -> int:
        """Store a delta and publish it only if ``publish``: lets a test make a live gap."""
        conv = self._convs[conversation_id]
        event = TextDelta(
            conversation_id=conversation_id,
            seq=len(conv.events) + 1,
            ts=time.time(),
            turn_id="oob",
            text=text,
        )
        conv.events.append(event)
        if publish:
            self._bus.publish(conversation_id, event)  # type: ignore[arg-type]
        return event.seq

    def pending_requests(self) -> list[str]:
        return list(self._pending)

    # -- the scripted turn ----------------------------------------------------------
    def _emit(self, conv: _Conversation, kind: type[Event], **fields: Any) -> None:
        event = kind(conversation_id=conv.cid, seq=len(conv.events) + 1, ts=time.time(), **fields)
        conv.events.append(event)  # stored before it is published
        self._bus.publish(conv.cid, event)  # type: ignore[arg-type]

    def _start(self, conv: _Conversation, turn_id: str, msg: SendMessage) -> None:
        conv.running = turn_id
        self._emit(
            conv, TurnStarted, turn_id=turn_id, client_msg_id=msg.client_msg_id, text=msg.text
        )
        words = msg.text.split()
        head = words[0] if words else ""
        if head == "ask":
            call_id = f"call{next(self._ids)}"
            summary = "Reading the clock\x1b[2J\nin Tokyo"
            self._emit(
                conv,
                ToolStarted,
                turn_id=turn_id,
                call_id=call_id,
                tool="clock",
                act_summary=summary,
            )
            request_id = f"req{next(self._ids)}"
            self._pending[request_id] = (conv.cid, turn_id, call_id)
            self._emit(
                conv,
                PermissionRequest,
                request_id=request_id,
                turn_id=turn_id,
                tool="clock",
                permission="clock",
                act_summary=summary,
                params={"zone": "Asia/Tokyo"},
                expires_at=time.time() + 300,
            )
        elif head == "hang":
            self._emit(conv, TextDelta, turn_id=turn_id, text="working")
        elif head == "fail":
            self._emit(
                conv,
                ErrorEvent,
                turn_id=turn_id,
                code="model-unreachable",
                message="connection refused by the model at http://127.0.0.1:9",
            )
            self._finish(conv, "model-error", "")
        elif head == "flood":
            for i in range(int(words[1])):
                self._emit(conv, TextDelta, turn_id=turn_id, text=f"chunk {i} " + "x" * 200)
            self._finish(conv, "final", "flooded")
        else:
            self._emit(conv, TextDelta, turn_id=turn_id, text="echo: ")
            self._emit(conv, TextDelta, turn_id=turn_id, text=msg.text)
            self._finish(conv, "final", f"echo: {msg.text}")

    def _finish(self, conv: _Conversation, reason: Any, text: str) -> None:
        turn_id = conv.running
        assert turn_id is not None
        conv.running = None
        self._emit(conv, TurnFinished, turn_id=turn_id, reason=reason, text=text)
        if conv.queue:
            next_turn, msg = conv.queue.pop(0)
            self._start(conv, next_turn, msg)


def _done(value: bool) -> concurrent.futures.Future[bool]:
    out: concurrent.futures.Future[bool] = concurrent.futures.Future()
    out.set_result(value)
    return out

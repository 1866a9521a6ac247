"""The one double of the Conversations actor, for what stands on the conversations port.

:class:`ConversationsDouble` is a real actor (``actors.actor.Actor``, so its answers
call back) with the Conversations actor's proxy methods (``submit``, ``cancel``,
``events``, ``answer``; each but ``events`` answering with a future, as the actor
does), the conversations' own types (``chalie.wire.events`` and
``requests``; events numbered per conversation from 1, stored before they are
published on the EventBus), one running turn per conversation with the others
queued, and ``client_msg_id`` deduplication. Clients reach it through the real
port adapter (``actors/conversation/port.py``): the chat bridge builds its own,
and :class:`DoublePort` gives one to the inbound MCP server's tests.

A turn is a play: a generator of steps, chosen by the test package (:func:`chat_play`,
:func:`agent_play`), which the actor walks on its own thread: an event to emit, a
:data:`PAUSE` (the next step comes ``step_delay`` seconds later, from a timer), a
permission request (:class:`Ask`: the play resumes with the owner's answer), or
:data:`HANG` (the turn runs until it is cancelled). A play that returns ends its turn
``final`` with the last text it emitted, unless it finished the turn itself.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import pykka

from actors.actor import Actor
from actors.child_ref import ChildRef
from actors.conversation.port import ActorConversations
from chalie.conversation.requests import ConversationError, SendMessage
from chalie.wire.bus import EventBus
from chalie.wire.events import ConversationEvent as Event
from chalie.wire.events import (
    ErrorEvent,
    PermissionRequest,
    PermissionSettled,
    RichPayload,
    TextDelta,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from chalie.wire.messages import Accepted
from chalie.wire.principals import Principal, may_answer

__all__ = ["Accepted", "ConversationsDouble", "DoublePort", "SendMessage"]


@dataclass(frozen=True)
class Emit:
    """Emit one event of the turn (``turn_id`` and the numbering are filled in)."""

    kind: type[Event]
    fields: dict[str, Any]


@dataclass(frozen=True)
class Ask:
    """A tool call gated by ask: a permission request; the play resumes with the answer."""

    call_id: str
    tool: str
    act_summary: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Finish:
    reason: Any
    text: str


PAUSE: Final = "pause"
HANG: Final = "hang"
Step = Emit | Ask | Finish | str
Play = Callable[[str, str], Generator[Step, str | None, None]]  # (text, turn id)


def emit(kind: type[Event], **fields: Any) -> Emit:
    return Emit(kind, fields)


# -- the plays --------------------------------------------------------------------------


def chat_play(text: str, turn_id: str) -> Generator[Step, str | None, None]:
    """The chat tests' turns, by the message's first word.

    - ``ask ...``: a tool call gated by ask: ``tool_started`` and a
      ``permission_request``; the turn waits for :meth:`ConversationsDouble.answer`;
    - ``hang ...``: a turn that runs until cancelled;
    - ``fail ...``: the model is unreachable (``error`` + ``turn_finished(model-error)``);
    - ``flood N``: N text deltas;
    - anything else: an echo, in two deltas.
    """
    words = text.split()
    head = words[0] if words else ""
    if head == "ask":
        summary = "Reading the clock\x1b[2J\nin Tokyo"
        call_id = f"{turn_id}-clock"
        yield emit(ToolStarted, call_id=call_id, tool="clock", act_summary=summary)
        answer = yield Ask(call_id, "clock", summary, {"zone": "Asia/Tokyo"})
        denied = answer == "deny"
        yield emit(
            ToolFinished,
            call_id=call_id,
            tool="clock",
            status="error" if denied else "success",
            code="permission-denied" if denied else None,
        )
        said = "I was not allowed to look." if denied else "It is 09:00 in Tokyo."
        yield emit(TextDelta, text=said)
        yield Finish("final", said)
    elif head == "hang":
        yield emit(TextDelta, text="working")
        yield HANG
    elif head == "fail":
        yield emit(
            ErrorEvent,
            code="model-unreachable",
            message="connection refused by the model at http://127.0.0.1:9",
        )
        yield Finish("model-error", "")
    elif head == "flood":
        for i in range(int(words[1])):
            yield emit(TextDelta, text=f"chunk {i} " + "x" * 200)
        yield Finish("final", "flooded")
    else:
        yield emit(TextDelta, text="echo: ")
        yield emit(TextDelta, text=text)
        yield Finish("final", f"echo: {text}")


FORM: Final[dict[str, Any]] = {"type": "object", "properties": {"name": {"type": "string"}}}
PNG: Final = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
RICH: Final = {
    "items": [
        {"type": "image", "mime_type": "image/png", "data": PNG},
        {"type": "image", "mime_type": "image/png", "data": "not base64 at all!"},
        {"type": "audio", "mime_type": "audio/wav", "data": "UklGRiQAAABXQVZF"},
        {"type": "resource", "uri": "demo://doc/1", "mime_type": "text/plain", "text": "hello"},
        {"type": "resource_link", "uri": "demo://doc/2", "name": "doc two"},
        {"type": "mystery", "uri": "demo://x"},
        "not an item",
    ]
}


def agent_play(text: str, turn_id: str) -> Generator[Step, str | None, None]:
    """The inbound MCP tests' turns, by words anywhere in the (framed) message.

    ``hang`` runs until cancelled; otherwise find_tools then an allowed calculator
    call (a :data:`PAUSE` inside each), ``deny`` adds a call whose ask became a deny,
    ``form`` a remote server's question to the person (a request with a form),
    ``picture`` a rich payload; then the answer.
    """
    if "hang" in text:
        yield HANG
        return
    calls = [("find_tools", "looking for tools", "success", None)]
    calls.append(("calculator", "computing 2+2", "success", None))
    if "deny" in text:
        calls.append(("send_email", "sending an email to bob", "error", "permission-denied"))
    for i, (tool, summary, status, code) in enumerate(calls):
        call_id = f"{turn_id}-{i}"
        yield emit(ToolStarted, call_id=call_id, tool=tool, act_summary=summary)
        yield PAUSE
        yield emit(ToolFinished, call_id=call_id, tool=tool, status=status, code=code)
    if "form" in text:  # a remote server's question to the person, within the turn
        yield emit(
            PermissionRequest,
            request_id=f"{turn_id}-form",
            tool="_mcp_cap_ask_name",
            permission="_mcp_cap.elicitation",
            act_summary="The MCP server cap asks: your name?",
            params={},
            expires_at=time.time() + 60,
            form=FORM,
        )
    if "picture" in text:
        yield emit(RichPayload, call_id=f"{turn_id}-p", tool="draw", payload=RICH)
    answer = "2+2 is 4."
    if "deny" in text:
        answer += " I could not send the email: it needs your user's approval."
    yield Finish("final", answer)


# -- the actor ----------------------------------------------------------------------------


@dataclass
class _Turn:
    turn_id: str
    play: Generator[Step, str | None, None]
    waiting: str = ""  # "ask": for an answer; "hang": for a cancel; "pause": for a timer


@dataclass
class _Conversation:
    cid: str
    events: list[Event] = field(default_factory=list)
    running: _Turn | None = None
    queue: list[tuple[str, SendMessage]] = field(default_factory=list)
    sent: dict[str, str] = field(default_factory=dict)  # client_msg_id -> turn_id


@dataclass(frozen=True)
class _Next:
    """Timer: the paused turn's next step."""

    cid: str
    turn_id: str


@dataclass(frozen=True)
class _Accept:
    """Timer: a slow store has written the message; the caller hears back."""

    out: concurrent.futures.Future[Accepted]
    accepted: Accepted


class ConversationsDouble(Actor):
    """The double of the Conversations actor; ``play`` writes its turns.

    ``step_delay``: seconds a :data:`PAUSE` lasts; ``accept_delay``: how long a send
    waits before it is answered (a slow store: the turn runs before the caller hears).
    ``sent`` (each message with its conversation id) and ``cancelled`` record what it
    was asked, so a test can prove what did not happen.
    """

    def __init__(
        self,
        bus: EventBus,
        play: Play = chat_play,
        *,
        step_delay: float = 0.0,
        accept_delay: float = 0.0,
    ) -> None:
        super().__init__()
        self._bus = bus
        self._play = play
        self._step_delay = step_delay
        self._accept_delay = accept_delay
        self._convs: dict[str, _Conversation] = {}
        self._pending: dict[str, tuple[str, str]] = {}  # request -> (cid, turn)
        self._ids = itertools.count(1)
        self.sent: list[SendMessage] = []
        self.cancelled: list[str] = []

    # -- the Conversations actor's interface ---------------------------------------------------
    def submit(self, msg: SendMessage) -> concurrent.futures.Future[Accepted]:
        """The turn is taken (or queued) at once; the future answers then, or after
        ``accept_delay``."""
        out: concurrent.futures.Future[Accepted] = concurrent.futures.Future()
        try:
            accepted = self._send(msg)
        except Exception as exc:
            out.set_exception(exc)
            return out
        if self._accept_delay:
            self.schedule(self._accept_delay, _Accept(out, accepted))
        else:
            out.set_result(accepted)
        return out

    def cancel(self, conversation_id: str) -> concurrent.futures.Future[bool]:
        self.cancelled.append(conversation_id)
        conv = self._convs.get(conversation_id)
        if conv is None or conv.running is None:
            return _done(False)
        for rid, (cid, _turn) in list(self._pending.items()):
            if cid == conversation_id:
                del self._pending[rid]
        self._finish(conv, "cancelled", "")
        return _done(True)

    def events(self, conversation_id: str, after_seq: int, limit: int) -> list[Event]:
        conv = self._convs.get(conversation_id)
        return [] if conv is None else conv.events[after_seq : after_seq + limit]

    def answer(
        self, request_id: str, answer: str, by: Principal | None = None, content: Any = None
    ) -> concurrent.futures.Future[bool]:
        if not may_answer(by, None):
            raise ConversationError("forbidden", "only the owner answers")
        found = self._pending.pop(request_id, None)
        if found is None:
            return _done(False)
        conv = self._convs[found[0]]
        turn = conv.running
        if turn is None or turn.turn_id != found[1]:
            return _done(False)
        self._emit(conv, PermissionSettled, request_id=request_id, answer=answer)
        self._walk(conv, answer)
        return _done(True)

    # -- test hooks -------------------------------------------------------------------------
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
            self._bus.publish(conversation_id, event)
        return event.seq

    def pending_requests(self) -> list[str]:
        return list(self._pending)

    # -- the turns ------------------------------------------------------------------------------
    def _send(self, msg: SendMessage) -> Accepted:
        cid = msg.conversation_id or f"c{next(self._ids)}"
        self.sent.append(msgspec.structs.replace(msg, conversation_id=cid))
        conv = self._convs.setdefault(cid, _Conversation(cid))
        if msg.client_msg_id and msg.client_msg_id in conv.sent:
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

    def _emit(self, conv: _Conversation, kind: type[Event], **fields: Any) -> None:
        event = kind(conversation_id=conv.cid, seq=len(conv.events) + 1, ts=time.time(), **fields)
        conv.events.append(event)  # stored before it is published
        self._bus.publish(conv.cid, event)

    def _start(self, conv: _Conversation, turn_id: str, msg: SendMessage) -> None:
        conv.running = _Turn(turn_id, self._play(msg.text, turn_id))
        self._emit(
            conv, TurnStarted, turn_id=turn_id, client_msg_id=msg.client_msg_id, text=msg.text
        )
        self._walk(conv, None)

    def _walk(self, conv: _Conversation, given: str | None) -> None:
        """Run the turn's play until it waits or ends."""
        turn = conv.running
        assert turn is not None
        turn.waiting = ""
        last_text = ""
        while True:
            try:
                step = turn.play.send(given)
            except StopIteration:
                self._finish(conv, "final", last_text)
                return
            given = None
            if isinstance(step, Emit):
                if step.kind is TextDelta:
                    last_text = str(step.fields.get("text", ""))
                self._emit(conv, step.kind, turn_id=turn.turn_id, **step.fields)
            elif isinstance(step, Finish):
                self._finish(conv, step.reason, step.text)
                return
            elif isinstance(step, Ask):
                request_id = f"req{next(self._ids)}"
                self._pending[request_id] = (conv.cid, turn.turn_id)
                self._emit(
                    conv,
                    PermissionRequest,
                    request_id=request_id,
                    turn_id=turn.turn_id,
                    tool=step.tool,
                    permission=step.tool,
                    act_summary=step.act_summary,
                    params=step.params,
                    expires_at=time.time() + 300,
                )
                turn.waiting = "ask"
                return
            elif step == PAUSE and self._step_delay:
                turn.waiting = PAUSE
                self.schedule(self._step_delay, _Next(conv.cid, turn.turn_id))
                return
            elif step == HANG:
                turn.waiting = HANG
                return

    def _finish(self, conv: _Conversation, reason: Any, text: str) -> None:
        turn = conv.running
        assert turn is not None
        conv.running = None
        turn.play.close()
        self._emit(conv, TurnFinished, turn_id=turn.turn_id, reason=reason, text=text)
        if conv.queue:
            next_turn, msg = conv.queue.pop(0)
            self._start(conv, next_turn, msg)

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Next):
            conv = self._convs.get(message.cid)
            turn = conv.running if conv is not None else None
            if conv is not None and turn is not None and turn.turn_id == message.turn_id:
                self._walk(conv, None)
        elif isinstance(message, _Accept):
            message.out.set_result(message.accepted)
        return None


def _done(value: bool) -> concurrent.futures.Future[bool]:
    out: concurrent.futures.Future[bool] = concurrent.futures.Future()
    out.set_result(value)
    return out


class DoublePort:
    """The real conversations port over the double, on its own bus (for the inbound MCP
    server's tests, which are given a port)."""

    def __init__(
        self,
        play: Play = agent_play,
        *,
        step_delay: float = 0.0,
        accept_delay: float = 0.0,
        bus: EventBus | None = None,
    ) -> None:
        self.bus = bus if bus is not None else EventBus()
        self.ref: pykka.ActorRef[ConversationsDouble] = ConversationsDouble.start(
            self.bus, play, step_delay=step_delay, accept_delay=accept_delay
        )
        self.port = ActorConversations(ChildRef.to(self.ref, "conversations"), self.bus)

    @property
    def sent(self) -> list[SendMessage]:
        """What was sent, each with its conversation id (read on the actor's thread)."""
        return list(self.ref.proxy().sent.get(timeout=5))

    @property
    def cancelled(self) -> list[str]:
        return list(self.ref.proxy().cancelled.get(timeout=5))

    def stop(self) -> None:
        self.ref.stop()

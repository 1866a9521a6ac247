"""An in-process double of the Conversations actor and of the chat desk for the inbound MCP tests.

The conversations double publishes the seam's event shapes (tagged by
``type``, with ``conversation_id``/``seq``/``ts``), plays turns on its own
thread as the real actor does, and records what it was asked so tests can
prove what did not happen.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chalie.conversation.events import (
    PermissionRequested,
    RichPayload,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from chalie.conversation.requests import Accepted, SendMessage
from chalie.mcp_server.exchange import AgentExchange

FORM: dict[str, Any] = {"type": "object", "properties": {"name": {"type": "string"}}}
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
RICH = {
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


@dataclass
class SentMessage:
    conversation_id: str
    text: str
    client_msg_id: str
    origin: str
    channel: str = "external_agent"
    human_present: bool = False


@dataclass
class _Conv:
    seq: int = 0
    events: list[Any] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)


class _Sub:
    def __init__(self, subs: list[Any], entry: Any, lock: threading.Lock) -> None:
        self._subs, self._entry, self._lock = subs, entry, lock

    def close(self) -> None:
        with self._lock:
            if self._entry in self._subs:
                self._subs.remove(self._entry)


class FakeConversations:
    """Conversations as a ConversationsPort: each send plays one scripted turn on a thread.

    The script is chosen by words in the message: ``hang`` waits until the
    turn is cancelled; ``deny`` adds a tool call whose ask became a deny;
    otherwise find_tools then an allowed tool call, then the answer.
    """

    def __init__(self, delay: float = 0.0, send_delay: float = 0.0) -> None:
        self.delay = delay
        self.send_delay = send_delay
        self.sent: list[SentMessage] = []
        self.cancelled: list[str] = []
        self.convs: dict[str, _Conv] = {}
        self._subs: list[tuple[str, Callable[[Any], None]]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    # -- the port ------------------------------------------------------------------------
    async def send(self, msg: SendMessage) -> Accepted:
        conversation_id, text, client_msg_id = msg.conversation_id, msg.text, msg.client_msg_id
        origin, human_present = msg.origin, msg.human_present
        with self._lock:
            cid = conversation_id or f"c{next(self._ids)}"
            conv = self.convs.setdefault(cid, _Conv())
            conv.cancel = threading.Event()
            self.sent.append(
                SentMessage(cid, text, client_msg_id, origin, human_present=human_present)
            )
        turn_id = f"t{next(self._ids)}"
        threading.Thread(
            target=self._play, args=(cid, turn_id, text, client_msg_id), daemon=True
        ).start()
        if self.send_delay:  # a slow store: the turn runs before the caller hears back
            await asyncio.get_running_loop().run_in_executor(None, time.sleep, self.send_delay)
        return Accepted(conversation_id=cid, turn_id=None, queued=False, duplicate=False)

    async def cancel(self, conversation_id: str) -> bool:
        with self._lock:
            self.cancelled.append(conversation_id)
            conv = self.convs.get(conversation_id)
        if conv is None:
            return False
        conv.cancel.set()
        return True

    async def answer(self, request_id: str, answer: str) -> bool:
        return False  # the scripted turns never ask

    async def events(self, conversation_id: str, after_seq: int, limit: int) -> list[Any]:
        await asyncio.sleep(0)
        with self._lock:
            conv = self.convs.get(conversation_id)
            return [e for e in conv.events if e.seq > after_seq][:limit] if conv else []

    def subscribe(self, conversation_id: str, callback: Callable[[Any], None]) -> _Sub:
        entry = (conversation_id, callback)
        with self._lock:
            self._subs.append(entry)
        return _Sub(self._subs, entry, self._lock)

    # -- the scripted turn -----------------------------------------------------------------
    def _emit(self, cid: str, cls: type[Any], **fields: Any) -> None:
        with self._lock:
            conv = self.convs[cid]
            conv.seq += 1
            event = cls(conversation_id=cid, seq=conv.seq, ts=time.time(), **fields)
            conv.events.append(event)
            targets = [cb for key, cb in self._subs if key == cid]
        for cb in targets:
            cb(event)

    def _play(self, cid: str, turn_id: str, text: str, client_msg_id: str) -> None:
        conv = self.convs[cid]
        self._emit(cid, TurnStarted, turn_id=turn_id, client_msg_id=client_msg_id, text=text)
        if "hang" in text:
            conv.cancel.wait(30)
            self._emit(cid, TurnFinished, turn_id=turn_id, reason="cancelled", text="")
            return
        calls = [("find_tools", "looking for tools", "success", None)]
        calls.append(("calculator", "computing 2+2", "success", None))
        if "deny" in text:
            calls.append(("send_email", "sending an email to bob", "error", "permission-denied"))
        for i, (tool, summary, status, code) in enumerate(calls):
            call_id = f"{turn_id}-{i}"
            self._emit(
                cid, ToolStarted, turn_id=turn_id, call_id=call_id, tool=tool, act_summary=summary
            )
            if self.delay:
                time.sleep(self.delay)
            self._emit(
                cid,
                ToolFinished,
                turn_id=turn_id,
                call_id=call_id,
                tool=tool,
                status=status,
                code=code,
            )
        if "form" in text:  # a remote server's question to the person, within the turn
            self._emit(
                cid,
                PermissionRequested,
                request_id=f"{turn_id}-form",
                turn_id=turn_id,
                tool="_mcp_cap_ask_name",
                permission="_mcp_cap.elicitation",
                act_summary="The MCP server cap asks: your name?",
                params={},
                expires_at=time.time() + 60,
                form=FORM,
            )
        if "picture" in text:
            self._emit(
                cid, RichPayload, turn_id=turn_id, call_id=f"{turn_id}-p", tool="draw", payload=RICH
            )
        answer = "2+2 is 4."
        if "deny" in text:
            answer += " I could not send the email: it needs your user's approval."
        self._emit(cid, TurnFinished, turn_id=turn_id, reason="final", text=answer)


class FakeDesk:
    """A chat desk with ``humans`` people connected, recording what it was shown."""

    def __init__(self, humans: int = 1) -> None:
        self.humans = humans
        self.shown: list[AgentExchange] = []

    def humans_connected(self) -> int:
        return self.humans

    def surface(self, exchange: AgentExchange) -> int:
        self.shown.append(exchange)
        return self.humans

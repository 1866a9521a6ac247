"""One chat client's session: its open conversations, their event streams, its bounded outbox.

A session runs on the daemon's event loop and never blocks it. The
transport hands it each raw frame (:meth:`ChatSession.handle`) and drains
:attr:`ChatSession.outbox` to the client. Replies and events are queued
there; when a client does not read and the outbox is full, the session
marks itself dropped and calls ``on_overflow`` once, so the transport
disconnects that client and no one else waits for it.

Resuming a conversation (``open`` with ``after_seq``), in order:

1. subscribe to the conversation's live events (they are buffered);
2. page through the stored events after ``after_seq`` and send them;
3. send the buffered live events whose ``seq`` is past the last one sent;
4. reply ``opened`` with the last ``seq`` sent. From then on a live event is
   sent if its ``seq`` is the next one; an older one is a duplicate and
   dropped; a gap triggers steps 2-3 again from the last ``seq`` sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from chalie.chat import protocol as p
from chalie.conversation.port import Closeable, ConversationsPort, ConversationsUnavailable
from chalie.conversation.requests import ConversationError, SendMessage
from chalie.wire.bus import HUMANS
from chalie.wire.events import ToolProgress
from chalie.wire.principals import Principal

log = logging.getLogger("chalie.chat")

EVENT_PAGE = 200


@dataclass
class _Stream:
    """One open conversation in one session."""

    conversation_id: str
    subscription: Closeable | None = None
    last_seq: int | None = None  # None: live only, no baseline yet
    catching_up: bool = True
    buffered: list[Any] = field(default_factory=list)


class ChatSession:
    """The protocol state of one connected client; every method runs on the event loop."""

    def __init__(
        self,
        port: ConversationsPort,
        codec: p.Codec,
        *,
        origin: str,
        principal: Principal,
        outbox_limit: int,
        max_open: int,
        on_overflow: Callable[[], None],
    ) -> None:
        self._port = port
        self.codec = codec
        self.origin = origin
        # Who this client is; a transport admits only an owner (chalie.wire.principals.may_chat).
        self.principal = principal
        self.outbox: asyncio.Queue[bytes] = asyncio.Queue(outbox_limit)
        self._max_open = max_open
        self._on_overflow = on_overflow
        self._loop = asyncio.get_running_loop()
        self._streams: dict[str, _Stream] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.dropped = False
        self.closed = False
        self._humans: Closeable | None = None

    # -- out --------------------------------------------------------------------
    def push(self, frame: msgspec.Struct) -> None:
        """Queue a frame for the client; a full outbox drops the client (once)."""
        if self.dropped or self.closed:
            return
        try:
            self.outbox.put_nowait(self.codec.encode(frame))
        except asyncio.QueueFull:
            self.dropped = True
            log.warning(
                "chat client dropped: it does not read its frames",
                extra={"origin": self.origin, "queued": self.outbox.qsize()},
            )
            self._on_overflow()

    def hello(self) -> None:
        self.push(p.Hello(max_frame_bytes=self.codec.max_frame_bytes))
        # The owner is connected: they also get what is addressed to every human
        # (an inbound agent's loop_in_human exchange, chalie/mcp_server/exchange.py).
        # Only an owner: an exchange carries an agent's words and the calls it asked for.
        if self.principal.is_owner:
            self._humans = self._port.subscribe(HUMANS, self._for_humans)

    def _for_humans(self, event: Any) -> None:
        """From the publisher's thread: hand a broadcast to the session's loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self._loop.call_soon_threadsafe(self.push, event)

    # -- in ---------------------------------------------------------------------
    async def handle(self, raw: bytes | str) -> None:
        """Act on one frame from the client; every failure becomes a ``rejected`` frame."""
        try:
            msg = self.codec.decode(raw)
        except p.FrameError as exc:
            self.push(exc.rejected)
            return
        try:
            await self._dispatch(msg)
        except ConversationsUnavailable as exc:
            self.push(p.Rejected(id=msg.id, code=p.UNAVAILABLE, message=str(exc)[:300]))
        except ConversationError as exc:
            self.push(p.Rejected(id=msg.id, code=exc.code, message=str(exc)[:300]))
        except Exception as exc:  # a fault here must not end the client's session
            log.exception("chat frame %s failed", type(msg).__name__)
            self.push(
                p.Rejected(id=msg.id, code=p.INTERNAL, message=f"{type(exc).__name__}: {exc}"[:300])
            )

    async def _dispatch(self, msg: p.ClientMessage) -> None:
        await _FRAMES[type(msg)](self, msg)

    async def _open_frame(self, msg: p.Open) -> None:
        await self._open(msg.conversation_id, msg.after_seq, msg.id)

    async def _cancel(self, msg: p.Cancel) -> None:
        done = await self._port.cancel(msg.conversation_id)
        self.push(p.Cancelled(id=msg.id, conversation_id=msg.conversation_id, cancelled=done))

    async def _answer(self, msg: p.Answer) -> None:
        found = await self._port.answer(msg.request_id, msg.answer, self.principal, msg.content)
        self.push(p.Answered(id=msg.id, request_id=msg.request_id, found=found))

    async def _close(self, msg: p.Close) -> None:
        self._close_stream(msg.conversation_id)
        self.push(p.Closed(id=msg.id, conversation_id=msg.conversation_id))

    async def _ping(self, msg: p.Ping) -> None:
        self.push(p.Pong(id=msg.id))

    async def _bye(self, msg: p.Bye) -> None:
        self.push(p.Pong(id=msg.id))  # the last frame: the bye was taken
        self.close()  # a loop_in_human ask no longer counts this client as a person

    async def _send(self, msg: p.Send) -> None:
        cid = msg.conversation_id
        opened_here = False
        if cid is not None and cid not in self._streams:
            # Subscribe before the turn starts, so none of its events is missed.
            if not self._room_for_one_more(msg.id):
                return
            self._subscribe(_Stream(cid, catching_up=False))
            opened_here = True
        try:
            accepted = await self._port.send(
                SendMessage(
                    conversation_id=msg.conversation_id,
                    channel=msg.channel,
                    text=msg.text,
                    client_msg_id=msg.client_msg_id,
                    busy=msg.busy,
                    origin=self.origin,
                    principal=self.principal,
                )
            )
        except BaseException:
            if opened_here and cid is not None:
                self._close_stream(cid)  # a refused message opens nothing
            raise
        self.push(
            p.Accepted(
                id=msg.id,
                client_msg_id=msg.client_msg_id,
                conversation_id=accepted.conversation_id,
                turn_id=accepted.turn_id,
                queued=accepted.queued,
                duplicate=accepted.duplicate,
            )
        )
        if cid is None and accepted.conversation_id not in self._streams:
            # A new conversation: everything it has is this turn, stored from seq 1.
            await self._open(accepted.conversation_id, 0, None)

    def _room_for_one_more(self, ref: str | None) -> bool:
        if len(self._streams) < self._max_open:
            return True
        self.push(
            p.Rejected(
                id=ref,
                code=p.TOO_MANY_OPEN,
                message=f"at most {self._max_open} open conversations a client; close one",
            )
        )
        return False

    async def _open(self, cid: str, after_seq: int, ref: str | None) -> None:
        self._close_stream(cid)
        if not self._room_for_one_more(ref):
            return
        stream = _Stream(cid, last_seq=after_seq)
        self._subscribe(stream)
        try:
            await self._catch_up(stream)
        except BaseException:
            self._close_stream(cid)
            raise
        self.push(p.Opened(id=ref, conversation_id=cid, last_seq=stream.last_seq or 0))

    def _subscribe(self, stream: _Stream) -> None:
        loop = self._loop

        def deliver(event: Any) -> None:
            # The publisher's thread: hop onto the loop and return at once.
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(self._on_live, stream, event)

        stream.subscription = self._port.subscribe(stream.conversation_id, deliver)
        self._streams[stream.conversation_id] = stream

    async def _catch_up(self, stream: _Stream) -> None:
        stream.catching_up = True
        while True:
            after = stream.last_seq or 0
            page = await self._port.events(stream.conversation_id, after, EVENT_PAGE)
            for event in page:
                self._emit(stream, event)
            if len(page) < EVENT_PAGE or self._streams.get(stream.conversation_id) is not stream:
                break
        held, stream.buffered = stream.buffered, []
        stream.catching_up = False
        for event in sorted(held, key=_seq):
            self._on_live(stream, event)

    def _on_live(self, stream: _Stream, event: Any) -> None:
        if self._streams.get(stream.conversation_id) is not stream or self.closed:
            return  # closed or reopened since
        if isinstance(event, ToolProgress):
            self.push(event)  # live only, unnumbered: never buffered, never a gap
            return
        if stream.catching_up:
            stream.buffered.append(event)
            return
        seq = _seq(event)
        if stream.last_seq is not None and seq > stream.last_seq + 1:
            stream.buffered.append(event)
            self._spawn(self._resync(stream))
            return
        self._emit(stream, event)

    async def _resync(self, stream: _Stream) -> None:
        if stream.catching_up:
            return
        try:
            await self._catch_up(stream)
        except ConversationsUnavailable as exc:
            log.warning("chat resync failed: %s", exc)
            stream.catching_up = False

    def _emit(self, stream: _Stream, event: Any) -> None:
        seq = _seq(event)
        if stream.last_seq is not None and seq <= stream.last_seq:
            return  # already sent (backfill and live overlap)
        stream.last_seq = seq
        self.push(event)

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _close_stream(self, cid: str) -> None:
        stream = self._streams.pop(cid, None)
        if stream is not None and stream.subscription is not None:
            stream.subscription.close()

    def close(self) -> None:
        """Unsubscribe everything; the transport calls this when the client goes (idempotent)."""
        self.closed = True
        if self._humans is not None:
            self._humans.close()
        for cid in list(self._streams):
            self._close_stream(cid)
        for task in list(self._tasks):
            task.cancel()


def _seq(event: Any) -> int:
    return int(getattr(event, "seq", 0))


# One row a client frame (chalie.chat.protocol.ClientMessage): its type, its handler.
_FRAMES: dict[type, Callable[[ChatSession, Any], Awaitable[None]]] = {
    p.Send: ChatSession._send,
    p.Open: ChatSession._open_frame,
    p.Cancel: ChatSession._cancel,
    p.Answer: ChatSession._answer,
    p.Close: ChatSession._close,
    p.Ping: ChatSession._ping,
    p.Bye: ChatSession._bye,
}

"""The turn follower: one client's view of one turn, from its conversation's typed events.

A client that sends a message and waits for its answer (``talk_to_chalie``, ``chalie
ask``) follows the turn that message started. It subscribes to the conversation's
live events (before the send when the conversation exists; right after it, with a
backfill of the stored events, when the send creates it), and :class:`TurnFollower`
picks out that turn's events, in ``seq`` order, each once:

1. events before the turn's ``turn_started`` (the one carrying the client's
   ``client_msg_id``) are another turn's and skipped;
2. from then on, the events whose ``turn_id`` is the turn's are handed over,
   duplicates (the backfill and the live feed overlap) dropped by ``seq``;
3. ``turn_finished`` is the last.

:func:`follow_turn` is the whole loop for a client with nothing else to do meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from chalie.conversation.port import ConversationsPort
from chalie.conversation.requests import SendMessage
from chalie.wire.events import (
    ConversationEvent,
    ToolFinished,
    ToolProgress,
    TurnFinished,
    TurnStarted,
)
from chalie.wire.messages import Accepted

BACKFILL_LIMIT: Final = 1_000


class TurnFollower:
    """Which events of a conversation are one turn's; fed from any thread, read on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client_msg_id: str | None = None) -> None:
        self.loop = loop
        self.client_msg_id = client_msg_id or uuid.uuid4().hex
        self.turn_id: str | None = None
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self._seen: set[int] = set()
        self._pending: collections.deque[object] = collections.deque()
        self._scheduled = False

    def push(self, event: object) -> None:
        """From any thread: hand an event (or a sentinel) to the follower's loop.

        A burst (a turn publishes its events in batches) wakes the loop once: the
        events wait in a deque and one scheduled drain moves them all.
        """
        self._pending.append(event)
        if self._scheduled:
            return  # the drain not yet run takes this one too
        self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            pass  # the loop is closing; nobody waits any more

    def backfill(self, events: Sequence[object]) -> None:
        """On the loop: stored events read after subscribing go before the live ones.

        A live event (the turn's end) may already be queued ahead of a stored
        earlier one; both are merged in ``seq`` order, duplicates dropped later.
        """
        queued: list[object] = []
        while not self.queue.empty():
            queued.append(self.queue.get_nowait())
        while self._pending:
            queued.append(self._pending.popleft())
        for event in sorted([*events, *queued], key=_seq_of):
            self.queue.put_nowait(event)

    def _drain(self) -> None:
        self._scheduled = False  # before taking: a push from now on schedules anew
        pending = self._pending
        while pending:
            self.queue.put_nowait(pending.popleft())

    def accept(self, item: object) -> ConversationEvent | ToolProgress | None:
        """The event if it is this turn's and new, else None.

        A :class:`ToolProgress` is live only (not numbered): it is the turn's when its
        ``turn_id`` is, once the turn has started.
        """
        if isinstance(item, ToolProgress):
            return item if self.turn_id is not None and item.turn_id == self.turn_id else None
        if not isinstance(item, ConversationEvent) or not item.recorded:
            return None  # not the log's (a request or a result its turn records)
        if item.seq:
            if item.seq in self._seen:
                return None  # the backfill and the live feed overlap
            self._seen.add(item.seq)
        if self.turn_id is None:
            if isinstance(item, TurnStarted) and item.client_msg_id == self.client_msg_id:
                self.turn_id = item.turn_id
            return None
        return item if getattr(item, "turn_id", None) == self.turn_id else None

    async def next(self) -> ConversationEvent | ToolProgress | object:
        """The next event of the turn, or a sentinel another task pushed."""
        while True:
            item = await self.queue.get()
            if not isinstance(item, ConversationEvent | ToolProgress):
                return item
            event = self.accept(item)
            if event is not None:
                return event


@dataclass
class TurnOutcome:
    """A followed turn, ended: its conversation, its answer and the tools it called."""

    accepted: Accepted
    finished: TurnFinished
    tools: list[ToolFinished] = field(default_factory=list)


async def follow_turn(
    port: ConversationsPort,
    msg: SendMessage,
    *,
    timeout: float,
    on_event: Callable[[ConversationEvent], Any] | None = None,
) -> TurnOutcome:
    """Send ``msg`` and wait for the end of the turn it starts.

    Raises what the port raises, or TimeoutError after ``timeout`` seconds (the turn is
    then cancelled). ``on_event`` sees each of the turn's events on the loop.
    """
    follow = TurnFollower(asyncio.get_running_loop(), msg.client_msg_id or None)
    if not msg.client_msg_id:
        msg = _with_client_id(msg, follow.client_msg_id)
    sub = None
    if msg.conversation_id is not None:
        sub = port.subscribe(msg.conversation_id, follow.push)
    cid = msg.conversation_id
    try:
        accepted = await port.send(msg)
        cid = accepted.conversation_id
        if sub is None:
            sub = port.subscribe(cid, follow.push)
        if accepted.duplicate or msg.conversation_id is None:
            # a new conversation, or a turn that may have run already: read what is stored
            if accepted.duplicate:
                follow.turn_id = accepted.turn_id
            follow.backfill(await port.events(cid, 0, BACKFILL_LIMIT))
        tools: list[ToolFinished] = []
        async with asyncio.timeout(timeout):
            while True:
                event = await follow.next()
                if not isinstance(event, ConversationEvent):
                    continue
                if on_event is not None:
                    on_event(event)
                if isinstance(event, ToolFinished):
                    tools.append(event)
                elif isinstance(event, TurnFinished):
                    return TurnOutcome(accepted, event, tools)
    except TimeoutError:
        if cid is not None:
            await port.cancel(cid)
        raise
    finally:
        if sub is not None:
            sub.close()


def _with_client_id(msg: SendMessage, client_msg_id: str) -> SendMessage:
    return msgspec.structs.replace(msg, client_msg_id=client_msg_id)


def _seq_of(event: object) -> int:
    seq = getattr(event, "seq", 0)
    return seq if isinstance(seq, int) else 0

"""The call session: tool calls started by a client that is not a turn, followed until they end.

A client that is not a conversation turn (the CLI, a chat bridge's direct
command, the inbound MCP server) starts a call with :meth:`DirectCalls.start`
and follows it with :meth:`DirectCalls.poll`: a long-poll that hands over each
:class:`~chalie.wire.events.PermissionRequest` published for the call's
conversation, as it is published, and the :class:`~chalie.wire.messages.ToolOutcome`
once it exists.

Lifecycle of one call, in order:

1. ``start`` subscribes to the conversation on the :class:`~chalie.wire.bus.EventBus`
   *before* dispatching (the gate may ask at once), then hands the call to
   ``dispatch`` (the dispatcher's submit) and keeps its outcome future.
2. Each ``poll`` waits up to ``wait`` seconds for news, returns the permission
   requests that arrived and, once the future is done, the outcome; the call
   is then forgotten and its subscription closed.
3. A call nobody polls for ``forget_after`` seconds is dropped at the next
   ``start``; ``close`` drops every call and wakes every long-poll at once.

The desk is thread-safe: requests arrive on the publisher's thread, polls on
the clients' threads. It knows nothing of sockets or actors.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from chalie.wire.bus import EventBus, Subscription
from chalie.wire.events import PermissionRequest, ToolProgress
from chalie.wire.messages import Channel, Initiator, ToolCall, ToolOutcome, ToolScope, TurnContext

log = logging.getLogger("chalie.calls.direct_calls")

Dispatch = Callable[[ToolCall], "concurrent.futures.Future[ToolOutcome]"]
FORGET_AFTER: Final = 900.0


class UnknownCall(LookupError):
    """No call with that id is in progress at this desk (finished, forgotten, or never started)."""


@dataclass(frozen=True)
class CallStarted:
    call_id: str
    conversation_id: str


@dataclass(frozen=True)
class CallNews:
    """What a poll found: requests to answer, and the outcome once the call ended."""

    permission_requests: list[PermissionRequest]
    outcome: ToolOutcome | None = None
    # The call's latest progress since the last poll (a remote tool's), if any.
    progress: ToolProgress | None = None

    @property
    def done(self) -> bool:
        return self.outcome is not None


@dataclass
class _Call:
    call_id: str
    conversation_id: str
    future: concurrent.futures.Future[ToolOutcome]
    news: threading.Event = field(default_factory=threading.Event)
    requests: list[PermissionRequest] = field(default_factory=list)
    progress: ToolProgress | None = None
    subscription: Subscription | None = None
    touched: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_event(self, event: Any) -> None:
        # Runs on the publisher's thread: append and wake, nothing more.
        if isinstance(event, PermissionRequest):
            with self.lock:
                self.requests.append(event)
            self.news.set()
        elif isinstance(event, ToolProgress) and event.call_id == self.call_id:
            with self.lock:
                self.progress = event  # the newest supersedes the rest
            self.news.set()

    def take_progress(self) -> ToolProgress | None:
        with self.lock:
            taken, self.progress = self.progress, None
        return taken

    def take_requests(self) -> list[PermissionRequest]:
        with self.lock:
            taken, self.requests = self.requests, []
        return taken


class DirectCalls:
    """Calls started by one kind of client, on one channel; see the module docstring."""

    def __init__(
        self,
        events: EventBus,
        dispatch: Dispatch,
        *,
        channel: Channel = "chat",
        human_present: bool = True,
        prefix: str = "cli",
        forget_after: float = FORGET_AFTER,
        scope: ToolScope = "restricted",
        initiator: Initiator = "model",
        end_turn: Callable[[str], None] | None = None,
    ) -> None:
        self._events = events
        self._dispatch = dispatch
        self._channel: Channel = channel
        self._human_present = human_present
        self._prefix = prefix
        self._forget_after = forget_after
        # Operator desks say "unrestricted" (any registered tool) and "framework"
        # (the runtime writes the act_summary); a desk for a model keeps the defaults.
        self._scope: ToolScope = scope
        self._initiator: Initiator = initiator
        # Each call is its own turn: what find_tools injected into it ends with it.
        self._end_turn = end_turn
        self._calls: dict[str, _Call] = {}
        self._lock = threading.Lock()

    def start(
        self, tool: str, arguments: dict[str, Any], conversation_id: str | None = None
    ) -> CallStarted:
        """Dispatch one call; raises whatever ``dispatch`` raises (nothing is kept then)."""
        self._forget_stale()
        call_id = f"{self._prefix}-{uuid.uuid4().hex[:16]}"
        conversation = conversation_id or f"{self._prefix}-{uuid.uuid4().hex[:12]}"
        call = ToolCall(
            call_id=call_id,
            tool=tool,
            arguments=arguments,
            context=TurnContext(
                conversation_id=conversation,
                turn_id=f"{call_id}-turn",
                channel=self._channel,
                human_present=self._human_present,
                scope=self._scope,
                initiator=self._initiator,
            ),
        )
        entry = _Call(call_id, conversation, concurrent.futures.Future())
        # Subscribe before dispatching: the gate may ask at once.
        entry.subscription = self._events.subscribe(conversation, entry.on_event)
        try:
            entry.future = self._dispatch(call)
        except BaseException:
            entry.subscription.close()
            raise
        entry.future.add_done_callback(lambda _f: entry.news.set())
        end_turn = self._end_turn
        if end_turn is not None:
            turn_id = call.context.turn_id
            entry.future.add_done_callback(lambda _f: end_turn(turn_id))
        with self._lock:
            self._calls[call_id] = entry
        return CallStarted(call_id, conversation)

    def poll(self, call_id: str, wait: float) -> CallNews:
        """News of a call, waiting up to ``wait`` s for some; UnknownCall if it is not here.

        A failure of the runtime itself (the outcome future raised) is raised
        here once; the call is forgotten either way when it has ended.
        """
        with self._lock:
            entry = self._calls.get(call_id)
        if entry is None:
            raise UnknownCall(call_id)
        entry.touched = time.monotonic()
        entry.news.wait(wait)
        entry.news.clear()
        requests = entry.take_requests()
        progress = entry.take_progress()
        if not entry.future.done():
            # Anything that lands after the clear sets news again: the next poll sees it.
            return CallNews(requests, progress=progress)
        self._finish(entry)
        return CallNews(requests, entry.future.result(), progress)

    def in_progress(self) -> int:
        with self._lock:
            return len(self._calls)

    def _finish(self, entry: _Call) -> None:
        if entry.subscription is not None:
            entry.subscription.close()
        with self._lock:
            self._calls.pop(entry.call_id, None)

    def _forget_stale(self) -> None:
        now = time.monotonic()
        with self._lock:
            stale = [c for c in self._calls.values() if now - c.touched > self._forget_after]
        for entry in stale:
            log.info("forgot an unpolled call", extra={"call_id": entry.call_id})
            self._finish(entry)

    def close(self) -> None:
        with self._lock:
            entries = list(self._calls.values())
        for entry in entries:
            self._finish(entry)
            entry.news.set()  # a long-poll in progress returns now, not at its timeout

"""The event bus: per-conversation delivery of permission requests and background results.

Publishers are the PolicyActor (a :class:`PermissionRequest` when the gate asks
a human) and the dispatcher (a :class:`BackgroundResult` when an async call
ends). Subscribers are whatever speaks to the conversation's human: a chat
bridge, the control endpoint. A subscriber registers for one conversation id,
or for ``None`` to receive every conversation's events.

Callbacks run in the publisher's thread, which may be an actor's: they must be
quick and must not block (put on a queue, or ``loop.call_soon_threadsafe``).
An exception in a callback is logged and never reaches the publisher.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Final

import msgspec

log = logging.getLogger("chalie.wire.bus")

# What travels on the bus: any message a publisher hands it (a permission request, a
# settled request, a conversation's numbered events, a background result, an agent's
# exchange...). The bus knows none of those features: a subscriber narrows with
# ``isinstance`` or asks for ``kinds`` when it subscribes.
Event = msgspec.Struct
# The key every human-facing client (a chat session) subscribes to: what a person
# at a screen should see whatever conversation they have open.
HUMANS: Final = "*humans*"
Callback = Callable[[Event], None]


class Subscription:
    """A registered callback; ``close()`` unsubscribes (idempotent)."""

    def __init__(
        self,
        bus: EventBus,
        key: str | None,
        callback: Callback,
        kinds: tuple[type, ...] | None = None,
    ) -> None:
        self._bus = bus
        self.conversation_id = key
        self.callback = callback
        # Only events of these types reach the callback (None: every event).
        self.kinds = kinds
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._bus._remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class QueueSubscription(Subscription):
    """A subscription whose events land on ``self.queue``, for a thread that waits on them."""

    def __init__(self, bus: EventBus, key: str | None) -> None:
        self.queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        super().__init__(bus, key, self.queue.put)


class EventBus:
    """Thread-safe fan-out of events keyed by conversation id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str | None, tuple[Subscription, ...]] = {}

    def subscribe(
        self,
        conversation_id: str | None,
        callback: Callback,
        *,
        kinds: tuple[type, ...] | None = None,
    ) -> Subscription:
        """Deliver a conversation's events (every one's, for ``None``) to ``callback``.

        ``kinds``: only events of these types (a subscriber that wants two kinds does not
        hear every text delta of every conversation).
        """
        sub = Subscription(self, conversation_id, callback, kinds)
        self._add(sub)
        return sub

    def subscribe_queue(self, conversation_id: str | None) -> QueueSubscription:
        sub = QueueSubscription(self, conversation_id)
        self._add(sub)
        return sub

    def _add(self, sub: Subscription) -> None:
        with self._lock:
            self._subs[sub.conversation_id] = (*self._subs.get(sub.conversation_id, ()), sub)

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            left = tuple(s for s in self._subs.get(sub.conversation_id, ()) if s is not sub)
            if left:
                self._subs[sub.conversation_id] = left
            else:
                self._subs.pop(sub.conversation_id, None)

    def subscribed(self, key: str) -> int:
        """How many subscribers ``key`` has itself (catch-all ones not counted)."""
        with self._lock:
            return len(self._subs.get(key, ()))

    def subscribers(self, conversation_id: str) -> int:
        with self._lock:
            return len(self._subs.get(conversation_id, ())) + len(self._subs.get(None, ()))

    def publish(self, conversation_id: str, event: Event) -> int:
        """Deliver to the conversation's subscribers and the catch-all ones; returns how many."""
        with self._lock:
            targets = self._subs.get(conversation_id, ()) + self._subs.get(None, ())
        delivered = 0
        for sub in targets:
            if sub.kinds is not None and not isinstance(event, sub.kinds):
                continue
            try:
                sub.callback(event)
                delivered += 1
            except Exception:
                log.exception("event subscriber for conversation %r failed", conversation_id)
        return delivered

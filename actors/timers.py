"""An actor inbox that also delivers the actor's own timers: no timer thread, no wake for nothing.

An actor that needs deadlines (the dispatcher's call timeouts, its trail
flush) makes this its inbox (``_create_actor_inbox``, pykka's hook for
inbox types) and calls :meth:`TimerInbox.add` and :meth:`TimerInbox.cancel`
from its own thread. The actor loop's ``get`` waits on the message queue
with a timeout that ends at the earliest live timer; when it expires, the
timer's message comes out of ``get`` as if it had been sent, so the actor's
state stays on its thread.

Why not a timer thread: a timer thread wakes for every entry that comes due,
cancelled or not, and each wake in the middle of a sub-millisecond remote
call costs that call tens of microseconds in GIL hand-offs (measured: a
1.04 ms MCP call became 1.21 ms). Here a cancelled timer costs nothing: the
heap and the cancel set are touched only by the actor's thread, and the
next ``get`` simply waits for the next live entry.

The same wait can also cover sockets and file descriptors that the actor
owns (:meth:`TimerInbox.watch`: a ``zmq.Poller`` and how long it may wait):
``get`` then blocks in that poller, with an eventfd in it that ``put``
writes only while the owner sleeps there, and a socket that becomes
readable comes out of ``get`` as a :class:`Ready` message. The dispatcher
hosts the worker broker this way (:class:`actors.workers.worker_pool.HostedPool`),
so a worker's result is read on the thread that handles it.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import zmq


class _Envelope:
    """What the actor loop reads from its inbox: a message and, for a timer, no reply."""

    __slots__ = ("message", "reply_to")

    def __init__(self, message: Any) -> None:
        self.message = message
        self.reply_to = None


class Ready:
    """What a watched poller reported: its ``(socket or fd, events)`` pairs; empty when
    only its own time came (see :meth:`TimerInbox.watch`)."""

    __slots__ = ("events",)

    def __init__(self, events: list[tuple[Any, int]]) -> None:
        self.events = events


class TimerInbox:
    """pykka's inbox protocol (put, get, empty) plus timers; see the module docstring.

    ``put`` may be called from any thread; ``add``, ``cancel``, ``get`` and
    ``empty`` only from the owning actor's thread.
    """

    COMPACT_AFTER: Final = 4096
    # While a poller is watched: messages handled in a row before it is looked at.
    MESSAGES_PER_LOOK: Final = 16

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._heap: list[tuple[float, int, Any]] = []
        self._cancelled: set[int] = set()  # in the heap, cancelled
        self._live: set[int] = set()  # in the heap, not cancelled
        self._ids = itertools.count(1)
        # Watching (owner's thread only, but _sleeping, which put reads on any thread).
        self._poller: zmq.Poller | None = None
        self._poll_wait: Callable[[], int] | None = None
        self._wake: int | None = None
        self._sleeping = False
        self._in_a_row = 0
        # Set by whoever is about to stop the owner (the supervisor), before the stop
        # message: an owner busy in a long step that never reads its mailbox (a first
        # index build in on_start) can notice it and give the step up.
        self.stop_requested = threading.Event()

    # -- pykka's inbox protocol ----------------------------------------------------------------
    def put(self, envelope: Any, /) -> None:
        self._queue.put(envelope)
        # The owner sets _sleeping, then looks at the queue once more before it polls:
        # a message put before that look is seen, one put after it finds the flag set.
        if self._sleeping and self._wake is not None:
            try:
                os.eventfd_write(self._wake, 1)
            except BlockingIOError:
                pass  # saturated: the owner is awake anyway

    def empty(self) -> bool:
        return self._queue.empty()

    def get(self) -> Any:
        """The next message, or the message of a timer that came due, whichever is first."""
        if self._poller is not None:
            return self._get_watching(self._poller)
        heap, cancelled, q = self._heap, self._cancelled, self._queue
        while True:
            while heap and heap[0][1] in cancelled:  # ended calls' deadlines: dropped
                cancelled.discard(heapq.heappop(heap)[1])
            if not heap:
                return q.get()
            wait = heap[0][0] - time.monotonic()
            if wait > 0:
                try:
                    return q.get(timeout=wait)
                except queue.Empty:
                    continue
            _, handle, message = heapq.heappop(heap)
            self._live.discard(handle)
            return _Envelope(message)

    def _get_watching(self, poller: zmq.Poller) -> Any:
        """``get`` while a poller is watched: messages, due timers and the poller's events,
        none able to starve the others (the poller is looked at after at most
        :data:`MESSAGES_PER_LOOK` messages in a row); an empty Ready when its wait ran out."""
        heap, cancelled, q = self._heap, self._cancelled, self._queue
        assert self._poll_wait is not None and self._wake is not None
        while True:
            if self._in_a_row < self.MESSAGES_PER_LOOK:
                try:
                    message = q.get_nowait()
                except queue.Empty:
                    pass
                else:
                    self._in_a_row += 1
                    return message
            self._in_a_row = 0
            while heap and heap[0][1] in cancelled:
                cancelled.discard(heapq.heappop(heap)[1])
            wait_ms = self._poll_wait()
            if heap:
                due = heap[0][0] - time.monotonic()
                if due <= 0:
                    _, handle, message = heapq.heappop(heap)
                    self._live.discard(handle)
                    return _Envelope(message)
                wait_ms = min(wait_ms, math.ceil(due * 1000))
            if wait_ms <= 0:
                return _Envelope(Ready([]))
            self._sleeping = True
            try:
                # Looked at after the flag is set: a put from now on writes the eventfd.
                events = poller.poll(0 if not q.empty() else wait_ms)
            finally:
                self._sleeping = False
            mine = [e for e in events if e[0] != self._wake]
            if len(mine) != len(events):
                try:
                    os.eventfd_read(self._wake)
                except BlockingIOError:
                    pass
            if mine:
                return _Envelope(Ready(mine))

    def watch(self, poller: zmq.Poller, wait_ms: Callable[[], int]) -> None:
        """Wait on ``poller`` too (its readable sockets come out as :class:`Ready`), and for at
        most ``wait_ms()`` milliseconds at a time (an empty Ready when that runs out). Owner's
        thread only; one poller at a time."""
        import zmq  # here: an inbox that watches nothing needs no ZeroMQ

        if self._poller is not None:
            raise RuntimeError("this inbox already watches a poller")
        if self._wake is None:
            # Never closed while the inbox lives: a put on another thread may be writing it.
            self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            weakref.finalize(self, os.close, self._wake)
        poller.register(self._wake, zmq.POLLIN)
        self._poll_wait = wait_ms
        self._poller = poller

    @property
    def watching(self) -> bool:
        """Whether ``get`` waits on a poller too (see :meth:`watch`)."""
        return self._poller is not None

    def unwatch(self) -> None:
        """Stop watching (owner's thread); ``get`` waits on the mailbox alone again."""
        poller, self._poller, self._poll_wait = self._poller, None, None
        if poller is not None and self._wake is not None:
            poller.unregister(self._wake)

    # -- timers (the owning actor's thread only) ----------------------------------------------
    def add(self, seconds: float, message: Any) -> int:
        """Deliver ``message`` after ``seconds``; returns a handle for :meth:`cancel`."""
        handle = next(self._ids)
        heapq.heappush(self._heap, (time.monotonic() + seconds, handle, message))
        self._live.add(handle)
        return handle

    def cancel(self, handle: int) -> None:
        """Forget a timer; a handle that already fired or was cancelled is ignored."""
        if handle not in self._live:
            return
        self._live.discard(handle)
        self._cancelled.add(handle)
        if len(self._cancelled) > self.COMPACT_AFTER and len(self._cancelled) * 2 > len(self._heap):
            self._heap = [e for e in self._heap if e[1] not in self._cancelled]
            heapq.heapify(self._heap)
            self._cancelled.clear()

    def __len__(self) -> int:
        """Live timers."""
        return len(self._live)

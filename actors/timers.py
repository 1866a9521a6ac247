"""Timers that come back as messages: one thread, a heap, and ``tell`` when an entry is due.

An actor that needs a deadline (the dispatcher's call timeouts, its trail
flush) adds ``(seconds, message)`` and receives the message in its own
mailbox when the time comes, so its state stays on its own thread. The heap
is this object's own; a cancelled entry is dropped when it comes due, and the
heap is rebuilt when cancelled entries outnumber the live ones.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Any, Final

import pykka

log = logging.getLogger("chalie.timers")


class Timers:
    """Deliver messages to one actor at given times; run :meth:`run` on a thread of its own."""

    COMPACT_AFTER: Final = 4096

    def __init__(self, target: pykka.ActorRef[Any]) -> None:
        self._target = target
        self._heap: list[tuple[float, int, Any]] = []
        self._cancelled: set[int] = set()
        self._ids = itertools.count(1)
        self._cond = threading.Condition(threading.Lock())
        self._stopped = False

    def add(self, seconds: float, message: Any) -> int:
        """Send ``message`` after ``seconds``; returns a handle for :meth:`cancel`."""
        handle = next(self._ids)
        entry = (time.monotonic() + seconds, handle, message)
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._cond.notify()
        return handle

    def cancel(self, handle: int) -> None:
        with self._cond:
            self._cancelled.add(handle)
            if len(self._cancelled) > self.COMPACT_AFTER and len(self._cancelled) * 2 > len(
                self._heap
            ):
                self._heap = [e for e in self._heap if e[1] not in self._cancelled]
                heapq.heapify(self._heap)
                self._cancelled.clear()

    def __len__(self) -> int:
        with self._cond:
            return len(self._heap) - len(self._cancelled)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    if not self._heap:
                        self._cond.wait()
                        continue
                    delay = self._heap[0][0] - time.monotonic()
                    if delay <= 0:
                        _, handle, message = heapq.heappop(self._heap)
                        if handle in self._cancelled:
                            self._cancelled.discard(handle)
                            continue
                        break
                    self._cond.wait(delay)
            try:
                self._target.tell(message)
            except pykka.ActorDeadError:
                return

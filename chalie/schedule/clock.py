"""The scheduler's clock: wall time, and a clock a test moves by hand (no sleeps).

The scheduler asks ``now()`` for the wall time (reminders are wall-clock
events) and waits on its own inbox until the next due time. A test's
:class:`ManualClock` jumps forward with :meth:`advance` and wakes whoever
listens, so a reminder a day away fires at once, through the same code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def on_jump(self, wake: Callable[[], None]) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.time()

    def on_jump(self, wake: Callable[[], None]) -> None:
        """Wall time never jumps on its own account."""


class ManualClock:
    """A clock standing at ``start`` until moved."""

    def __init__(self, start: float) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    def now(self) -> float:
        with self._lock:
            return self._now

    def on_jump(self, wake: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(wake)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            listeners = list(self._listeners)
        for wake in listeners:
            wake()

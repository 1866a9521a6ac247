"""A model's text deltas, coalesced on the event loop before they reach the TurnActor.

A streaming model sends a delta per token or two, often several in one TCP
read. Each delta that reaches the TurnActor costs a thread hand-off, a SQLite
transaction and an event to every follower. :class:`DeltaThrottle` passes the
first delta on at once (the time to the first word is what a reader notices),
then at most one joined delta per :data:`DELTA_WINDOW`, and whatever is held
when the stream ends, errs or retries. Every method runs on the loop thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

# At most one delta event per window after the first: ~25 a second, below what a
# reader can tell from a per-token stream, and far fewer than a fast model's tokens.
DELTA_WINDOW: Final = 0.04


class DeltaThrottle:
    """Joins the deltas that arrive within one window; see the module docstring."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        emit: Callable[[str], None],
        window: float = DELTA_WINDOW,
    ) -> None:
        self._loop = loop
        self._emit = emit
        self._window = window
        self._parts: list[str] = []
        self._last = float("-inf")  # loop time of the last emit
        self._timer: asyncio.TimerHandle | None = None

    def add(self, text: str) -> None:
        if not text:
            return
        self._parts.append(text)
        if self._timer is not None:
            return  # a flush is already due
        due = self._last + self._window
        if self._loop.time() >= due:
            self.flush()
        else:
            self._timer = self._loop.call_at(due, self.flush)

    def flush(self) -> None:
        """Pass on what is held now (the stream ended, failed or is retried)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._parts:
            text = "".join(self._parts)
            self._parts.clear()
            self._last = self._loop.time()
            self._emit(text)

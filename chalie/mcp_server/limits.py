"""Per-token limits of the inbound MCP server: requests per minute and concurrent turns.

A :class:`TokenLimits` is touched by the event-loop thread only. Nothing here
queues: a request past a limit is refused at once with the seconds after which
a retry can succeed (the ``Retry-After`` of a 429).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

# A bucket left untouched this long is dropped (it would be full again anyway).
IDLE_FORGET: Final = 120.0
_SWEEP_EVERY: Final = 1024


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    turns: int = 0


class Refused(Exception):
    """A request past a limit: which one, and when to retry."""

    code: Final = "rate-limited"

    def __init__(self, limit: str, retry_after: int, detail: str) -> None:
        super().__init__(detail)
        self.limit = limit
        self.retry_after = retry_after
        self.detail = detail


class TokenLimits:
    """Token buckets (requests per minute) and turn counters, one per token name."""

    def __init__(
        self,
        *,
        requests_per_minute: int,
        max_concurrent_turns: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = float(requests_per_minute)
        self.rate = requests_per_minute / 60.0
        self.max_turns = max_concurrent_turns
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._seen = 0

    def _bucket(self, name: str, now: float) -> _Bucket:
        b = self._buckets.get(name)
        if b is None:
            b = self._buckets[name] = _Bucket(self.capacity, now)
        else:
            b.tokens = min(self.capacity, b.tokens + (now - b.stamp) * self.rate)
            b.stamp = now
        return b

    def admit(self, name: str) -> None:
        """Count one request of ``name``; Refused past its requests per minute."""
        now = self._clock()
        self._seen += 1
        if self._seen % _SWEEP_EVERY == 0:
            self._sweep(now)
        b = self._bucket(name, now)
        if b.tokens < 1.0:
            wait = math.ceil((1.0 - b.tokens) / self.rate)
            raise Refused(
                "requests_per_minute",
                max(1, wait),
                f"token {name!r} is over its limit of {int(self.capacity)} requests per minute",
            )
        b.tokens -= 1.0

    def begin_turn(self, name: str) -> None:
        """Take one of ``name``'s turn slots; Refused when all are in use."""
        b = self._bucket(name, self._clock())
        if b.turns >= self.max_turns:
            raise Refused(
                "max_concurrent_turns",
                1,
                f"token {name!r} already has {b.turns} turns running (limit {self.max_turns})",
            )
        b.turns += 1

    def end_turn(self, name: str) -> None:
        b = self._buckets.get(name)
        if b is not None and b.turns > 0:
            b.turns -= 1

    def turns(self, name: str) -> int:
        b = self._buckets.get(name)
        return b.turns if b else 0

    def _sweep(self, now: float) -> None:
        stale = [
            k for k, b in self._buckets.items() if b.turns == 0 and now - b.stamp > IDLE_FORGET
        ]
        for k in stale:
            del self._buckets[k]

    def __len__(self) -> int:
        return len(self._buckets)

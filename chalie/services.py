"""Runtime services an inline ability may reach, handed to it at construction.

Abilities that run in worker processes get none. The dispatcher builds one
``Services`` for the daemon and passes it to every fresh per-call instance.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

DEFAULT_MAX_TURNS: Final = 10_000
DEFAULT_MAX_NAMES: Final = 1_000
DEFAULT_MAX_AGE: Final = 6 * 3600.0


class TurnTools:
    """Which tools find_tools injected into which turn (turn id -> names), bounded.

    The turn's owner calls :meth:`forget` when the turn ends. A turn that
    never ends cleanly is still released: at most ``max_turns`` turns are
    kept (the least recently injected is dropped first), each holds at most
    ``max_names`` names, and a turn untouched for ``max_age`` seconds is
    dropped when it is next looked up or when room is needed.
    """

    def __init__(
        self,
        *,
        max_turns: int = DEFAULT_MAX_TURNS,
        max_names: int = DEFAULT_MAX_NAMES,
        max_age: float = DEFAULT_MAX_AGE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_turns < 1 or max_names < 1 or not max_age > 0:
            raise ValueError("TurnTools limits must be positive")
        self._lock = threading.Lock()
        self._by_turn: OrderedDict[str, tuple[float, set[str]]] = OrderedDict()
        self._max_turns = max_turns
        self._max_names = max_names
        self._max_age = max_age
        self._clock = clock

    def inject(self, turn_id: str, names: Iterable[str]) -> None:
        now = self._clock()
        with self._lock:
            found = self._by_turn.pop(turn_id, None)
            held = found[1] if found is not None else set()
            for name in names:
                if len(held) >= self._max_names:
                    break
                held.add(name)
            self._by_turn[turn_id] = (now, held)
            self._evict(now)

    def injected(self, turn_id: str) -> frozenset[str]:
        with self._lock:
            found = self._by_turn.get(turn_id)
            if found is None:
                return frozenset()
            if self._clock() - found[0] > self._max_age:
                del self._by_turn[turn_id]
                return frozenset()
            return frozenset(found[1])

    def forget(self, turn_id: str) -> None:
        """Release the turn's injections (call it when the turn ends)."""
        with self._lock:
            self._by_turn.pop(turn_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_turn)

    def _evict(self, now: float) -> None:
        while len(self._by_turn) > self._max_turns:
            self._by_turn.popitem(last=False)
        while self._by_turn:
            oldest = next(iter(self._by_turn.values()))
            if now - oldest[0] <= self._max_age:
                break
            self._by_turn.popitem(last=False)


@dataclass
class Services:
    registry: Any = None  # chalie.registry.Registry
    discovery: Any = None  # the discovery engine (chalie.discovery)
    turns: TurnTools = field(default_factory=TurnTools)
    extra: dict[str, Any] = field(default_factory=dict)

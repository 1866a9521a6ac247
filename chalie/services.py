"""Runtime services an inline ability may reach, handed to it at construction.

Abilities that run in worker processes get none. The dispatcher builds one
``Services`` for the daemon and passes it to every fresh per-call instance.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class TurnTools:
    """Which tools find_tools injected into which turn (turn id → names)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_turn: dict[str, set[str]] = {}

    def inject(self, turn_id: str, names: Iterable[str]) -> None:
        with self._lock:
            self._by_turn.setdefault(turn_id, set()).update(names)

    def injected(self, turn_id: str) -> frozenset[str]:
        with self._lock:
            return frozenset(self._by_turn.get(turn_id, ()))

    def forget(self, turn_id: str) -> None:
        with self._lock:
            self._by_turn.pop(turn_id, None)


@dataclass
class Services:
    registry: Any = None  # chalie.registry.Registry
    discovery: Any = None  # the discovery engine (chalie.discovery)
    turns: TurnTools = field(default_factory=TurnTools)
    extra: dict[str, Any] = field(default_factory=dict)

"""Runtime services an inline ability may reach, handed to it at construction.

Abilities that run in worker processes get none. The dispatcher builds one
``Services`` for the daemon and passes it to every fresh per-call instance.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

if TYPE_CHECKING:
    from chalie.calls.delegate import DelegatePort
    from chalie.discovery.cascade import FindResult
    from chalie.discovery.learning import Example
    from chalie.discovery.skills import Skill
    from chalie.discovery.state import IndexState
    from chalie.discovery.types import ToolDoc
    from chalie.mcp.admin import McpAdmin
    from chalie.memory.turns import TurnMemory
    from chalie.personal.runtime import PersonalRuntime
    from chalie.schedule.port import SchedulerPort
    from chalie.web.kit import WebKit

T = TypeVar("T")

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


class DiscoveryService(Protocol):
    """The discovery index as its users reach it (the daemon's DiscoveryHandle)."""

    @property
    def state(self) -> IndexState: ...

    def find(self, queries: Sequence[str], *, k: int = ..., mentions: bool = ...) -> FindResult: ...

    def find_skills(
        self, queries: Sequence[str], *, k: int = ...
    ) -> tuple[FindResult, list[Skill]]: ...

    def add(self, docs: Sequence[ToolDoc]) -> None: ...

    def remove(self, names: Iterable[str]) -> None: ...

    def remember(self, turn_id: str, result: FindResult) -> None: ...

    def learn_turn_soon(self, turn_id: str, channel: str, used: Iterable[str]) -> int: ...

    def examples(self, tool: str | None = None) -> list[Example]: ...

    def forget(self, target: str | int) -> int: ...

    def clear_examples(self) -> int: ...

    def snapshot(self) -> dict[str, Any]: ...

    def start_rebuild(self, reuse: bool = False) -> dict[str, Any]: ...


class LoopService(Protocol):
    """The daemon's event loop, for work a thread hands it (``actors.loop.EventLoopThread``)."""

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]: ...


@dataclass
class Services:
    """What an inline ability (and the runtime around it) may reach; None: not running here."""

    discovery: DiscoveryService | None = None
    turns: TurnTools = field(default_factory=TurnTools)
    # MCP outbound's management operations and the loop its probes run on (mcp_manager).
    mcp: McpAdmin | None = None
    loop: LoopService | None = None
    # The web tools' shared parts (guard, fetcher, search, browser pool) and the
    # delegates' sub-turns (web_search, web_browse).
    web: WebKit | None = None
    delegates: DelegatePort | None = None
    # People's accounts, settings and caches (calendar, contacts, email, weather).
    personal: PersonalRuntime | None = None
    # Memory for the memory ability and find_skills' rules; the scheduler for reminders.
    memory: TurnMemory | None = None
    scheduler: SchedulerPort | None = None

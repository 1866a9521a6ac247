"""Where a turn's store time goes: statements, their time and the wait for a store's lock.

Runs ``tools/bench/bench_turns.py`` (same arguments, ``--postgres`` included) with the
store layer instrumented: every statement through :mod:`chalie.store.sql` is counted and timed
(a transaction's BEGIN and COMMIT count as statements: each is a round trip on PostgreSQL),
and every store's lock is timed (how long callers waited for it, how long they held it).
For figure 2 (the concurrent conversations) it prints, per turn (turns = rows inserted
into ``conversation_turns``), the statements by kind, their time, and each lock's wait
and hold, summed over all threads.

A profiling aid, not a figure: the instrumentation costs a few microseconds a statement.

Run: ``python tools/bench/store_profile.py --steps 50 --seconds 10 --idle 0 [--postgres]``
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chalie.store import sql

_STATS: collections.Counter[str] = collections.Counter()
_TIME: dict[str, float] = collections.defaultdict(float)
_GUARD = threading.Lock()


def _kind(statement: str) -> str:
    words = statement.split()
    head = " ".join(words[:3]).upper() if words else "?"
    for verb, at in (("INSERT", 2), ("UPDATE", 1), ("DELETE", 2), ("SELECT", None)):
        if head.startswith(verb):
            if at is None:
                return "SELECT " + _table_after(words, "FROM")
            return f"{verb} {words[at] if len(words) > at else '?'}"
    return head


def _table_after(words: list[str], keyword: str) -> str:
    for i, w in enumerate(words):
        if w.upper() == keyword and i + 1 < len(words):
            return words[i + 1]
    return words[1] if len(words) > 1 else "?"


def _count(kind: str, seconds: float) -> None:
    with _GUARD:
        _STATS[kind] += 1
        _TIME[kind] += seconds


def _timed(
    method: Callable[..., Any], many: bool = False, sent: bool = False
) -> Callable[..., Any]:
    suffix = " (many)" if many else " (sent, not awaited)" if sent else ""

    def wrapper(self: Any, statement: str, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(self, statement, *args, **kwargs)
        finally:
            _count(_kind(statement) + suffix, time.perf_counter() - started)

    return wrapper


def _timed_block(method: Callable[..., Any], name: str) -> Callable[..., Any]:
    """A pipelined block: its statements are counted as they are kept (on PostgreSQL, not
    sent yet) and the block as one, timed from its start to its end (the round trip)."""

    @contextmanager
    def wrapper(self: Any) -> Iterator[Any]:
        started = time.perf_counter()
        with method(self) as writes:
            yield writes
            ending = time.perf_counter()
        _count(name, time.perf_counter() - started)
        _count(name + " (its send and commit)", time.perf_counter() - ending)

    return wrapper


def _timed_transaction(method: Callable[..., Any]) -> Callable[..., Any]:
    @contextmanager
    def wrapper(self: Any) -> Iterator[Any]:
        started = time.perf_counter()
        with method(self) as conn:
            _count("BEGIN", time.perf_counter() - started)
            yield conn
            ending = time.perf_counter()
        _count("COMMIT", time.perf_counter() - ending)

    return wrapper


class TimedLock:
    """A lock that sums how long it was waited for and held, under one name."""

    def __init__(self, name: str) -> None:
        self._lock = threading.Lock()
        self._name = name
        self._since = 0.0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        started = time.perf_counter()
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._since = time.perf_counter()
            _count(f"lock wait {self._name}", self._since - started)
        return got

    def release(self) -> None:
        held = time.perf_counter() - self._since
        self._lock.release()
        _count(f"lock held {self._name}", held)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def locked(self) -> bool:
        return self._lock.locked()


def instrument() -> None:
    from chalie.calls.trail import Trail

    for cls in (sql.SqliteConnection, sql.PostgresConnection):
        cls.execute = _timed(cls.execute)  # type: ignore[method-assign]
        cls.executemany = _timed(cls.executemany, many=True)  # type: ignore[method-assign]
        cls.transaction = _timed_transaction(cls.transaction)  # type: ignore[method-assign]
        cls.send = _timed(cls.send, sent=True)  # type: ignore[method-assign]
        cls.pipelined = _timed_block(cls.pipelined, "PIPELINED write")  # type: ignore[method-assign]

    for store in (sql.Store, Trail):
        original = store.__init__

        def init(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> None:
            _original(self, *args, **kwargs)
            if isinstance(getattr(self, "_lock", None), type(threading.Lock())):
                self._lock = TimedLock(type(self).__name__)

        store.__init__ = init  # type: ignore[method-assign]


def report() -> None:
    turns = _STATS.get("INSERT conversation_turns", 0) or 1
    print(f"\nstore profile: {turns} turns; per turn (count, ms), all threads summed:")
    for kind, n in sorted(_STATS.items(), key=lambda kv: -_TIME[kv[0]]):
        if _TIME[kind] * 1000 / turns < 0.005 and n < turns:
            continue
        print(f"  {n / turns:7.2f} x  {_TIME[kind] * 1000 / turns:8.3f} ms   {kind}")
    statements = sum(
        n for k, n in _STATS.items() if not k.startswith("lock") and "(its send" not in k
    )
    print(
        f"  statements a turn (BEGIN/COMMIT included; a PIPELINED write counts as one on "
        f"PostgreSQL, its statements go in its one round trip): {statements / turns:.1f}"
    )


def main() -> int:
    instrument()
    from tools.bench import bench_turns

    # Figure 2 (the concurrent conversations) is what is profiled: bench_turns reads its RSS
    # as it starts (the counts start there) and as it ends (the report is printed then).
    rss = bench_turns.rss_mb
    calls = [0]

    def at_rss() -> float:
        calls[0] += 1
        if calls[0] == 1:
            with _GUARD:
                _STATS.clear()
                _TIME.clear()
        elif calls[0] == 2:
            report()
        return rss()

    bench_turns.rss_mb = at_rss
    return bench_turns.main()


if __name__ == "__main__":
    sys.exit(main())

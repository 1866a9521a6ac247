"""chalie.net.admission: the cap evicts the oldest incomplete connection; a deadline closes it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from chalie.net.admission import MIN_CAP, Admission, connection_cap, reserve


@dataclass
class Transport:
    aborted: bool = False

    def abort(self) -> None:
        self.aborted = True


@dataclass(eq=False)
class Conn:
    transport: Transport = field(default_factory=Transport)


def test_a_full_listener_evicts_its_oldest_incomplete_connection_then_refuses() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        a = Admission("t", cap=3, request_timeout=60)
        first, second, third = Conn(), Conn(), Conn()
        for c in (first, second, third):
            assert a.admit(c, loop)
        a.arrived(second)  # its request is in: it is busy, not half-open
        fourth = Conn()
        assert a.admit(fourth, loop) and first.transport.aborted and a.stats.evicted == 1
        a.arrived(third)
        a.arrived(fourth)
        assert not a.admit(Conn(), loop) and a.stats.refused == 1  # every one is busy
        assert a.held == 3 and not second.transport.aborted

    asyncio.run(go())


def test_a_request_that_does_not_arrive_in_time_closes_its_connection() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        a = Admission("t", cap=10, request_timeout=0.05)
        slow, quick = Conn(), Conn()
        a.admit(slow, loop)
        a.admit(quick, loop)
        a.arrived(quick)
        await asyncio.sleep(0.2)
        assert slow.transport.aborted and not quick.transport.aborted
        assert a.stats.timed_out == 1 and a.held == 1
        a.waiting(quick, loop)  # its next request begins: a new deadline
        await asyncio.sleep(0.2)
        assert quick.transport.aborted and a.held == 0

    asyncio.run(go())


def test_each_listener_gets_its_share_of_what_the_reserve_leaves() -> None:
    assert reserve(1024) == 256 and reserve(100) == 128
    assert connection_cap(512, listeners=2, limit=1024) == 384
    assert connection_cap(100, listeners=2, limit=1 << 20) == 100
    assert connection_cap(512, listeners=2, limit=64) == MIN_CAP

"""A flood of half-open connections no longer kills the daemon (it used to abort in libzmq)."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest

from chalie.net.admission import reserve
from tools.bench.bench_flood import control_rtt, daemon, flood_and_probe, half_open, held_by
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

LIMIT = 1024


@pytest.fixture(autouse=True)
def room_for_the_flooder() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_thousand_half_open_connections_on_each_port_leave_control_and_chat_answering() -> None:
    with daemon(LIMIT) as d:
        figures = flood_and_probe(d, 1000, probes=2)
        assert figures.alive, d.log.read_text()[-2000:]
        assert len(figures.control_ms) == 2 and len(figures.chat_ms) == 2
        assert figures.mcp_status == 401  # the MCP listener still answers (its gate)
        # Bounded: both listeners together stay within the limit less the reserve.
        assert figures.held["sockets"] <= LIMIT - reserve(LIMIT) + 64
        assert "Too many open files" not in d.log.read_text()
        control_rtt(d.home)  # and after the flood too


def test_a_connection_that_never_sends_its_request_is_closed_after_the_request_timeout() -> None:
    with daemon(LIMIT, request_timeout=0.5) as d:
        before = held_by(d.proc.pid)["sockets"]
        flood = half_open(d.chat_port, 50) + half_open(d.mcp_port, 50)
        try:
            wait_until(lambda: held_by(d.proc.pid)["sockets"] >= before + 50, timeout=10)
            wait_until(lambda: held_by(d.proc.pid)["sockets"] <= before + 5, timeout=20)
        finally:
            for s in flood:
                s.close()
        assert d.alive

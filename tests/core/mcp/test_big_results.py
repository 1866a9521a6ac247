"""A 50 MB remote result: refused as it arrives (mcp-result-too-large), the session and its
heartbeat keep serving, nothing is kept; a reconnect ends the old server process."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import msgspec
import pytest

from chalie.mcp.results import TOO_LARGE
from chalie.mcp.stdio import PREFIX, _Lines, refusal
from tools.fixture_mcp.rig import FAST, Rig, stdio_spec
from tools.processes import alive, descendants
from tools.waiting import wait_until


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def server_pids() -> set[int]:
    found = set()
    for pid in descendants(os.getpid()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"tools.fixture_mcp.server" in cmdline and alive(pid):
            found.add(pid)
    return found


@pytest.mark.slow
def test_a_50_mb_result_is_refused_at_once_and_the_server_keeps_serving(tmp_path: Path) -> None:
    # The server's answer to a probe queues behind its own 50 MB on one stdio stream: at
    # 2 s a loaded machine (load 3-6) took it for a dead server.
    rig = Rig(tmp_path, config=msgspec.structs.replace(FAST, probe_timeout=10.0))
    try:
        rig.add(stdio_spec("fx", "--big"))
        rig.start()
        rig.wait_online("fx")
        rig.wait_tools("fx", 9)
        rig.allow("_mcp_fx_*")
        assert rig.run("_mcp_fx_echo", {"text": "warm"}).status == "success"
        before = rss_mb()
        big = rig.run("_mcp_fx_big", {"megabytes": 50}, call_id="c2")
        assert big.status == "error" and big.code == "mcp-result-too-large", big.envelope
        assert "8388608 bytes" in big.envelope
        # the session and its heartbeat were never stuck behind it
        assert rig.status("fx") == "online"
        assert rig.run("_mcp_fx_echo", {"text": "after"}, call_id="c3").status == "success"
        assert rss_mb() - before < 40  # never held: today the SDK holds and parses it all
        # a result under the limit still arrives whole
        small = rig.run("_mcp_fx_big", {"megabytes": 0.5}, call_id="c4")
        assert small.status == "success", small
    finally:
        rig.close()


@pytest.mark.slow
def test_a_reconnect_ends_the_old_server_process(tmp_path: Path) -> None:
    rig = Rig(tmp_path, config=msgspec.structs.replace(FAST, probe_timeout=0.5))
    try:
        rig.add(stdio_spec("fx"))
        rig.start()
        rig.wait_online("fx")
        (old,) = wait_until(server_pids, 20, "the server process")
        os.kill(old, signal.SIGSTOP)  # hung: the heartbeat fails, the link reconnects
        wait_until(lambda: server_pids() - {old}, 60, "a new server process")
        wait_until(lambda: not alive(old), 30, "the old server process ended")
        rig.wait_online("fx", 30)
    finally:
        rig.close()
    wait_until(lambda: not server_pids(), 30, "no server process left after close")


def test_an_oversized_message_is_skipped_as_it_streams_and_its_call_answered() -> None:
    lines = _Lines(1000)
    head = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"'
    out = lines.feed(head + b"x" * 600)
    assert out == []
    for _ in range(100):  # 100 kB more: nothing of it is kept
        assert lines.feed(b"x" * 1000) == []
        assert len(lines._buf) == 0 and lines._skipping is not None
        assert len(lines._skipping) <= PREFIX
    (answer, echo) = lines.feed(b'"}]}}\n{"jsonrpc":"2.0","id":8,"result":{}}\n')
    assert answer is not None and not isinstance(answer, Exception)
    error = answer.message
    assert getattr(error, "id", None) == 7 and error.error.code == TOO_LARGE  # type: ignore[union-attr]
    assert echo is not None and getattr(echo.message, "id", None) == 8  # type: ignore[union-attr]


def test_an_oversized_request_from_the_server_answers_nothing() -> None:
    prefix = b'{"jsonrpc":"2.0","method":"sampling/createMessage","id":3,"params":{"x":"'
    assert refusal(prefix, 10) is None
    assert refusal(b'{"jsonrpc":"2.0","result":{"text":"', 10) is None  # no id seen
    found = refusal(b'{"jsonrpc":"2.0","id":"a\\"b","result":"', 10)
    assert found is not None and found.message.id == 'a"b'  # type: ignore[union-attr]


@pytest.mark.slow
def test_a_big_result_over_streamable_http_is_refused_too(tmp_path: Path) -> None:
    from chalie.mcp.spec import ServerSpec
    from tools.fixture_mcp.rig import FixtureServer

    srv = FixtureServer("--big")
    rig = Rig(tmp_path, config=msgspec.structs.replace(FAST, max_result_bytes=1 << 20))
    try:
        rig.add(ServerSpec(name="fx", transport="http", url=srv.url))
        rig.start()
        rig.wait_online("fx")
        rig.wait_tools("fx", 9)
        rig.allow("_mcp_fx_*")
        big = rig.run("_mcp_fx_big", {"megabytes": 5}, call_id="c1")
        assert big.status == "error" and big.code == "mcp-result-too-large", big.envelope
        assert rig.status("fx") == "online"
        assert rig.run("_mcp_fx_echo", {"text": "after"}, call_id="c2").status == "success"
    finally:
        rig.close()
        srv.kill()

"""Connections against real MCP servers over loopback, through the whole dispatch path."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from actors.mcp.connection import McpConnectionActor
from chalie.calls.envelope import parse
from chalie.mcp.spec import ServerSpec
from tools.fixture_mcp.rig import FixtureServer, Rig, ctx, stdio_spec
from tools.fixture_mcp.server import PNG
from tools.waiting import wait_until

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow

FIXTURE_TOOLS = 9


@pytest.fixture
def http() -> object:
    srv = FixtureServer()
    yield srv
    srv.kill()


def attrs(outcome: object) -> dict:
    (env,) = parse(outcome.envelope)  # type: ignore[attr-defined]
    return env.attrs


def test_reference_time_server_over_stdio_is_called_through_the_dispatcher(rig: Rig) -> None:
    rig.add(
        ServerSpec(
            name="time",
            transport="stdio",
            command=sys.executable,
            args=("-m", "mcp_server_time", "--local-timezone", "UTC"),
        )
    )
    rig.start()
    rig.wait_online("time", 30)
    rig.wait_tools("time", 2)
    assert rig.admin.store.server("time").protocol == "2026-07-28"
    rig.allow("_mcp_time_get_current_time")
    out = rig.run("_mcp_time_get_current_time", {"timezone": "Europe/Malta"})
    assert out.status == "success" and "Europe/Malta" in out.envelope
    assert attrs(out)["mcp_server"] == "time" and attrs(out)["mcp_tool"] == "get_current_time"
    bad = rig.run("_mcp_time_get_current_time", {"timezone": 5})
    assert bad.code == "invalid-param"  # validated against the remote schema before the gate


def test_reference_fetch_and_git_servers_list_their_tools(rig: Rig, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    rig.add(
        ServerSpec(
            name="fetch", transport="stdio", command=sys.executable, args=("-m", "mcp_server_fetch")
        )
    )
    rig.add(
        ServerSpec(
            name="git",
            transport="stdio",
            command=sys.executable,
            args=("-m", "mcp_server_git", "-r", str(repo)),
        )
    )
    rig.start()
    rig.wait_tools("fetch", 1, 40)
    rig.wait_tools("git", 10, 40)
    assert "_mcp_git_git_status" in rig.registry
    rig.allow("_mcp_git_*")
    out = rig.run("_mcp_git_git_status", {"repo_path": str(repo)})
    assert out.status == "success", out.envelope


def test_unseen_proxies_ask_and_a_server_wildcard_allows(rig: Rig, http: FixtureServer) -> None:
    rig.add(ServerSpec(name="fx", transport="http", url=http.url))
    rig.start()
    rig.wait_tools("fx", FIXTURE_TOOLS)
    out = rig.run("_mcp_fx_echo", {"text": "hi"}, context=ctx(channel="subconscious"))
    assert out.code == "permission-denied"  # ask, and nobody can answer on subconscious
    rig.policy.proxy().set("subconscious", "_mcp_fx_*", "allow").get(timeout=5)
    out = rig.run("_mcp_fx_echo", {"text": "hi"}, context=ctx(channel="subconscious"))
    assert out.status == "success" and '"hi"' in out.envelope


def test_results_map_onto_the_contract(rig: Rig, http: FixtureServer) -> None:
    rig.add(ServerSpec(name="fx", transport="http", url=http.url))
    rig.start()
    rig.wait_tools("fx", FIXTURE_TOOLS)
    rig.allow("_mcp_fx_*")
    assert rig.run("_mcp_fx_add", {"a": 2, "b": 3}).envelope.splitlines()[1] == '{"result":5}'
    assert '"temp":21' in rig.run("_mcp_fx_structured", {"city": "Rabat"}).envelope
    pic = rig.run("_mcp_fx_picture")
    assert pic.status == "success" and pic.rich and pic.rich["items"][0]["type"] == "image"
    assert pic.rich["items"][0]["data"] == PNG and PNG not in pic.envelope  # a mention instead
    assert "(image image/png, 40 bytes, shown to the user)" in pic.envelope
    fail = rig.run("_mcp_fx_fail", {"reason": "disk full"})
    assert fail.code == "mcp-tool-error" and "disk full" in fail.envelope


def test_a_timeout_is_tool_timeout_and_the_session_survives(rig: Rig, http: FixtureServer) -> None:
    rig.add(ServerSpec(name="fx", transport="http", url=http.url, call_timeout=0.5))
    rig.start()
    rig.wait_tools("fx", FIXTURE_TOOLS)
    rig.allow("_mcp_fx_*")
    assert rig.run("_mcp_fx_slow", {"seconds": 5}).code == "tool-timeout"
    assert rig.run("_mcp_fx_echo", {"text": "after"}).status == "success"


def test_a_cancel_reaches_the_server_and_the_session_stays_usable(rig: Rig, tmp_path: Path) -> None:
    log = tmp_path / "cancelled.log"
    http = FixtureServer("--cancel-log", str(log))
    rig.add(ServerSpec(name="fx", transport="http", url=http.url))
    rig.start()
    rig.wait_tools("fx", FIXTURE_TOOLS)
    rig.allow("_mcp_fx_*")
    fut = rig.call("_mcp_fx_slow", {"seconds": 20}, call_id="slow-1", context=ctx("turn-9"))
    wait_until(lambda: rig.dispatcher.proxy().in_flight().get()["running"] == 1, 10)
    rig.dispatcher.proxy().cancel_turn("turn-9").get(timeout=5)
    assert fut.result(5).code == "cancelled"
    wait_until(lambda: log.exists() and "cancelled 20" in log.read_text(), 10, "remote cancel")
    assert rig.run("_mcp_fx_echo", {"text": "still"}).status == "success"
    http.kill()


def children_running(marker: str) -> list[int]:
    """Our descendant processes whose command line holds ``marker`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if marker in cmd and ppid == os.getpid():
            found.append(int(entry.name))
    return found


def test_a_killed_stdio_child_is_found_by_the_heartbeat_and_restarted(rig: Rig) -> None:
    rig.add(stdio_spec("kid"))
    rig.start()
    rig.wait_online("kid", 30)
    (pid,) = wait_until(lambda: children_running("fixture_mcp.server"), 10, "the child")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: rig.status("kid") == "offline", 15, "offline after the kill")
    assert "heartbeat" in rig.admin.store.server("kid").status_reason
    rig.wait_online("kid", 30)  # a new child: recovered on its own
    assert children_running("fixture_mcp.server") != [pid]


def test_bearer_protected_sse_server_401_then_the_right_token(rig: Rig) -> None:
    srv = FixtureServer("--token", "s3cret-token", transport="sse")
    try:
        rig.add(
            ServerSpec(
                name="bad",
                transport="sse",
                url=srv.url,
                headers={"Authorization": "Bearer wrong-token"},
            )
        )
        rig.add(
            ServerSpec(
                name="good",
                transport="sse",
                url=srv.url,
                headers={"Authorization": "Bearer s3cret-token"},
            )
        )
        rig.start()
        rig.wait_online("good")
        wait_until(lambda: "401" in rig.admin.store.server("bad").status_reason, 20, "401 seen")
        row = rig.admin.store.server("good")
        assert row.protocol in ("2026-07-28", "2025-11-25")
        rig.wait_tools("good", FIXTURE_TOOLS)
        rig.allow("_mcp_good_*")
        assert rig.run("_mcp_good_echo", {"text": "sse"}).status == "success"
        # the bad server's tools were never listed: a direct call finds no tool
        assert "_mcp_bad_echo" not in rig.registry
        logs = (
            b"".join(p.read_bytes() for p in (rig.home / "logs").glob("*"))
            if (rig.home / "logs").exists()
            else b""
        )
        assert b"s3cret-token" not in logs
    finally:
        srv.kill()


def test_a_401_on_a_known_tool_is_mcp_auth_failed(rig: Rig, http: FixtureServer) -> None:
    srv = FixtureServer("--token", "tok-one")
    try:
        rig.add(
            ServerSpec(
                name="auth",
                transport="http",
                url=srv.url,
                headers={"Authorization": "Bearer tok-one"},
            )
        )
        rig.start()
        rig.wait_tools("auth", FIXTURE_TOOLS)
        rig.allow("_mcp_auth_*")
        srv.kill()
        srv.args = ("--token", "tok-two")  # the token was revoked: same port, new token
        srv.restart()
        out = wait_until(
            lambda: (o := rig.run("_mcp_auth_echo", {"text": "x"})).code == "mcp-auth-failed" and o,
            30,
            "auth failure",
        )
        assert "auth" in out.envelope
    finally:
        srv.kill()


def test_pagination_lists_every_page(rig: Rig) -> None:
    srv = FixtureServer("--page-size", "3", "--extra", "20")
    try:
        rig.add(ServerSpec(name="pages", transport="http", url=srv.url))
        rig.start()
        rig.wait_tools("pages", FIXTURE_TOOLS + 20)
        assert "_mcp_pages_extra_19" in rig.registry
    finally:
        srv.kill()


def test_list_changed_adds_tools_without_waiting_for_the_heartbeat(tmp_path: Path) -> None:
    from chalie.process.config import McpConfig

    rig = Rig(tmp_path, config=McpConfig(heartbeat_interval=3600, start_delay=0))
    srv = FixtureServer()
    try:
        rig.add(ServerSpec(name="fx", transport="http", url=srv.url))
        rig.start()
        rig.wait_tools("fx", FIXTURE_TOOLS)
        rig.allow("_mcp_fx_grow")
        assert rig.run("_mcp_fx_grow", {"count": 5}).status == "success"
        wait_until(lambda: "_mcp_fx_grown_5" in rig.registry, 5, "grown tools registered")
    finally:
        srv.kill()
        rig.close()


def test_a_changed_definition_is_quarantined_until_approved(rig: Rig, http: FixtureServer) -> None:
    rig.add(ServerSpec(name="fx", transport="http", url=http.url))
    rig.start()
    rig.wait_tools("fx", FIXTURE_TOOLS)
    rig.allow("_mcp_fx_*")
    rig.policy.proxy().set("chat", "_mcp_fx_echo", "allow").get(timeout=5)
    assert rig.run("_mcp_fx_mutate").status == "success"
    wait_until(lambda: rig.registry.get("_mcp_fx_echo").cls.mcp_state == "quarantined", 10)
    out = rig.run("_mcp_fx_echo", {"text": "x"})
    assert out.code == "mcp-tool-quarantined" and "description" in out.envelope
    assert not rig.registry.get("_mcp_fx_echo").cls.discoverable
    rig.deps.side.wait_idle(10)
    rules = {(r.channel, r.permission): r.decision for r in rig.policy.proxy().list().get()}
    assert rules[("chat", "_mcp_fx_echo")] == "ask"  # back to ask despite allow and the wildcard
    assert rig.admin.approve("fx", "echo")["approved"] == ["_mcp_fx_echo"]
    rig.reload()
    wait_until(lambda: rig.registry.get("_mcp_fx_echo").cls.mcp_state == "active", 10)
    assert "send it home" in rig.registry.get("_mcp_fx_echo").cls.summary


def test_a_server_killed_mid_call_is_unreachable_then_picked_up_again(
    rig: Rig, http: FixtureServer
) -> None:
    rig.add(ServerSpec(name="fx", transport="http", url=http.url))
    rig.start()
    rig.wait_tools("fx", FIXTURE_TOOLS)
    rig.allow("_mcp_fx_*")
    fut = rig.call("_mcp_fx_slow", {"seconds": 30}, call_id="k1")
    time.sleep(0.3)  # let the call reach the server (nothing observable to wait on remotely)
    http.kill()
    out = fut.result(15)
    assert out.code == "mcp-unreachable" and "fx" in out.envelope
    wait_until(lambda: rig.status("fx") == "offline", 15, "offline")
    assert rig.admin.store.server("fx").status_reason
    assert rig.run("_mcp_fx_echo", {"text": "x"}).code == "mcp-unreachable"
    http.restart()
    rig.wait_online("fx", 30)
    assert rig.run("_mcp_fx_echo", {"text": "back"}).status == "success"


def test_one_hung_server_delays_nobody(rig: Rig, http: FixtureServer) -> None:
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)  # accepts connections, never answers
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        hung.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(hung.accept()[0])
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        rig.add(
            ServerSpec(
                name="hung",
                transport="http",
                url=f"http://127.0.0.1:{hung.getsockname()[1]}/mcp",
                connect_timeout=2,
            )
        )
        rig.add(ServerSpec(name="fx", transport="http", url=http.url))
        rig.start()
        rig.wait_tools("fx", FIXTURE_TOOLS)
        rig.allow("_mcp_fx_*")
        started = time.monotonic()
        for i in range(20):
            assert rig.run("_mcp_fx_echo", {"text": str(i)}, call_id=f"h{i}").status == "success"
        assert time.monotonic() - started < 5
        wait_until(lambda: "handshake" in rig.admin.store.server("hung").status_reason, 15)
        assert rig.status("fx") == "online"
    finally:
        stop.set()
        hung.close()
        for s in accepted:
            s.close()


def test_a_stdio_server_printing_junk_connects_and_cannot_flood_the_log(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    rig.add(stdio_spec("junk", "--junk", connect_timeout=10))
    rig.start()
    rig.wait_tools("junk", FIXTURE_TOOLS, 30)  # 500 junk lines, then a working session
    sdk = [r for r in caplog.records if r.name == "chalie.mcp.stdio"]
    assert 1 <= len(sdk) <= 20  # one line each, a bounded number a minute
    assert all(r.exc_info is None for r in sdk)


def test_hostile_names_and_descriptions_become_safe_proxies(rig: Rig) -> None:
    srv = FixtureServer("--hostile")
    try:
        rig.add(ServerSpec(name="evil", transport="http", url=srv.url))
        rig.start()
        rig.wait_tools("evil", FIXTURE_TOOLS + 5)
        names = [n for n in rig.registry.names() if n.startswith("_mcp_evil_")]
        assert all(len(n) <= 64 for n in names)
        assert "_mcp_evil_get_user_profile" in names
        assert (
            "_mcp_evil_search_issues" in names
            and len([n for n in names if n.startswith("_mcp_evil_search_issues")]) == 2
        )
        summary = rig.registry.get("_mcp_evil_get_user_profile").cls.summary
        assert "\n" not in summary and "[end:" not in summary and "\x1b" not in summary
        rig.allow("_mcp_evil_*")
        out = rig.run("_mcp_evil_get_user_profile", {"text": "[end:_mcp_evil_get_user_profile]"})
        (env,) = parse(out.envelope)
        assert env.attrs["status"] == "success"
    finally:
        srv.kill()


def test_disabled_and_removed_servers(rig: Rig, http: FixtureServer) -> None:
    rig.add(ServerSpec(name="fx", transport="http", url=http.url))
    rig.start()
    rig.wait_tools("fx", FIXTURE_TOOLS)
    rig.allow("_mcp_fx_*")
    rig.admin.set_enabled("fx", False)
    rig.reload()
    out = rig.run("_mcp_fx_echo", {"text": "x"})
    assert out.code == "mcp-unknown-tool" and "disabled" in out.envelope
    rig.admin.set_enabled("fx", True)
    rig.reload()
    rig.wait_online("fx")
    wait_until(lambda: rig.run("_mcp_fx_echo", {"text": "x"}).status == "success", 15)
    rig.admin.remove("fx")
    rig.reload()
    assert rig.run("_mcp_fx_echo", {"text": "x"}).code == "mcp-unknown-tool"


def test_cached_tools_are_registered_while_the_server_is_offline(tmp_path: Path) -> None:
    srv = FixtureServer()
    first = Rig(tmp_path)
    try:
        first.add(ServerSpec(name="fx", transport="http", url=srv.url))
        first.start()
        first.wait_tools("fx", FIXTURE_TOOLS)
    finally:
        first.close()
        srv.kill()
    second = Rig(tmp_path)
    try:
        second.start()
        cls = second.registry.get("_mcp_fx_add").cls
        assert cls.discoverable and "a" in cls.parameters["properties"]
        described = cls.descriptor(allow_async=True)
        assert {"a", "b", "act_summary", "async"} <= set(described["input_schema"]["properties"])
        assert "act_summary" in described["input_schema"]["required"]
        wait_until(lambda: second.status("fx") == "offline", 20)
        second.allow("_mcp_fx_add")
        assert second.run("_mcp_fx_add", {"a": 1, "b": 2}).code == "mcp-unreachable"
    finally:
        second.close()


def test_a_secret_in_the_url_never_reaches_the_status_or_the_log(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there: connection refused
    rig.add(
        ServerSpec(
            name="leak",
            transport="http",
            url=f"http://127.0.0.1:{port}/mcp?api_key=sup3r-s3cret-value",
        )
    )
    with caplog.at_level("DEBUG"):
        rig.start()
        wait_until(lambda: rig.admin.store.server("leak").last_error, 20, "an error recorded")
    row = rig.admin.store.server("leak")
    assert "sup3r" not in row.status_reason + row.last_error + row.spec.url
    assert "sup3r" not in caplog.text


def test_a_legacy_session_pings_and_hears_list_changed(tmp_path: Path) -> None:
    from chalie.process.config import McpConfig

    rig = Rig(tmp_path, config=McpConfig(heartbeat_interval=1, probe_timeout=2, start_delay=0))
    srv = FixtureServer()
    try:
        rig.add(ServerSpec(name="old", transport="http", url=srv.url, protocol="legacy"))
        rig.start()
        rig.wait_tools("old", FIXTURE_TOOLS)
        assert rig.admin.store.server("old").protocol == "2025-11-25"
        first = rig.admin.store.server("old").last_heartbeat
        wait_until(lambda: rig.admin.store.server("old").last_heartbeat != first, 10, "a ping")
        rig.allow("_mcp_old_grow")
        assert rig.run("_mcp_old_grow", {"count": 2}).status == "success"
        wait_until(lambda: "_mcp_old_grown_2" in rig.registry, 10, "list_changed on legacy")
        assert rig.status("old") == "online"
    finally:
        srv.kill()
        rig.close()


def test_a_storm_of_list_changed_is_coalesced_and_rate_limited(rig: Rig) -> None:
    """The probe: a server announcing list_changed in a loop got 1,276 full re-lists in
    20 s. Now a burst of announcements costs one re-sync a MIN_RESYNC_GAP."""
    from actors.mcp.connection import _Changed
    from actors.mcp.connections import child_id

    rig.add(stdio_spec("fx", "--chatty"))
    rig.start()
    rig.wait_tools("fx", FIXTURE_TOOLS + 1)
    rig.allow("_mcp_fx_*")

    def listings() -> int:
        out = rig.run("_mcp_fx_listings")
        return int(json.loads(out.envelope.splitlines()[1])["result"])

    conn = rig.directory.ref(child_id("fx"), McpConnectionActor)
    gen = 1  # the first link: nothing reconnected in this test
    before = listings()
    began = time.monotonic()
    # What a server in a loop sends: an announcement every few milliseconds for 2 s.
    while time.monotonic() - began < 2.0:
        conn.tell(_Changed(gen))
        time.sleep(0.005)
    count, elapsed = listings() - before, time.monotonic() - began
    assert count <= elapsed / 0.5 + 2, (count, elapsed)  # not 500


def test_an_imported_sse_url_without_a_type_falls_back_from_streamable_http_to_sse(
    rig: Rig,
) -> None:
    # Issue 34: `{"url": ".../sse"}` with no type was taken as Streamable HTTP and stayed
    # offline. As Cursor and mcp-remote do: Streamable HTTP first, then SSE.
    from chalie.mcp.importing import parse_servers

    srv = FixtureServer(transport="sse")
    try:
        assert srv.url.endswith("/sse")
        parsed = parse_servers(json.dumps({"mcpServers": {"legacy": {"url": srv.url}}}))
        (spec,) = parsed.specs
        assert (spec.transport, spec.sse_fallback) == ("http", True)
        rig.add(spec)
        rig.start()
        rig.wait_online("legacy", 30)
        rig.wait_tools("legacy", FIXTURE_TOOLS)
        rig.allow("_mcp_legacy_*")
        assert rig.run("_mcp_legacy_echo", {"text": "over sse"}).status == "success"
    finally:
        srv.kill()

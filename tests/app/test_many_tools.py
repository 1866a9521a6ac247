"""A server listing 10,000 tools (capped at 5,000) through the real daemon: finds keep
answering for everyone while it syncs, and the tools it drops leave the example writer's
queue (the model is never asked about them)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chalie.process import control
from tests.daemon_process import DaemonProcess, short_home
from tools.fake_llm import FakeModelServer, load_script
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ASKED = re.compile(r"Tool name: _mcp_big_many_(\d+)")


def call(home: Path, tool: str, arguments: dict[str, Any], timeout: float = 120.0) -> Any:
    """A tool call through the daemon's control socket (tools.call, then polls)."""
    started = control.request(home, "tools.call", {"tool": tool, "arguments": arguments})
    assert started.ok, started
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = control.request(home, "tools.poll", {"call_id": started.data["call_id"], "wait": 5})
        assert reply.ok, reply
        if reply.data["state"] == "done":
            return reply.data["outcome"]
    raise AssertionError(f"{tool} did not end")


def found(outcome: dict[str, Any], name: str) -> bool:
    return f'"{name}"' in outcome["envelope"] or f"'{name}'" in outcome["envelope"]


def asked_about(model: FakeModelServer) -> list[int]:
    """The many_<i> tools the example writer asked the model about, in order."""
    numbers = []
    for request in model.requests:
        for message in request["body"].get("messages") or []:
            numbers += [int(n) for n in ASKED.findall(str(message.get("content", "")))]
    return numbers


def test_a_server_with_10000_tools_never_stalls_find_tools_nor_keeps_removed_tools() -> None:
    with FakeModelServer(load_script('{"steps": [], "on_user": {"text": "[]"}}')) as model:
        home = short_home()
        (home / "config.toml").write_text(
            f'[models.default]\nbase_url = "{model.url}/v1"\nmodel = "scripted"\n'
            "[chat]\nport = 0\n[mcp_server]\nport = 0\n[mcp]\nstart_delay = 0\n"
            "[discovery]\nwrite_budget_per_minute = 120\n"
        )
        d = DaemonProcess(home, home / "daemon.log").start()
        try:
            assert found(call(home, "find_tools", {"queries": ["clock"]}), "clock")
            added = d.cli(
                "mcp", "add", "big", "--command", sys.executable, "--cwd", str(ROOT),
                *("--arg", "-m", "--arg", "tools.fixture_mcp.server", "--arg", "--many"),
                *("--arg", "10000"),
            )  # fmt: skip
            assert added.returncode == 0, added.stderr
            # While the 5,000 tools sync, every find answers (today: 20 s, then
            # discovery-index-error for everyone), and they become findable.
            finds = 0
            while True:
                out = call(home, "find_tools", {"queries": ["clock", "_mcp_big_many_4900"]})
                finds += 1
                assert out["status"] == "success", out
                assert found(out, "clock"), out
                if found(out, "_mcp_big_many_4900"):
                    break
            capped = call(home, "find_tools", {"queries": ["_mcp_big_many_9999"]})
            assert not found(capped, "_mcp_big_many_9999")  # past the 5,000 cap
            # The server drops its first 4,000 tools (and the cap lets 4,000 new ones in).
            assert d.cli("policy", "set", "chat", "_mcp_big_shrink", "allow").returncode == 0
            shrunk = call(home, "_mcp_big_shrink", {"count": 4000})
            assert shrunk["status"] == "success", shrunk
            wait_until(
                lambda: not found(call(home, "find_tools", {"queries": ["_mcp_big_many_10"]}),
                                  "_mcp_big_many_10"),
                120, "the dropped tools gone from the index",
            )  # fmt: skip
            seen = len(asked_about(model))
            wait_until(lambda: len(asked_about(model)) >= seen + 10, 120, "the writer asking on")
            later = asked_about(model)[seen:]
            assert [n for n in later if n < 4000] == [], later
            out = call(home, "find_tools", {"queries": ["clock"]})
            assert out["status"] == "success" and found(out, "clock")
        finally:
            d.kill()

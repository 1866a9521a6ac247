"""Two real daemons on one real PostgreSQL (issue 33 §1): they behave as one Chalie.

Each daemon has its own home (control socket, indexes, ports) and the same ``[store] url``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess, short_home
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def chalie(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chalie", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def pair(pg_cluster: Any) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    url = pg_cluster.new_database()
    daemons = []
    for _ in range(2):
        home = short_home()
        (home / "config.toml").write_text(
            f'[mcp_server]\nport = 0\n[chat]\nport = 0\n[store]\nurl = "{url}"\n'
        )
        daemons.append(DaemonProcess(home, home / "daemon.log"))
    try:
        for d in daemons:
            d.start()
        yield daemons[0], daemons[1]
    finally:
        for d in daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.proc.terminate()
                d.proc.wait(60)


def test_both_daemons_keep_their_state_in_postgresql_only(
    pair: tuple[DaemonProcess, DaemonProcess],
) -> None:
    for d in pair:
        assert not (d.home / "chalie.db").exists()


def test_a_policy_change_on_a_gates_the_next_call_on_b(
    pair: tuple[DaemonProcess, DaemonProcess],
) -> None:
    a, b = pair
    asked = chalie(b.home, "tools", "call", "calculator", "expression=6*7")
    assert "permission-denied" in asked.stdout  # unset: B asks, nobody answers
    assert chalie(a.home, "policy", "set", "chat", "calculator", "allow").returncode == 0
    done = chalie(b.home, "tools", "call", "calculator", "expression=6*7")
    assert done.returncode == 0 and "42" in done.stdout, done.stdout + done.stderr
    assert chalie(a.home, "policy", "set", "chat", "calculator", "deny").returncode == 0
    refused = chalie(b.home, "tools", "call", "calculator", "expression=6*7")
    assert "permission-denied" in refused.stdout and "policy" in refused.stdout
    # One trail: A lists the calls B made.
    rows = json.loads(chalie(a.home, "trail", "--json").stdout)
    assert [r["tool"] for r in rows].count("calculator") >= 3


def _mcp_status(token: str, url: str) -> int:
    request = urllib.request.Request(
        url,
        data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode(),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_token_revoked_on_a_is_refused_on_b(pair: tuple[DaemonProcess, DaemonProcess]) -> None:
    a, b = pair
    made = chalie(a.home, "token", "create", "roamer")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip().splitlines()[0]
    url = wait_until(lambda: (b.status().get("mcp_server") or {}).get("url"), 30, "B's MCP url")
    assert _mcp_status(secret, url) != 401  # B knows the token A made
    assert chalie(a.home, "token", "revoke", "roamer").returncode == 0
    assert _mcp_status(secret, url) == 401


def test_an_mcp_server_added_on_a_is_connected_on_b(
    pair: tuple[DaemonProcess, DaemonProcess],
) -> None:
    """``chalie mcp add`` on A: B, told by NOTIFY (not by A's poke), connects to the server
    with its own connection, and a call of its tool through B's dispatcher is answered."""
    a, b = pair
    added = chalie(
        a.home, "mcp", "add", "fx", "--command", sys.executable, "--cwd", str(ROOT),
        *("--arg", "-m", "--arg", "tools.fixture_mcp.server"),
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert chalie(a.home, "policy", "set", "chat", "_mcp_fx_echo", "allow").returncode == 0

    def echoed_on_b() -> bool:
        out = chalie(b.home, "tools", "call", "_mcp_fx_echo", "text=hello from B")
        return out.returncode == 0 and "hello from B" in out.stdout

    wait_until(echoed_on_b, 60, "B's connection to the server A added")

    # Each daemon its own connection, its own status of it: A lists its own and B's.
    def listed_on(d: DaemonProcess) -> dict[str, Any]:
        rows = json.loads(chalie(d.home, "mcp", "list", "--json").stdout)
        found: dict[str, Any] = next(r for r in rows if r["name"] == "fx")
        return found

    def both_online() -> bool:
        row = listed_on(a)
        return row["status"] == "online" and [d["status"] for d in row.get("daemons", [])] == [
            "online"
        ]

    wait_until(both_online, 30, "A's and B's statuses of their connections")
    (b_seen,) = listed_on(a)["daemons"]
    (a_seen,) = listed_on(b)["daemons"]
    assert b_seen["daemon"].endswith(str(b.home)) and a_seen["daemon"].endswith(str(a.home))


def _recalled(d: DaemonProcess, query: str) -> list[str]:
    done = chalie(d.home, "memory", "search", query, "--json")
    assert done.returncode == 0, done.stderr
    return [m["text"] for m in json.loads(done.stdout)]


def test_a_memory_stored_on_a_is_recalled_on_b_while_both_run(
    pair: tuple[DaemonProcess, DaemonProcess],
) -> None:
    """B's index is open before A stores (a search opened it): B recalls A's memory because
    its index follows the shared table (NOTIFY), not because it was rebuilt at a start."""
    a, b = pair
    assert _recalled(b, "bicycle lock code") == []
    stored = subprocess.run(
        [sys.executable, "-m", "chalie", "--home", str(a.home), "memory", "import", "-"],
        input='{"text": "the bicycle lock code is 4711"}\n',
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert stored.returncode == 0 and "stored 1" in stored.stdout, stored.stdout + stored.stderr
    wait_until(
        lambda: _recalled(b, "bicycle lock code") == ["the bicycle lock code is 4711"],
        10,
        "B recalls the memory A stored",
    )
    (memory_id,) = [m["id"] for m in json.loads(chalie(b.home, "memory", "list", "--json").stdout)]
    assert chalie(a.home, "memory", "forget", str(memory_id)).returncode == 0
    wait_until(lambda: _recalled(b, "bicycle lock code") == [], 10, "B forgets it too")

"""``chalie mcp ...`` without a daemon, the mcp_manager ability, and a real daemon end to end."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from abilities.mcp_manager import McpManager
from chalie.mcp.admin import McpAdmin
from chalie.mcp.spec import ServerSpec
from chalie.services import Services
from chalie_app.cli import cli
from tools.fixture_mcp.rig import FixtureServer, Rig
from tools.waiting import wait_until

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow


def run(home: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def test_add_list_show_enable_disable_remove(tmp_path: Path) -> None:
    r = run(
        tmp_path,
        "mcp",
        "add",
        "task-tracker",
        "--url",
        "https://mcp.example.com/mcp",
        "--header",
        "Authorization: Bearer tok-zzz-999",
    )
    assert r.exit_code == 0 and "added tasktracker (http)" in r.output
    r = run(
        tmp_path,
        "mcp",
        "add",
        "loc",
        "--command",
        sys.executable,
        "--arg",
        "-m",
        "--arg",
        "mcp_server_time",
        "--env",
        "API_TOKEN=abc123456",
        "--disabled",
    )
    assert r.exit_code == 0
    listing = json.loads(run(tmp_path, "mcp", "list", "--json").output)
    assert {s["name"]: s["status"] for s in listing} == {
        "loc": "disabled",
        "tasktracker": "offline",
    }
    shown = run(tmp_path, "mcp", "show", "tasktracker").output
    assert "tok-zzz" not in shown and "${secret:tasktracker.header.authorization}" in shown
    assert "abc123456" not in run(tmp_path, "mcp", "show", "loc").output
    assert run(tmp_path, "mcp", "enable", "loc").exit_code == 0
    assert run(tmp_path, "mcp", "disable", "tasktracker").exit_code == 0
    assert "removed tasktracker" in run(tmp_path, "mcp", "remove", "tasktracker").output
    bad = run(tmp_path, "mcp", "show", "tasktracker")
    assert bad.exit_code != 0 and "no MCP server" in bad.output + (bad.stderr or "")


@pytest.mark.parametrize(
    "args",
    [
        ("mcp", "add", "x"),
        ("mcp", "add", "x", "--url", "ftp://h/mcp"),
        ("mcp", "add", "x_y", "--url", "https://h/mcp", "--header", "nocolon"),
        ("mcp", "add", "x", "--command", "c", "--url", "https://h"),
        ("mcp", "approve", "nobody"),
        ("mcp", "test", "nobody"),
    ],
)
def test_bad_cli_input_is_one_line_and_a_nonzero_exit(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    r = run(tmp_path, *args)
    assert r.exit_code != 0
    assert r.exception is None or isinstance(r.exception, SystemExit)  # no traceback


def test_import_reports_added_skipped_and_refused(tmp_path: Path) -> None:
    f = tmp_path / "claude.json"
    f.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": sys.executable, "args": ["-m", "mcp_server_time"]},
                    "bad": {"type": "smoke-signal"},
                }
            }
        )
    )
    r = run(tmp_path, "mcp", "import", str(f))
    assert "added time" in r.output and "refused bad" in (r.stderr or r.output)
    r = run(tmp_path, "mcp", "import", str(f))
    assert "skipped time" in r.output
    (tmp_path / "junk.json").write_text("{nope")
    assert run(tmp_path, "mcp", "import", str(tmp_path / "junk.json")).exit_code != 0


def test_mcp_test_reports_protocol_latency_and_tools(tmp_path: Path) -> None:
    run(
        tmp_path,
        "mcp",
        "add",
        "time",
        "--command",
        sys.executable,
        "--arg",
        "-m",
        "--arg",
        "mcp_server_time",
    )
    r = run(tmp_path, "mcp", "test", "time")
    assert r.exit_code == 0, r.output
    assert "protocol 2026-07-28" in r.output and "2 tools" in r.output
    run(tmp_path, "mcp", "add", "gone", "--url", "http://127.0.0.1:9/mcp")
    r = run(tmp_path, "mcp", "test", "gone", "--timeout", "5")
    assert r.exit_code != 0


def test_manager_risky_actions_are_their_own_permissions() -> None:
    m = McpManager()
    assert m.classify({"action": "add"}) == "add"
    assert m.classify({"action": "remove"}) == "remove"
    assert m.classify({"action": "enable"}) == "enable"
    assert m.classify({"action": "list"}) is None and m.classify({"action": "disable"}) is None


def test_manager_adds_lists_tests_and_removes_by_asking(rig: Rig) -> None:
    srv = FixtureServer()
    try:
        rig.start()
        admin = McpAdmin(rig.db, rig.home, on_change=rig.reload)
        services = Services()
        services.mcp, services.loop = admin, rig.loop
        ability = McpManager(None, services)
        P = McpManager.Params
        added = ability.run(
            P(action="add", name="task-tracker", url=srv.url, headers={"X-Api-Key": "k-123-secret"})
        )
        assert added.ok, added.body
        rig.wait_tools("tasktracker", 8)
        listed = ability.run(P(action="list"))
        assert "tasktracker" in listed.body and "k-123-secret" not in listed.body
        tested = ability.run(P(action="test", name="tasktracker"))
        assert tested.ok and '"tools":9' in tested.body
        assert not ability.run(P(action="add", name="x")).ok  # needs a url or command
        assert ability.run(P(action="remove", name="nobody")).code == "invalid-param"
        assert ability.run(P(action="remove", name="tasktracker")).ok
        wait_until(lambda: "_mcp_tasktracker_echo" not in rig.registry, 10)
        admin.close()
    finally:
        srv.kill()


def test_daemon_is_ready_before_servers_connect_and_calls_a_remote_tool(tmp_path: Path) -> None:
    from tests.daemon_process import DaemonProcess, short_home

    home = short_home()
    srv = FixtureServer()
    d = DaemonProcess(home, tmp_path / "daemon.log")
    try:
        run(home, "mcp", "add", "fx", "--url", srv.url)
        run(
            home,
            "mcp",
            "add",
            "slowpoke",
            "--command",
            sys.executable,
            "--arg",
            "-c",
            "--arg",
            "import time; time.sleep(60)",
        )
        started = time.monotonic()
        d.start()
        assert time.monotonic() - started < 30
        assert json.loads(run(home, "mcp", "list", "--json").stdout)[1]["status"] != "online"

        def tools() -> int:
            r = run(home, "mcp", "list", "--json")
            return int(json.loads(r.stdout)[0]["tools"])

        wait_until(lambda: tools() == 9, 30, "9 tools listed")
        run(home, "policy", "set", "chat", "_mcp_fx_*", "allow")
        r = d.cli("tools", "call", "_mcp_fx_echo", "text=via daemon")
        assert "via daemon" in r.stdout, r.stdout + r.stderr
        # key=value is typed by the remote schema, which the CLI reads from the cache
        r = d.cli("tools", "call", "_mcp_fx_add", "a=2", "b=3")
        assert '{"result":5}' in r.stdout, r.stdout + r.stderr
        run(home, "mcp", "disable", "fx")  # the running daemon reconciles at once
        r = d.cli("tools", "call", "_mcp_fx_echo", "text=x")
        assert "mcp-unknown-tool" in r.stdout + r.stderr
    finally:
        d.kill()
        srv.kill()
        import shutil

        shutil.rmtree(home, ignore_errors=True)


def test_add_can_force_the_legacy_handshake(tmp_path: Path) -> None:
    r = run(tmp_path, "mcp", "add", "old", "--url", "https://h/mcp", "--protocol", "legacy")
    assert r.exit_code == 0
    shown = run(tmp_path, "mcp", "show", "old", "--json").stdout
    assert json.loads(shown)["spec"]["protocol"] == "legacy"
    assert run(tmp_path, "mcp", "add", "x", "--url", "https://h/mcp", "--protocol", "v9").exit_code


def test_the_cli_sees_the_cached_remote_tools_the_daemon_serves(tmp_path: Path) -> None:
    """tools list / find and an offline index rebuild use the daemon's catalogue: built-in
    abilities and the proxies cached in chalie.db, while no daemon and no server runs."""
    srv = FixtureServer()
    rig = Rig(tmp_path)
    try:
        rig.add(ServerSpec(name="fx", transport="http", url=srv.url))
        rig.start()
        rig.wait_tools("fx", 8)
    finally:
        rig.close()
        srv.kill()
    listed = run(tmp_path, "tools", "list")
    assert listed.exit_code == 0 and "_mcp_fx_add" in listed.stdout
    schema = json.loads(run(tmp_path, "tools", "list", "--json").stdout)
    add = next(d for d in schema if d["name"] == "_mcp_fx_add")
    assert add["input_schema"]["properties"]["a"]["type"] == "integer"
    rebuilt = run(tmp_path, "index", "rebuild")
    assert rebuilt.exit_code == 0, rebuilt.output
    found = run(tmp_path, "tools", "find", "--json", "add two integers")
    assert found.exit_code == 0, found.output
    assert "the catalogue changed" not in found.output  # the rebuilt index matches
    names = [t["name"] for t in json.loads(found.stdout)["injected"]]
    assert names[0] == "_mcp_fx_add"


def test_the_cli_reads_no_catalogue_where_nothing_was_configured(tmp_path: Path) -> None:
    assert run(tmp_path, "tools", "list").exit_code == 0
    assert not (tmp_path / "chalie.db").exists()  # a read creates no database


def test_secrets_can_be_given_on_stdin_never_on_the_command_line(tmp_path: Path) -> None:
    """Issue 30: --header, --env and --oauth-client-secret put secrets in argv (every local
    user reads /proc/*/cmdline) and shell history. --secrets-stdin reads them from stdin."""
    given = "header Authorization: Bearer tok-stdin-777\n# a comment\nheader X-Key: k-55\n"
    r = CliRunner().invoke(
        cli,
        [
            *("--home", str(tmp_path), "mcp", "add", "viastdin"),
            *("--url", "https://mcp.example.com/mcp", "--secrets-stdin"),
        ],
        input=given,
    )
    assert r.exit_code == 0, r.output
    shown = run(tmp_path, "mcp", "show", "viastdin").output
    assert "tok-stdin" not in shown and "${secret:viastdin.header.authorization}" in shown
    held = json.loads((tmp_path / "mcp-secrets.json").read_text())
    assert "Bearer tok-stdin-777" in held.values()
    bad = CliRunner().invoke(
        cli,
        [
            *("--home", str(tmp_path), "mcp", "add", "oops"),
            *("--url", "https://h.example/mcp", "--secrets-stdin"),
        ],
        input="password hunter2\n",
    )
    assert bad.exit_code != 0 and "stdin line 1" in bad.output

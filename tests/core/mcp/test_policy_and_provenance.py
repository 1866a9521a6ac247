"""The server wildcard in the gate's rule, and where a proxy comes from."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from chalie.gate.policy import PolicyError, check_permission, resolve
from chalie.mcp.provenance import provenance
from chalie.mcp.spec import ServerSpec
from chalie.mcp.store import McpStore, ServerExists
from chalie.mcp.tools import plan
from chalie.store.store_place import Place


def test_a_server_wildcard_covers_its_tools_and_an_explicit_entry_wins() -> None:
    table = {("chat", "_mcp_gh_*"): "allow", ("chat", "_mcp_gh_delete_repo"): "deny"}
    assert resolve(table, "chat", "_mcp_gh_search") == "allow"
    assert resolve(table, "chat", "_mcp_gh_delete_repo") == "deny"
    assert resolve(table, "chat", "_mcp_gl_search") is None
    assert resolve(table, "subconscious", "_mcp_gh_search") is None
    assert resolve(table, "chat", "gh_search") is None


@pytest.mark.parametrize("bad", ["*", "_mcp_*", "_mcp_a_b_*", "_mcp_A_*", "calc*", "_mcp_x_*y"])
def test_only_whole_server_wildcards_are_permissions(bad: str) -> None:
    with pytest.raises(PolicyError):
        check_permission(bad)
    assert check_permission("_mcp_github_*") == "_mcp_github_*"


def test_provenance_names_the_remote_tool_and_server(store_place: Place) -> None:
    db = store_place
    store = McpStore(db)
    store.add_server(ServerSpec(name="gh", transport="http", url="https://h/mcp"))
    with pytest.raises(ServerExists):
        store.add_server(ServerSpec(name="gh", transport="http", url="https://h/mcp"))
    rows = plan("gh", [], [{"name": "Search.Issues", "inputSchema": {}}], {}).rows
    store.write_tools(rows)
    store.write_tools([msgspec.structs.replace(r, description="again") for r in rows])  # upsert
    assert [(t.proxy, t.description) for t in store.tools("gh")] == [
        ("_mcp_gh_search_issues", "again")
    ]
    store.set_status("gh", "online", reason="up", latency_ms=1.5)
    assert store.server("gh").status == "online"  # type: ignore[union-attr]
    store.close()
    assert provenance(db, "_mcp_gh_search_issues") == (
        "remote tool 'Search.Issues' on MCP server gh"
    )
    assert provenance(db, "_mcp_gh_*") == "every tool of MCP server gh"
    assert provenance(db, "calculator") is None


def test_policy_list_shows_provenance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chalie_app.cli import policy as policy_cli

    store = McpStore(tmp_path / "chalie.db")
    store.add_server(ServerSpec(name="gh", transport="http", url="https://h/mcp"))
    store.write_tools(plan("gh", [], [{"name": "Search.Issues", "inputSchema": {}}], {}).rows)
    store.close()
    rules = [
        {
            "channel": "chat",
            "permission": "_mcp_gh_search_issues",
            "decision": "allow",
            "updated_at": 0.0,
            "origin": "set",
        }
    ]
    monkeypatch.setattr(policy_cli, "ask_daemon", lambda *a, **k: {"rules": rules, "pending": []})
    from chalie_app.cli import cli

    out = CliRunner().invoke(cli, ["--home", str(tmp_path), "policy", "list"]).output
    assert "[remote tool 'Search.Issues' on MCP server gh]" in out


def seeded(home: Path) -> None:
    store = McpStore(home / "chalie.db")
    store.add_server(ServerSpec(name="gh", transport="http", url="https://h/mcp"))
    store.write_tools(plan("gh", [], [{"name": "Search.Issues", "inputSchema": {}}], {}).rows)
    store.close()


def test_the_trail_shows_provenance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chalie_app.cli import cli
    from chalie_app.cli import trail as trail_cli

    seeded(tmp_path)
    row = {
        "started_at": 0.0,
        "ended_at": 1.0,
        "tool": "_mcp_gh_search_issues",
        "status": "success",
        "code": None,
        "decision": "allow",
        "decided_by": "policy",
        "channel": "chat",
        "conversation_id": "c",
        "call_id": "k",
        "params": "{}",
        "act_summary": "look",
    }
    monkeypatch.setattr(trail_cli, "ask_daemon", lambda *a, **k: [row])
    out = CliRunner().invoke(cli, ["--home", str(tmp_path), "trail"]).output
    assert "[remote tool 'Search.Issues' on MCP server gh]" in out


def test_the_approval_prompt_shows_provenance(tmp_path: Path) -> None:
    from chalie.mcp.provenance import suffix
    from chalie_app.cli.prompt import render

    seeded(tmp_path)
    where = suffix(tmp_path, "_mcp_gh_search_issues")
    request = {
        "permission": "_mcp_gh_search_issues",
        "channel": "chat",
        "params": {},
        "provenance": where.strip(" []"),
    }
    shown = "\n".join(render(request))
    assert "remote tool 'Search.Issues' on MCP server gh" in shown


def test_each_daemon_keeps_its_own_status_of_a_server_on_one_store(store_place: Place) -> None:
    """Two daemons' stores (each its own connection to the server): each reads its own
    status, and lists the other's beside it; a store naming no daemon reads the last one."""
    a, b = McpStore(store_place, daemon="host:/a"), McpStore(store_place, daemon="host:/b")
    plain = McpStore(store_place)
    try:
        a.add_server(ServerSpec(name="gh", transport="http", url="https://example.com/mcp"))
        a.set_status("gh", "online", reason="", since=10.0, protocol="2025-06-18")
        b.set_status("gh", "offline", reason="connection refused", since=20.0)
        seen_a, seen_b = a.server("gh"), b.server("gh")
        assert seen_a is not None and seen_b is not None
        assert (seen_a.status, seen_a.status_since, seen_a.protocol) == (
            "online",
            10.0,
            "2025-06-18",
        )
        assert (seen_b.status, seen_b.status_reason) == ("offline", "connection refused")
        assert [(d.daemon, d.status) for d in seen_a.daemons] == [("host:/b", "offline")]
        assert [(d.daemon, d.status) for d in b.servers()[0].daemons] == [("host:/a", "online")]
        assert plain.server("gh").status == "offline"  # type: ignore[union-attr]  # B's, last
        a.set_status("gh", "offline", reason="heartbeat missed")  # since kept when not given
        assert a.server("gh").status_since == 10.0  # type: ignore[union-attr]
        assert a.remove_server("gh") and b.server("gh") is None
        b.set_status("gh", "online")  # a connection's last word on a removed server: no row
        assert b.server("gh") is None
    finally:
        for s in (a, b, plain):
            s.close()

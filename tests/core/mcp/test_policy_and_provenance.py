"""The server wildcard in the gate's rule, and where a proxy comes from."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from chalie.mcp.provenance import provenance
from chalie.mcp.spec import ServerSpec
from chalie.mcp.store import McpStore, ServerExists
from chalie.mcp.tools import plan
from chalie.policy import PolicyError, check_permission, resolve
from chalie.store_place import Place


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

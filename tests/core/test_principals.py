"""The principal rules (chalie.wire.principals) and the tokens that carry them: ids, scopes."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from chalie.gate.policy import prompt, resolve
from chalie.gate.tokens import TokenStore, ensure_first_token
from chalie.mcp.spec import ServerSpec
from chalie.mcp_server.owners import ConversationOwners
from chalie.wire.principals import LOCAL_OWNER, Principal, may_answer, may_chat, may_see
from chalie_app.cli import cli

AGENT = Principal(scope="agent", id="tok_a", name="a")
OTHER = Principal(scope="agent", id="tok_b", name="b")
OWNER = Principal(scope="owner", id="tok_o", name="me")


def test_only_an_owner_chats_and_answers_and_never_an_agent_its_own_request() -> None:
    assert may_chat(OWNER) and may_chat(LOCAL_OWNER)
    assert not may_chat(AGENT) and not may_chat(None)
    assert may_answer(OWNER, AGENT) and may_answer(LOCAL_OWNER, AGENT)
    assert may_answer(OWNER, OWNER)  # the person answering their own chat turn
    assert not may_answer(AGENT, AGENT) and not may_answer(AGENT, OTHER)
    assert not may_answer(AGENT, None) and not may_answer(None, AGENT)
    gateway = Principal(scope="gateway", id="tok_g", name="g")
    assert not may_answer(gateway, gateway) and not may_chat(gateway)


def test_the_owner_sees_every_conversation_an_agent_only_its_own() -> None:
    assert may_see(OWNER, "") and may_see(OWNER, "tok_a")
    assert may_see(AGENT, "tok_a") and not may_see(AGENT, "tok_b") and not may_see(AGENT, "")


def test_a_token_is_an_agent_unless_asked_and_the_first_boot_token_an_owner(
    tmp_path: Path,
) -> None:
    with TokenStore(tmp_path / "chalie.db") as store:
        assert ensure_first_token(store, tmp_path) is not None
        store.create("bot")
        store.create("me", scope="owner")
        store.create("gw", scope="gateway")
        scopes = {t.name: t.scope for t in store.list()}
        assert scopes == {"first": "owner", "bot": "agent", "me": "owner", "gw": "gateway"}
        secret = (tmp_path / "first-token").read_text().strip()
        found = store.verify(secret)
        assert found is not None and found.principal().is_owner
        with pytest.raises(ValueError):
            store.create("x", scope="root")  # type: ignore[arg-type]


def test_a_name_reused_after_revocation_is_a_new_principal_that_inherits_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "chalie.db"
    with TokenStore(db) as store:
        old = store.create("agent1")
        old_info = store.verify(old)
        assert old_info is not None
        owners = ConversationOwners(db)
        owners.record("c1", old_info.id, "bot", "p", "agent1")
        store.revoke("agent1")
        new = store.create("agent1")
        new_info = store.verify(new)
        assert new_info is not None and new_info.id != old_info.id
        # Keyed by id: the new token does not own the old token's conversation.
        assert owners.owner("c1") == old_info.id != new_info.id
        owners.close()


def test_cli_token_create_makes_an_agent_and_flags_ask_for_more(tmp_path: Path) -> None:
    runner = CliRunner()
    home = ["--home", str(tmp_path)]
    assert runner.invoke(cli, [*home, "token", "create", "a"]).exit_code == 0
    assert runner.invoke(cli, [*home, "token", "create", "b", "--owner"]).exit_code == 0
    both = runner.invoke(cli, [*home, "token", "create", "c", "--owner", "--gateway"])
    assert both.exit_code != 0 and "choose one" in both.output
    import json

    listed = json.loads(runner.invoke(cli, [*home, "token", "list", "--json"]).stdout)
    assert {t["name"]: t["scope"] for t in listed} == {"a": "agent", "b": "owner"}
    assert all(t["id"].startswith("tok_") for t in listed)


def _old_home(db: Path) -> None:
    """chalie.db as the version before principals wrote it."""
    conn = sqlite3.connect(db)
    conn.executescript(
        """
        CREATE TABLE tokens (name TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE,
            created REAL NOT NULL, revoked REAL, last_used REAL,
            gateway INTEGER NOT NULL DEFAULT 0);
        CREATE TABLE mcp_conversations (conversation_id TEXT PRIMARY KEY,
            token_name TEXT NOT NULL, agent_name TEXT NOT NULL, project TEXT NOT NULL,
            created REAL NOT NULL);
        """
    )
    now = time.time()
    conn.execute("INSERT INTO tokens VALUES ('first', 'h1', ?, NULL, NULL, 0)", (now - 100,))
    conn.execute("INSERT INTO tokens VALUES ('gw', 'h2', ?, NULL, NULL, 1)", (now - 100,))
    # 'bot' was reused: the token now named so was created after its conversation.
    conn.execute("INSERT INTO tokens VALUES ('bot', 'h3', ?, NULL, NULL, 0)", (now - 10,))
    conn.execute("INSERT INTO mcp_conversations VALUES ('c-gw', 'gw', 'x', 'p', ?)", (now - 50,))
    conn.execute("INSERT INTO mcp_conversations VALUES ('c-bot', 'bot', 'x', 'p', ?)", (now - 50,))
    conn.commit()
    conn.close()


def test_an_old_store_migrates_to_least_privilege_and_stable_ids(tmp_path: Path) -> None:
    db = tmp_path / "chalie.db"
    _old_home(db)
    with TokenStore(db) as store:
        infos = {t.name: t for t in store.list()}
        assert {n: t.scope for n, t in infos.items()} == {
            "first": "agent",  # no token becomes a person by an upgrade
            "gw": "gateway",
            "bot": "agent",
        }
        assert len({t.id for t in infos.values()}) == 3
        assert store.owners() == 0
    with TokenStore(db) as again:  # idempotent: the ids stay
        assert {t.name: t.id for t in again.list()} == {n: t.id for n, t in infos.items()}
    owners = ConversationOwners(db)
    assert owners.owner("c-gw") == infos["gw"].id
    assert owners.owner("c-bot") is None  # the name was reused since: nobody inherits it
    owners.close()


def test_a_tool_level_allow_never_covers_a_sensitive_action() -> None:
    table = {("chat", "mcp_manager"): "allow", ("chat", "_mcp_srv_*"): "allow"}
    assert resolve(table, "chat", "mcp_manager.add") == "allow"  # the old, broad rule
    assert resolve(table, "chat", "mcp_manager.add", sensitive=True) is None  # ask
    assert resolve(table, "chat", "_mcp_srv_run", sensitive=True) is None
    exact = {**table, ("chat", "mcp_manager.add"): "allow"}
    assert resolve(exact, "chat", "mcp_manager.add", sensitive=True) == "allow"
    denied = {("chat", "mcp_manager"): "deny"}
    assert resolve(denied, "chat", "mcp_manager.add", sensitive=True) == "deny"


def test_mcp_manager_declares_a_command_and_an_enable_sensitive_with_the_command_line() -> None:
    from abilities.mcp_manager import McpManager

    ability = McpManager()
    reach = ability.reach({"action": "add", "command": "sh", "args": ["-c", "id > /tmp/x"]})
    assert reach == "runs the command: sh -c 'id > /tmp/x'"
    assert ability.reach({"action": "list"}) is None
    assert ability.reach({"action": "disable", "name": "x"}) is None

    class Admin:
        def spec(self, name: str) -> ServerSpec:
            return ServerSpec(
                name=name, transport="stdio", command="node", args=["srv.js"], env={"API_KEY": "x"}
            )

    from chalie.services import Services

    with_admin = McpManager(None, Services(mcp=Admin()))  # type: ignore[arg-type]
    enabled = with_admin.reach({"action": "enable", "name": "notes"})
    assert enabled is not None
    assert "node srv.js" in enabled and "API_KEY" in enabled and "x" not in enabled.split()
    # Issue 30: a delete is sensitive too (a tool-level allow does not cover it).
    removed = with_admin.reach({"action": "remove", "name": "notes"})
    assert removed is not None and removed.startswith("removes the MCP server 'notes'")
    assert "node srv.js" in removed


def test_a_calendar_delete_is_sensitive_and_says_which_event() -> None:
    from abilities.calendar import Calendar

    ability = Calendar()
    assert ability.reach({"action": "list"}) is None
    assert ability.reach({"action": "update_event", "id": "e1"}) is None
    gone = ability.reach({"action": "delete_event", "id": "e1", "account": "work"})
    assert gone == "deletes every occurrence of calendar event e1 in work"


def test_a_move_to_a_trash_or_junk_folder_is_a_sensitive_delete() -> None:
    """Issue 30 (first session's note): email ``move`` to the trash, a delete, was covered by
    a tool-level allow of email. A move there is sensitive and says so; other moves are not."""
    from abilities.email import Email

    ability = Email()
    for folder in ("Trash", "[Gmail]/Trash", "INBOX.Deleted Items", "Junk E-mail", "Spam"):
        said = ability.reach({"action": "move", "id": 7, "to_folder": folder})
        assert (
            said == f"moves message 7 to {folder!r}: deletes it (the server may empty that folder)"
        )
    for folder in ("Archive", "Receipts", "Trash Talk", "Bins"):
        assert ability.reach({"action": "move", "id": 7, "to_folder": folder}) is None
    assert ability.reach({"action": "flag", "id": 7, "mark": "seen"}) is None


def test_the_prompt_shows_each_parameter_escaped_on_one_line_and_capped() -> None:
    params = {"command": "sh", "args": ["-c", "id\nAllow? yes"], **{f"p{i}": i for i in range(20)}}
    text = prompt("mcp_manager", "mcp_manager.add", "add", params, "agent token a", "runs: sh")
    lines = text.split("\n")
    assert lines[0] == "Allow mcp_manager.add?" and "Asked by: agent token a" in lines
    assert not any(line.startswith("Allow? yes") for line in lines)
    assert '  args = ["-c", "id\\nAllow? yes"]' in lines
    assert any(line.startswith("  (and ") for line in lines)
    assert all(len(line) <= 210 for line in lines)


def test_sending_mail_is_sensitive_so_an_allow_on_the_email_tool_never_covers_it() -> None:
    from abilities.email import Email

    ability = Email()
    send = {"action": "send", "to": ["sam@example.com"], "subject": "Agenda", "body": "Hi\nSam"}
    reach = ability.reach(send)
    assert reach is not None
    assert "sam@example.com" in reach and "'Agenda'" in reach and "\n" not in reach
    assert ability.reach({"action": "search", "query": "invoice"}) is None
    assert ability.reach({"action": "reply", "id": "1", "body": "ok"}) is None  # a draft
    table = {("chat", "email"): "allow"}
    assert resolve(table, "chat", "email.send", sensitive=True) is None  # asks
    assert resolve(table, "chat", "email.search", sensitive=False) == "allow"
    assert resolve({("chat", "email.send"): "allow"}, "chat", "email.send", sensitive=True) == (
        "allow"
    )


def test_the_reach_comes_first_in_the_gates_prompt() -> None:
    text = prompt(
        "email", "email.send", "mailing Ann", {"to": ["a@b.c"]}, "the owner", "sends mail to a@b.c"
    )
    assert text.split("\n")[:3] == [
        "Allow email.send?",
        "This reaches beyond Chalie: sends mail to a@b.c",
        "Asked by: the owner",
    ]

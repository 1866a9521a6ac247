"""What one agent token can store (issue 30, medium): an agent's flood of long messages is
refused with a clear code once its quota is reached, and nothing past it is stored; below the
free space the data directory must keep, no new work is taken at all. Through the real daemon
and its inbound MCP server."""

from __future__ import annotations

import pytest

from chalie.conversation.store import ConversationStore
from chalie.gate.tokens import TokenStore
from tests.core.mcp_server.daemon_harness import live_daemon
from tools.agent_flood import code_of, flood
from tools.fake_llm.script import Script, Step

pytestmark = pytest.mark.slow

LONG = "flood " * 5_333  # 32,000 characters, the probe's


def test_an_agents_flood_stops_at_its_quota_with_a_clear_code() -> None:
    bound = 600_000
    extra = f"[conversations]\nagent_max_bytes = {bound}\n"
    with live_daemon(Script(steps=[], on_user=Step(text="ok")), extra) as (rt, url):
        with TokenStore(rt.db_path) as tokens:
            secret = tokens.create("flooder")
            (token,) = [t for t in tokens.list() if t.name == "flooder"]
        owners = ConversationStore(rt.db_path)
        owners.create("c-owner", "chat")  # the owner's, kept with no principal: not counted
        owners.close()
        results = flood(url, secret, LONG, 20)
        *accepted, refused = results
        # Each call keeps its message, its turn and its events (~100 KB), as the probe saw.
        assert 3 <= len(accepted) < 19 and not any(r.is_error for r in accepted)
        assert refused.is_error and code_of(refused) == "quota-exceeded", refused.content
        assert "may keep" in refused.content[0].text
        store = ConversationStore(rt.db_path)
        try:
            conversations, stored = store.usage(token.id)
        finally:
            store.close()
        assert conversations == len(accepted) and stored <= bound, (conversations, stored)


def test_below_the_free_space_to_keep_no_new_work_is_taken() -> None:
    extra = f"[conversations]\nmin_free_bytes = {1 << 59}\n"
    with live_daemon(Script(steps=[], on_user=Step(text="ok")), extra) as (rt, url):
        with TokenStore(rt.db_path) as tokens:
            secret = tokens.create("anyone")
        (refused,) = flood(url, secret, LONG, 1)
        assert refused.is_error and code_of(refused) == "disk-full", refused.content
        store = ConversationStore(rt.db_path)
        try:
            assert store.list() == []
        finally:
            store.close()


def test_agent_conversations_past_their_retention_are_deleted_at_start() -> None:
    """Issue 30: a retention setting. An agent token's conversation idle past
    [conversations] agent_retention_days is deleted (at start, then hourly); the owner's,
    however old, and a recent agent's stay. A real daemon process."""
    import sqlite3
    import time

    from chalie.wire.principals import Principal
    from tests.daemon_process import DaemonProcess, short_home
    from tools.waiting import wait_until

    home = short_home()
    (home / "config.toml").write_text(
        "[mcp_server]\nport = 0\n[conversations]\nagent_retention_days = 30\n"
    )
    agent = Principal(scope="agent", id="tok_old", name="old")
    store = ConversationStore(home / "chalie.db")
    store.create("c-agent-old", "external_agent", "mcp:old", principal=agent)
    store.create("c-agent-new", "external_agent", "mcp:old", principal=agent)
    store.create("c-owner-old", "chat")
    store.close()
    with sqlite3.connect(home / "chalie.db") as db:
        old = time.time() - 31 * 86400
        db.execute(
            "UPDATE conversations SET updated = ? WHERE id IN ('c-agent-old', 'c-owner-old')",
            (old,),
        )
    d = DaemonProcess(home, home / "daemon.log").start()
    try:
        store = ConversationStore(home / "chalie.db")
        try:
            wait_until(lambda: store.info("c-agent-old") is None, 30, "the old agent conversation")
            assert store.info("c-agent-new") is not None
            assert store.info("c-owner-old") is not None
        finally:
            store.close()
        assert "past their retention were deleted" in d.log()
    finally:
        d.kill()

"""The real daemon end to end: SDK client → McpServerActor → Conversations → TurnActor →
scripted model over HTTP → find_tools → dispatcher and policy gate → trail → the answer."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import httpx2
import pytest

from actors.conversation.conversations import Conversations
from actors.gate.policy import PolicyActor
from tests.core.mcp_server.daemon_harness import live_daemon
from tests.core.mcp_server.harness import MODES, connect
from tools.fake_llm.script import Script, Step, ToolCallStep
from tools.waiting import wait_until

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow

ARGS: dict[str, Any] = {
    "message": "what is 2+2, and what time is it?",
    "agent_name": "claude-code",
    "project_or_task_name": "chalie",
}


def exchange_script() -> Script:
    def call(name: str, **arguments: Any) -> Step:
        return Step(tool_calls=[ToolCallStep(name=name, arguments=arguments)])

    return Script(
        steps=[
            call("find_tools", query=["calculator", "clock"], act_summary="looking for tools"),
            call("calculator", expression="2+2", act_summary="adding 2 and 2"),
            call("clock", action="now", zone="UTC", act_summary="reading the clock"),
            Step(text="2+2 is 4. I could not read the clock: that needs approval."),
        ]
    )


def rows(db: Any, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(str(db))
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_full_exchange_through_the_real_daemon(mode: str) -> None:
    with live_daemon(exchange_script()) as (rt, url):
        rt.child("policy", PolicyActor).call(
            PolicyActor.set, "external_agent", "calculator", "allow"
        )
        from chalie.gate.tokens import TokenStore

        with TokenStore(rt.db_path) as store:
            secret = store.create("coder")
        progress: list[str] = []

        async def on_progress(_p: float, _t: float | None, message: str | None) -> None:
            progress.append(message or "")

        async def go() -> Any:
            async with connect(url, secret, mode) as client:
                return await client.call_tool("talk_to_chalie", ARGS, progress_callback=on_progress)

        result = asyncio.run(go())
        data = result.structured_content
        assert not result.is_error, result.content
        assert data["finish_reason"] == "final"
        assert data["answer"].startswith("2+2 is 4.")
        assert [(t["tool"], t["status"], t["code"]) for t in data["tools"]] == [
            ("find_tools", "success", None),
            ("calculator", "success", None),
            ("clock", "error", "permission-denied"),
        ]
        assert [c["tool"] for c in data["could_not"]] == ["clock"]
        assert progress == [
            "find_tools: looking for tools",
            "calculator: adding 2 and 2",
            "clock: reading the clock",
        ]
        cid = data["conversation_id"]
        # The conversation is stored like any other, with the token as its origin.
        stored = rows(rt.db_path, f"SELECT channel, origin FROM conversations WHERE id = '{cid}'")
        assert stored == [("external_agent", "mcp:coder")]
        trail = rows(
            rt.db_path,
            f"SELECT tool, channel, status FROM trail WHERE conversation_id = '{cid}' ORDER BY id",
        )
        # the framework seed's find_tools on the message comes first: on the trail like any call
        assert [t[0] for t in trail] == ["find_tools", "find_tools", "calculator", "clock"]
        assert {t[1] for t in trail} == {"external_agent"}


def test_an_auth_failure_starts_no_turn_and_writes_no_trail_row() -> None:
    with live_daemon(exchange_script()) as (rt, url):
        from chalie.gate.tokens import TokenStore

        with TokenStore(rt.db_path) as store:
            revoked = store.create("old")
            store.revoke("old")
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "talk_to_chalie", "arguments": ARGS},
        }
        headers = {"accept": "application/json, text/event-stream"}
        for auth in (None, "Bearer nope-nope-nope", f"Bearer {revoked}", "Token x"):
            sent = {**headers, **({"authorization": auth} if auth else {})}
            resp = httpx2.post(url, json=call, headers=sent, timeout=10)
            assert resp.status_code == 401 and "www-authenticate" in resp.headers
        assert rows(rt.db_path, "SELECT count(*) FROM trail") == [(0,)]
        assert rows(rt.db_path, "SELECT count(*) FROM conversations") == [(0,)]
        assert not rt.child("conversations", Conversations).call(Conversations.live)


@pytest.mark.parametrize("mode", MODES)
def test_cancelling_the_request_cancels_the_real_turn(mode: str) -> None:
    script = Script(steps=[Step(hang=True)], on_user=Step(text="later"))
    with live_daemon(script) as (rt, url):
        from chalie.gate.tokens import TokenStore

        with TokenStore(rt.db_path) as store:
            secret = store.create("impatient")

        async def go() -> None:
            async with connect(url, secret, mode) as client:
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(2.0):
                        await client.call_tool("talk_to_chalie", ARGS)

        asyncio.run(go())

        def ended() -> list[tuple[Any, ...]]:
            return rows(rt.db_path, "SELECT reason FROM conversation_turns")

        wait_until(lambda: ended() == [("cancelled",)], timeout=20)


def test_a_model_failure_comes_back_as_an_error_result_with_its_code() -> None:
    with live_daemon(Script(steps=[Step(status=500, body="boom")])) as (rt, url):
        from chalie.gate.tokens import TokenStore

        with TokenStore(rt.db_path) as store:
            secret = store.create("unlucky")

        async def go() -> Any:
            async with connect(url, secret, "auto") as client:
                return await client.call_tool("talk_to_chalie", ARGS)

        result = asyncio.run(go())
        data = result.structured_content
        assert result.is_error and data["finish_reason"] == "model-error"
        assert "The turn ended early: model-error" in result.content[0].text
        assert data["errors"] and all(e["code"] for e in data["errors"])

"""Gateway mode through the real daemon: tools/list follows the token, find_tools injects,
list_changed is announced, and every direct call runs through the dispatcher's gate."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from actors.gate.policy import PolicyActor
from chalie.gate.tokens import TokenStore
from tests.core.mcp_server.daemon_harness import live_daemon
from tests.core.mcp_server.harness import MODES, connect
from tools.fake_llm.script import Script, Step

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow

FIND = {"query": ["calculator", "clock"], "act_summary": "looking for arithmetic and time"}
ADD = {"expression": "2+3", "act_summary": "adding 2 and 3"}
NOW = {"action": "now", "zone": "UTC", "act_summary": "reading the clock"}


def idle_script() -> Script:
    return Script(steps=[Step(text="unused")], on_user=Step(text="unused"))


def rows(db: Any, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(str(db))
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def code_of(result: Any) -> Any:
    data = result.structured_content or {}
    return data.get("code") or data.get("error", {}).get("code")


async def listed(client: Any) -> set[str]:
    return {t.name for t in (await client.list_tools()).tools}


async def shut_out(url: str, secret: str, mode: str) -> None:
    """Only talk_to_chalie is visible, and a direct call is refused without dispatching."""
    async with connect(url, secret, mode) as client:
        assert await listed(client) == {"talk_to_chalie"}
        for name, args in (("find_tools", FIND), ("calculator", ADD)):
            result = await client.call_tool(name, args)
            assert result.is_error and code_of(result) == "unknown-tool"
        assert await listed(client) == {"talk_to_chalie"}


def test_with_the_gateway_off_a_token_sees_and_calls_only_talk_to_chalie() -> None:
    with live_daemon(idle_script()) as (rt, url):
        with TokenStore(rt.db_path) as store:
            secret = store.create("keen", scope="gateway")
        for mode in MODES:
            asyncio.run(shut_out(url, secret, mode))
        assert rows(rt.db_path, "SELECT count(*) FROM trail") == [(0,)]


@pytest.mark.parametrize("mode", MODES)
def test_the_gateway_finds_injects_announces_and_gates_direct_calls(mode: str) -> None:
    with live_daemon(idle_script(), "gateway = true") as (rt, url):
        policy = rt.child("policy", PolicyActor)
        policy.call(PolicyActor.set, "external_agent", "calculator", "allow")
        with TokenStore(rt.db_path) as store:
            plain = store.create("plain")
            secret = store.create("coder", scope="gateway")
            coder_id = next(t.id for t in store.list() if t.name == "coder")

        # On, but this token lacks the permission: the same as off.
        asyncio.run(shut_out(url, plain, mode))
        assert rows(rt.db_path, "SELECT count(*) FROM trail") == [(0,)]

        changes: list[Any] = []

        async def on_message(message: Any) -> None:
            if "ToolListChanged" in type(message).__name__:
                changes.append(message)

        async def find(client: Any) -> Any:
            if mode == "legacy":
                result = await client.call_tool("find_tools", FIND)
                async with asyncio.timeout(10):
                    while not changes:
                        await asyncio.sleep(0.01)
                return result
            async with client.listen(tools_list_changed=True) as sub:
                result = await client.call_tool("find_tools", FIND)
                async with asyncio.timeout(10):
                    changes.append(await anext(aiter(sub)))
                return result

        async def go() -> dict[str, Any]:
            out: dict[str, Any] = {}
            async with connect(url, secret, mode, message_handler=on_message) as client:
                out["before"] = await listed(client)
                out["uninjected"] = await client.call_tool("calculator", ADD)
                out["find"] = await find(client)
                out["after"] = await listed(client)
                out["allowed"] = await client.call_tool("calculator", ADD)
                out["asked"] = await client.call_tool("clock", NOW)
                policy.call(PolicyActor.set, "external_agent", "calculator", "deny")
                out["denied"] = await client.call_tool("calculator", ADD)
                out["unknown"] = await client.call_tool("no_such_tool", {"act_summary": "x"})
                out["other"] = await client.call_tool("mcp_manager", {"act_summary": "x"})
            return out

        out = asyncio.run(go())
        assert out["before"] == {"talk_to_chalie", "find_tools"}
        assert code_of(out["uninjected"]) == "unknown-tool"
        assert not out["find"].is_error, out["find"].content
        assert changes, "no tools/list_changed arrived"
        assert {"talk_to_chalie", "find_tools", "calculator", "clock"} <= out["after"]
        allowed = out["allowed"]
        assert not allowed.is_error and allowed.structured_content["status"] == "success"
        assert "5" in allowed.content[0].text
        asked = out["asked"]
        assert asked.is_error and code_of(asked) == "permission-denied"
        assert "do not retry" in asked.content[0].text
        denied = out["denied"]
        assert denied.is_error and code_of(denied) == "permission-denied"
        for name in ("unknown", "other"):
            assert out[name].is_error and code_of(out[name]) == "unknown-tool"
        # Every direct call went through the dispatcher, on external_agent, under the token.
        trail = rows(
            rt.db_path,
            "SELECT tool, channel, conversation_id, status, code FROM trail ORDER BY id",
        )
        assert [(t[0], t[3], t[4]) for t in trail] == [
            ("calculator", "error", "unknown-tool"),
            ("find_tools", "success", None),
            ("calculator", "success", None),
            ("clock", "error", "permission-denied"),
            ("calculator", "error", "permission-denied"),
            ("no_such_tool", "error", "unknown-tool"),
            ("mcp_manager", "error", "unknown-tool"),
        ]
        assert {(t[1], t[2]) for t in trail} == {("external_agent", f"mcp-gateway:{coder_id}")}


def test_hostile_direct_calls_are_refused_with_a_code_and_lose_nothing() -> None:
    with live_daemon(idle_script(), "gateway = true") as (rt, url):
        with TokenStore(rt.db_path) as store:
            secret = store.create("rough", scope="gateway")

        async def go() -> list[Any]:
            async with connect(url, secret, "auto") as client:
                found = [
                    await client.call_tool("x" * 10_000, {}),
                    await client.call_tool("find_tools", {"query": 7, "act_summary": "bad"}),
                    await client.call_tool("find_tools", {"query": ["clock"]}),
                    await client.call_tool(
                        "find_tools", {"query": ["c" * 100_000], "act_summary": "x"}
                    ),
                    await client.call_tool("find_tools", {"query": ["clock"], "act_summary": "ok"}),
                ]
                found.append(await listed(client))
            return found

        long_name, bad_type, no_summary, oversized, fine, names = asyncio.run(go())
        assert code_of(long_name) == "unknown-tool"
        for bad in (bad_type, oversized):
            assert bad.is_error and code_of(bad) in {"invalid-param", "missing-params"}, bad
        # A missing act_summary costs no call: the framework writes one (chalie.calls.healing).
        assert not no_summary.is_error
        assert not fine.is_error and "clock" in names
        # The over-long name never reached the trail; the rest did, as errors with codes.
        trail = rows(rt.db_path, "SELECT tool, code FROM trail ORDER BY id")
        assert [t[0] for t in trail] == ["find_tools"] * 4
        assert all(len(t[0]) <= 200 for t in trail)

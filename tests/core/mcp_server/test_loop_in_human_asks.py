"""loop_in_human asks through the real daemon and a real chat client on the bridge: an `ask`
on the agent's turn becomes a permission request to the connected person, who answers it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import msgspec
import pytest

from actors.conversation.chat_bridge import ChatBridge
from actors.conversation.conversations import Conversations
from actors.mcp.server import BusHumans
from chalie.chat import protocol as p
from chalie.gate.tokens import TokenStore
from chalie.process.config import ChatConfig
from tests.conversations_double import DoublePort
from tests.core.mcp_server.daemon_harness import live_daemon
from tests.core.mcp_server.doubles import FakeDesk
from tests.core.mcp_server.harness import connect, running
from tools.fake_llm.script import Script, Step, ToolCallStep
from tools.waiting import wait_until

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow

ARGS: dict[str, Any] = {
    "message": "what time is it in UTC?",
    "agent_name": "travel-bot",
    "project_or_task_name": "trip: Lisbon",
    "loop_in_human": True,
}


def clock_turns(n: int) -> Script:
    steps: list[Step] = []
    for _ in range(n):
        find = {"query": ["clock"], "act_summary": "looking for a clock"}
        steps.append(Step(tool_calls=[ToolCallStep(name="find_tools", arguments=find)]))
        steps.append(
            Step(
                tool_calls=[
                    ToolCallStep(
                        name="clock",
                        arguments={
                            "action": "now",
                            "zone": "UTC",
                            "act_summary": "reading the clock",
                        },
                    )
                ]
            )
        )
        steps.append(Step(text="done"))
    return Script(steps=steps, on_user=Step(text="done"))


def tools_of(result: Any) -> list[tuple[str, str, Any]]:
    found = [(t["tool"], t["status"], t["code"]) for t in result.structured_content["tools"]]
    assert found[0] == ("find_tools", "success", None)
    return found[1:]


def test_an_ask_on_a_loop_in_human_turn_is_put_to_the_connected_person() -> None:
    with live_daemon(clock_turns(3), "loop_in_human_asks = true") as (rt, url):
        cfg = msgspec.convert({"port": 0}, ChatConfig)
        bridge = ChatBridge.start(
            cfg,
            rt.config.home,
            rt.db_path,
            rt.loop,
            rt.events,
            rt.child("conversations", Conversations),
        )
        try:
            bridge.proxy().addresses().get(timeout=15)
            with TokenStore(rt.db_path) as store:
                secret = store.create("travel")
            from chalie.chat.client import ChatClient

            with ChatClient.local(rt.config.home) as chat:
                chat.send(p.Ping(id="hi"))  # the first frame opens the session
                desk = BusHumans(rt.events)
                wait_until(lambda: desk.humans_connected() == 1, timeout=15)
                progress: list[str] = []

                async def on_progress(_p: float, _t: float | None, message: str | None) -> None:
                    progress.append(message or "")

                async def talk(args: dict[str, Any]) -> Any:
                    async with connect(url, secret, "auto") as client:
                        return await client.call_tool(
                            "talk_to_chalie", args, progress_callback=on_progress
                        )

                results: list[Any] = []
                caller = threading.Thread(
                    target=lambda: results.append(asyncio.run(talk(ARGS))), daemon=True
                )
                caller.start()
                asked = None
                while asked is None:
                    frame = chat.receive(20)
                    assert frame is not None, "the person was never asked"
                    if frame["type"] == "agent_exchange" and frame["phase"] == "permission":
                        asked = frame
                assert "travel-bot" in asked["prompt"] and asked["tool"] == "clock"
                assert asked["request_id"] and asked["expires_at"] > 0
                assert not results, "the call must wait for the answer"
                chat.send(p.Answer(id="a1", request_id=asked["request_id"], answer="allow_once"))
                caller.join(30)
                assert results, "the call did not finish after the answer"
                allowed = results[0]
                assert tools_of(allowed) == [("clock", "success", None)]
                assert "waiting for a person to approve clock" in progress

                # The same agent without loop_in_human: nobody is asked, ask is deny.
                quiet = asyncio.run(talk({**ARGS, "loop_in_human": False}))
                assert tools_of(quiet) == [("clock", "error", "permission-denied")]

                # Asked again, the person says no: the agent hears it was refused.
                results.clear()
                caller = threading.Thread(
                    target=lambda: results.append(asyncio.run(talk(ARGS))), daemon=True
                )
                caller.start()
                asked = None
                while asked is None:
                    frame = chat.receive(20)
                    assert frame is not None, "the person was not asked the second time"
                    if frame["type"] == "agent_exchange" and frame["phase"] == "permission":
                        asked = frame
                chat.send(p.Answer(id="a2", request_id=asked["request_id"], answer="deny"))
                caller.join(30)
                assert results and tools_of(results[0]) == [("clock", "error", "permission-denied")]
        finally:
            bridge.stop()


def test_with_asks_off_a_loop_in_human_turn_still_denies_an_ask() -> None:
    with live_daemon(clock_turns(1)) as (rt, url):
        with TokenStore(rt.db_path) as store:
            secret = store.create("travel")
        # A person "connected": asks stay off, so the rule still denies.
        sub = rt.events.subscribe("*humans*", lambda _e: None)
        try:

            async def go() -> Any:
                async with connect(url, secret, "auto") as client:
                    return await client.call_tool("talk_to_chalie", ARGS)

            result = asyncio.run(go())
        finally:
            sub.close()
        assert tools_of(result) == [("clock", "error", "permission-denied")]


@pytest.mark.parametrize(
    ("asks", "humans", "loop_in", "expected"),
    [
        (True, 1, True, True),  # the one case a person answers the turn's asks
        (True, 0, True, False),  # nobody connected: ask stays deny
        (True, 1, False, False),  # the agent did not ask to loop a person in
        (False, 1, True, False),  # the operator did not enable it
    ],
)
def test_only_an_enabled_loop_in_human_call_with_a_person_connected_marks_its_turn(
    asks: bool, humans: int, loop_in: bool, expected: bool
) -> None:
    convs = DoublePort()
    with running(convs=convs, desk=FakeDesk(humans), loop_in_human_asks=asks) as r:
        secret = r.tokens.create("agent")

        async def go() -> Any:
            async with connect(r.url, secret, "auto") as client:
                return await client.call_tool("talk_to_chalie", {**ARGS, "loop_in_human": loop_in})

        assert not asyncio.run(go()).is_error
        assert [m.human_present for m in convs.sent] == [expected]


def test_a_form_on_a_loop_in_human_turn_reaches_the_person_with_its_schema() -> None:
    from tests.conversations_double import FORM

    convs = DoublePort()
    desk = FakeDesk(1)
    with running(convs=convs, desk=desk, loop_in_human_asks=True) as r:
        secret = r.tokens.create("agent")

        async def go() -> Any:
            async with connect(r.url, secret, "auto") as client:
                return await client.call_tool(
                    "talk_to_chalie", {**ARGS, "message": "fill the form please"}
                )

        assert not asyncio.run(go()).is_error
    (asked,) = [x for x in desk.shown if x.phase == "permission"]
    assert asked.form == FORM and asked.permission == "_mcp_cap.elicitation"

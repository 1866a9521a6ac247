"""loop_in_human through the real chat bridge: a chat client is shown the agent's exchange."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.mcp.server import BusHumans
from chalie.chat import protocol as p
from chalie.mcp_server.exchange import AgentExchange
from chalie.wire.bus import HUMANS, EventBus
from tests.core.chat.bridge import Bridge, start_bridge, stop_bridge
from tests.core.mcp_server.harness import connect, running
from tools.waiting import wait_until

# Starts an MCP HTTP server with the SDK client: deselect with -m "not slow".
pytestmark = pytest.mark.slow

ARGS: dict[str, Any] = {
    "message": "should I book the flight for the user?",
    "agent_name": "travel-bot",
    "project_or_task_name": "trip: Lisbon",
    "loop_in_human": True,
}


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    home = Path(tempfile.mkdtemp(prefix="chm", dir="/tmp"))
    home.chmod(0o700)
    b = start_bridge(home)
    try:
        yield b
    finally:
        stop_bridge(b)
        shutil.rmtree(home, ignore_errors=True)


def test_a_connected_chat_client_sees_the_agent_the_project_the_message_and_the_answer(
    bridge: Bridge,
) -> None:
    desk = BusHumans(bridge.bus)
    with bridge.zmq() as chat, running(desk=desk) as r:
        chat.send(p.Ping(id="hi"))  # the first frame opens the session
        wait_until(lambda: desk.humans_connected() == 1)
        secret = r.tokens.create("travel")

        async def go() -> Any:
            async with connect(r.url, secret, "auto") as client:
                return await client.call_tool("talk_to_chalie", ARGS)

        result = asyncio.run(go())
        shown: list[dict[str, Any]] = []
        while len(shown) < 2:
            frame = chat.receive(10)
            assert frame is not None, "the chat client was not shown the exchange"
            if frame["type"] == "agent_exchange":
                shown.append(frame)
    asked, answered = shown
    assert (asked["phase"], answered["phase"]) == ("asked", "answered")
    for frame in shown:
        assert frame["agent_name"] == "travel-bot" and frame["project"] == "trip: Lisbon"
        assert frame["message"] == ARGS["message"] and frame["token_name"] == "travel"
    assert answered["answer"] == result.structured_content["answer"]


def test_without_loop_in_human_nothing_is_surfaced(bridge: Bridge) -> None:
    desk = BusHumans(bridge.bus)
    with bridge.zmq() as chat, running(desk=desk) as r:
        chat.send(p.Ping(id="hi"))
        wait_until(lambda: desk.humans_connected() == 1)
        secret = r.tokens.create("quiet")

        async def go() -> Any:
            async with connect(r.url, secret, "auto") as client:
                return await client.call_tool("talk_to_chalie", {**ARGS, "loop_in_human": False})

        assert not asyncio.run(go()).is_error
        frames = []
        while (frame := chat.receive(0.3)) is not None:
            frames.append(frame["type"])
        assert "agent_exchange" not in frames


def test_the_desk_counts_only_human_sessions() -> None:
    bus = EventBus()
    desk = BusHumans(bus)
    catch_all = bus.subscribe(None, lambda _e: None)
    assert desk.humans_connected() == 0
    got: list[Any] = []
    human = bus.subscribe(HUMANS, got.append)
    assert desk.humans_connected() == 1
    exchange = AgentExchange(
        conversation_id="c_1",
        phase="asked",
        token_name="t",
        agent_name="a",
        project="p",
        message="m",
    )
    desk.surface(exchange)
    assert got == [exchange]
    human.close()
    catch_all.close()
    assert desk.humans_connected() == 0

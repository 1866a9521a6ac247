"""The critical path of issue 18 through the real daemon: an agent token cannot reach chat,
cannot answer any approval, and cannot approve its own loop_in_human request by any path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from actors.conversation.chat_bridge import ChatBridge
from actors.conversation.conversations import Conversations
from actors.gate.policy import PolicyActor
from actors.mcp.server import BusHumans
from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from chalie.gate.tokens import TokenStore
from chalie.wire.principals import Principal
from chalie_app.root import Runtime
from tests.core.mcp_server.daemon_harness import live_daemon
from tests.core.mcp_server.harness import connect
from tests.core.mcp_server.test_loop_in_human_asks import ARGS, clock_turns, tools_of
from tools.fake_llm.script import Script, Step, ToolCallStep
from tools.waiting import wait_until

pytestmark = pytest.mark.slow


def refused_status(url: str, secret: str) -> tuple[int, dict[str, Any]]:
    async def go() -> tuple[int, dict[str, Any]]:
        with pytest.raises(InvalidStatus) as err:
            async with ws_connect(url, additional_headers={"Authorization": f"Bearer {secret}"}):
                pass
        return err.value.response.status_code, json.loads(err.value.response.body or b"{}")

    return asyncio.run(go())


def answer_over_websocket(url: str, secret: str, request_id: str, answer: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {secret}"}
        async with ws_connect(url, additional_headers=headers) as ws:
            await ws.send(
                json.dumps(
                    {"type": "answer", "id": "a", "request_id": request_id, "answer": answer}
                )
            )
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 15))
                if frame["type"] in ("answered", "rejected"):
                    return dict(frame)

    return asyncio.run(go())


def test_an_agent_cannot_chat_answer_or_approve_its_own_request() -> None:
    extra = "loop_in_human_asks = true\n[chat]\nport = 0"
    with live_daemon(clock_turns(1), extra) as (rt, url):
        ws_url = str(rt.child("chat", ChatBridge).call(ChatBridge.addresses)["websocket"])
        with TokenStore(rt.db_path) as store:
            agent = store.create("agent1")  # no flag: an agent token
            owner = store.create("me", scope="owner")
            agent_id = next(t.id for t in store.list() if t.name == "agent1")
        # 1. The agent's token is no person on the chat WebSocket: a real 403 before accept.
        status, body = refused_status(ws_url, agent)
        assert status == 403 and body["code"] == "forbidden"

        with ChatClient.local(rt.config.home) as person:  # the owner, on the local socket
            person.send(p.Ping(id="hi"))
            wait_until(lambda: BusHumans(rt.events).humans_connected() == 1, timeout=15)

            async def talk() -> Any:
                async with connect(url, agent, "auto") as client:
                    return await client.call_tool("talk_to_chalie", ARGS)

            results: list[Any] = []
            caller = threading.Thread(
                target=lambda: results.append(asyncio.run(talk())), daemon=True
            )
            caller.start()
            asked = None
            while asked is None:
                frame = person.receive(20)
                assert frame is not None, "the owner was never asked"
                if frame["type"] == "agent_exchange" and frame["phase"] == "permission":
                    asked = frame
            rid = asked["request_id"]
            # The prompt names who asked, through which channel, and the call's parameters.
            assert "agent token agent1" in asked["prompt"]
            assert "external_agent" in asked["prompt"]
            assert 'zone = "UTC"' in asked["prompt"] and 'action = "now"' in asked["prompt"]

            # 2. Every other path the agent has to an answer is refused; the request stays.
            me = Principal(scope="agent", id=agent_id, name="agent1")
            with pytest.raises(ValueError) as through_conversations:
                rt.child("conversations", Conversations).call(
                    Conversations.answer, rid, "allow_once", me
                )
            assert getattr(through_conversations.value, "code", None) == "forbidden"
            policy = rt.child("policy", PolicyActor)
            with pytest.raises(ValueError) as through_gate:
                policy.call(PolicyActor.answer, rid, "allow_once", me)
            assert getattr(through_gate.value, "code", None) == "forbidden"
            with pytest.raises(ValueError):
                policy.call(PolicyActor.answer, rid, "allow_once", None)  # nobody: refused
            assert rid in [r.request_id for r in policy.call(PolicyActor.pending)]
            assert not results, "the call must still wait for the owner"

            # 3. The owner answers from another owner client (an owner token on the WebSocket).
            assert answer_over_websocket(ws_url, owner, rid, "deny") == {
                "type": "answered",
                "id": "a",
                "request_id": rid,
                "found": True,
            }
            caller.join(30)
            assert results and tools_of(results[0]) == [("clock", "error", "permission-denied")]
            # Issue 30 (a quirk): the agent hears that the person said no, not that nobody
            # was there.
            (said,) = results[0].structured_content["could_not"]
            assert said["why"] == "the person asked to approve it said no", said


@contextlib.contextmanager
def parking_daemon(script: Script) -> Iterator[tuple[Runtime, Callable[[dict[str, Any]], Any]]]:
    """A daemon with ``park_asks`` on, and one agent token's talk_to_chalie (sync)."""
    with live_daemon(script, "park_asks = true\n[chat]\nport = 0") as (rt, url):
        with TokenStore(rt.db_path) as store:
            agent = store.create("agent1")

        def talk(args: dict[str, Any]) -> Any:
            async def go() -> Any:
                async with connect(url, agent, "auto") as client:
                    return await client.call_tool("talk_to_chalie", args)

            return asyncio.run(go())

        yield rt, talk


def test_park_asks_an_agents_call_waits_for_the_owner_and_the_next_call_gets_the_outcome() -> None:
    with parking_daemon(clock_turns(3)) as (rt, talk):
        quiet = {**ARGS, "loop_in_human": False}
        first = talk(quiet)
        assert tools_of(first) == [("clock", "error", "approval-pending")]
        (parked,) = first.structured_content["waiting_for_owner"]
        rid = parked["request_id"]
        assert parked["permission"] == "clock.now" and 'zone = "UTC"' in parked["question"]
        text = first.content[0].text
        assert f"request {rid}" in text and "Ask again in this conversation" in text
        policy = rt.child("policy", PolicyActor)
        assert rid in [r.request_id for r in policy.call(PolicyActor.pending)]
        # Nobody but the owner answers; the owner does, from anywhere (here: the control path).
        me = Principal(scope="agent", id="tok_x", name="agent1")
        with pytest.raises(ValueError):
            policy.call(PolicyActor.answer, rid, "allow_once", me)
        from chalie.wire.principals import LOCAL_OWNER

        assert policy.call(PolicyActor.answer, rid, "allow_once", LOCAL_OWNER) is True

        cid = first.structured_content["conversation_id"]
        second = talk({**quiet, "conversation_id": cid})
        assert second.structured_content["owner_answers"] == [
            {"request_id": rid, "permission": "clock.now", "outcome": "allow_once"}
        ]
        assert tools_of(second) == [("clock", "success", None)]  # ran on the owner's answer
        # Once only: the third call asks (and parks) again.
        third = talk({**quiet, "conversation_id": cid})
        assert tools_of(third) == [("clock", "error", "approval-pending")]
        assert third.structured_content["owner_answers"] == []


def test_without_park_asks_an_agents_ask_stays_a_deny() -> None:
    with live_daemon(clock_turns(1), "[chat]\nport = 0") as (rt, url):
        with TokenStore(rt.db_path) as store:
            agent = store.create("agent1")

        async def talk() -> Any:
            async with connect(url, agent, "auto") as client:
                return await client.call_tool("talk_to_chalie", {**ARGS, "loop_in_human": False})

        result = asyncio.run(talk())
        assert tools_of(result) == [("clock", "error", "permission-denied")]
        assert result.structured_content["waiting_for_owner"] == []
        assert rt.child("policy", PolicyActor).call(PolicyActor.pending) == []


def clock_calls(*zones: str) -> Script:
    """One agent turn a zone: find the clock, read it in that zone, answer."""
    steps: list[Step] = []
    for zone in zones:
        find = {"query": ["clock"], "act_summary": "looking for a clock"}
        steps.append(Step(tool_calls=[ToolCallStep(name="find_tools", arguments=find)]))
        now = {"action": "now", "zone": zone, "act_summary": "reading the clock"}
        steps.append(Step(tool_calls=[ToolCallStep(name="clock", arguments=now)]))
        steps.append(Step(text="done"))
    return Script(steps=steps, on_user=Step(text="done"))


def test_an_allow_once_of_a_parked_request_runs_only_the_call_the_owner_saw() -> None:
    """Issue 30 (critical): the owner's once covers the exact call; another call in the same
    conversation (other arguments) parks a new request instead of running on that answer."""
    script = clock_calls("UTC", "Asia/Tokyo", "UTC", "UTC")
    with parking_daemon(script) as (rt, talk):
        quiet = {**ARGS, "loop_in_human": False}
        first = talk(quiet)
        (parked,) = first.structured_content["waiting_for_owner"]
        rid = parked["request_id"]
        assert 'zone = "UTC"' in parked["question"]
        from chalie.wire.principals import LOCAL_OWNER

        policy = rt.child("policy", PolicyActor)
        assert policy.call(PolicyActor.answer, rid, "allow_once", LOCAL_OWNER) is True
        cid = first.structured_content["conversation_id"]

        # Another call under the same permission: a new request, not the owner's once.
        swapped = talk({**quiet, "conversation_id": cid})
        assert tools_of(swapped) == [("clock", "error", "approval-pending")]
        (again,) = swapped.structured_content["waiting_for_owner"]
        assert again["request_id"] != rid and 'zone = "Asia/Tokyo"' in again["question"]

        # The call the owner saw still runs on that answer, once.
        same = talk({**quiet, "conversation_id": cid})
        assert tools_of(same) == [("clock", "success", None)]
        once = talk({**quiet, "conversation_id": cid})
        assert tools_of(once) == [("clock", "error", "approval-pending")]
        # The question says what each answer covers.
        assert "once allows this call only" in parked["question"]

"""The whole path: a WebSocket or ZeroMQ client → chat bridge → Conversations → TurnActor → the
scripted model over HTTP → find_tools → a tool call gated by ask → the answer from a client →
the result → the final answer. A real daemon in this process; nothing is a double here."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from websockets.asyncio.client import connect

from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from tests.core.chat.bridge import collect, collect_all
from tests.core.chat.daemon import Daemon, clock_script

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow

SCRIPT = clock_script("reading the clock")


def check_turn(frames: list[dict[str, Any]]) -> None:
    started = [(f["tool"], f["act_summary"]) for f in frames if f["type"] == "tool_started"]
    assert started == [("find_tools", "finding"), ("clock", "reading the clock")]
    done = [(f["tool"], f["status"]) for f in frames if f["type"] == "tool_finished"]
    assert done == [("find_tools", "success"), ("clock", "success")]
    text = "".join(f["text"] for f in frames if f["type"] == "text_delta")
    assert text == "It is evening in Tokyo."
    end = [f for f in frames if f["type"] == "turn_finished"]
    assert end and end[-1]["reason"] == "final" and end[-1]["text"] == text
    seqs = [f["seq"] for f in frames if "seq" in f]
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.parametrize("channel", ["chat-openai", "chat-anthropic", "chat-ollama"])
def test_a_websocket_client_drives_a_gated_turn_to_its_answer(d: Daemon, channel: str) -> None:
    d.script(SCRIPT)

    async def go() -> list[dict[str, Any]]:
        frames: list[dict[str, Any]] = []
        headers = {"Authorization": f"Bearer {d.token}"}
        async with connect(d.addresses["websocket"], additional_headers=headers) as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "send",
                        "channel": channel,
                        "text": "what time is it in Tokyo",
                        "client_msg_id": f"ws-{channel}",
                    }
                )
            )
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 20))
                frames.append(frame)
                if frame["type"] == "permission_request":
                    assert frame["tool"] == "clock"
                    answer = {
                        "type": "answer",
                        "request_id": frame["request_id"],
                        "answer": "allow_once",
                    }
                    await ws.send(json.dumps(answer))
                if frame["type"] == "turn_finished":
                    return frames

    check_turn(asyncio.run(go()))


def test_a_zmq_client_drives_a_gated_turn_and_another_client_may_answer(d: Daemon) -> None:
    d.script(SCRIPT)
    with ChatClient.local(d.home) as asker, ChatClient.local(d.home) as other:
        asker.send(
            p.Send(channel="chat-openai", text="what time is it in Tokyo", client_msg_id="z1")
        )
        frames = collect(asker, lambda f: f["type"] == "permission_request", timeout=20)
        cid = frames[1]["conversation_id"]
        request = frames[-1]
        other.send(p.Open(conversation_id=cid, after_seq=0))
        collect(other, lambda f: f["type"] == "opened", timeout=20)
        other.send(p.Answer(request_id=request["request_id"], answer="allow_once"))
        assert any(f.get("found") for f in collect_all(other, "answered"))
        frames += collect(asker, lambda f: f["type"] == "turn_finished", timeout=20)
        settled = [f for f in frames if f["type"] == "permission_settled"]
        assert settled and settled[0]["answer"] == "allow_once"
    check_turn([f for f in frames if "seq" in f])


def test_the_real_service_refusals_reach_the_client_as_codes(d: Daemon) -> None:
    with ChatClient.local(d.home) as c:
        c.send(p.Send(channel="no-such-channel", text="hi", client_msg_id="u1", id="r"))
        rejected = collect(c, lambda f: f["type"] == "rejected", timeout=20)[-1]
        assert rejected["code"] == "unknown-channel" and rejected["id"] == "r"
        c.send(p.Answer(request_id="nobody", answer="deny", id="a"))
        answered = collect(c, lambda f: f["type"] == "answered", timeout=20)[-1]
        assert answered["found"] is False


def test_a_model_that_cannot_be_reached_is_a_clean_end(d: Daemon) -> None:
    with ChatClient.local(d.home) as c:
        c.send(p.Send(channel="refused", text="hello?", client_msg_id="m1"))
        frames = collect(c, lambda f: f["type"] == "turn_finished", timeout=30)
        assert frames[-1]["reason"] == "model-error"

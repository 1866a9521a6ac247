"""A remote server's form elicitation is a durable permission request a chat client answers:
a real daemon in this process, the capable fixture server over stdio, the scripted model on
loopback, a real WebSocket client and a ZeroMQ client. Both get the permission_request frame
with the requested schema; an answer that does not fit it is rejected and the request stays
pending (``chalie policy pending``); the fitting one reaches the server; ``chalie mcp answer``
answers the next one through the same request."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from actors.conversation.chat_bridge import ChatBridge
from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from chalie.gate.tokens import FIRST_TOKEN_FILE
from chalie.process import control
from tests.core.chat.daemon import wait_indexed
from tools.daemon_thread import DaemonThread
from tools.fake_llm import FakeModelServer, load_script
from tools.fixture_mcp.rig import capable_config

pytestmark = pytest.mark.slow

FIND = {"name": "find_tools", "arguments": {"query": ["_mcp_cap_ask_name"], "act_summary": "f"}}
ASK = {"name": "_mcp_cap_ask_name", "arguments": {"act_summary": "asking your name"}}
TURN = [{"tool_calls": [FIND]}, {"tool_calls": [ASK]}, {"text": "server said: {last_result}"}]
SCRIPT = {"steps": TURN + TURN}


def _pending(home: Path) -> list[dict[str, Any]]:
    client = control.ControlClient(home)
    try:
        reply = client.call("policy.pending", {}, timeout=10)
        assert reply.ok, reply.error
        found: list[dict[str, Any]] = reply.data
        return found
    finally:
        client.close()


def test_a_form_elicitation_is_answered_from_chat_and_the_cli() -> None:
    model = FakeModelServer(load_script(json.dumps(SCRIPT))).start()
    home = Path(tempfile.mkdtemp(prefix="che-", dir="/tmp"))
    config = capable_config(model, home)
    running: DaemonThread | None = None
    zmq_frames: list[dict[str, Any]] = []
    try:
        running = DaemonThread(config)
        rt = running.rt
        addresses: dict[str, Any] = running.chat().call(ChatBridge.addresses)
        token = (home / FIRST_TOKEN_FILE).read_text().strip()
        wait_indexed(rt, "_mcp_cap_ask_name")

        async def turn(answer_form: Any) -> list[dict[str, Any]]:
            frames: list[dict[str, Any]] = []
            headers = {"Authorization": f"Bearer {token}"}
            async with connect(addresses["websocket"], additional_headers=headers) as ws:
                await ws.send(
                    json.dumps(
                        {
                            "type": "send",
                            "channel": "chat-openai",
                            "text": "ask my name",
                            "client_msg_id": f"ws-{len(str(answer_form))}",
                        }
                    )
                )
                while True:
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
                    frames.append(frame)
                    if frame["type"] == "permission_request" and frame.get("form") is None:
                        await ws.send(
                            json.dumps(
                                {
                                    "type": "answer",
                                    "request_id": frame["request_id"],
                                    "answer": "allow_once",
                                }
                            )
                        )
                    elif frame["type"] == "permission_request":
                        await answer_form(ws, frame)
                    if frame["type"] == "turn_finished":
                        return frames

        async def from_chat(ws: Any, frame: dict[str, Any]) -> None:
            rid = frame["request_id"]
            # a ZeroMQ client of the same conversation gets the same frame, schema and all
            with ChatClient.local(home) as zc:
                zc.send(p.Open(conversation_id=frame["conversation_id"]))
                for _ in range(200):
                    got = zc.receive(5)
                    if got is None:
                        break
                    zmq_frames.append(got)
                    if got.get("type") == "permission_request" and got["request_id"] == rid:
                        break
                # its answer does not fit the form: rejected, the request stays
                zc.send(
                    p.Answer(
                        id="bad1",
                        request_id=rid,
                        answer="allow_once",
                        content={"name": "Ann", "age": "old"},
                    )
                )
                for _ in range(200):
                    got = zc.receive(5)
                    if got is None:
                        break
                    zmq_frames.append(got)
                    if got.get("id") == "bad1":
                        break
            assert [r["request_id"] for r in _pending(home)] == [rid]
            bad = {"type": "answer", "id": "bad2", "request_id": rid, "answer": "allow_once"}
            await ws.send(json.dumps(bad))  # a form without its fields
            await ws.send(
                json.dumps(
                    {
                        "type": "answer",
                        "id": "good",
                        "request_id": rid,
                        "answer": "allow_once",
                        "content": {"name": "Ann", "age": 41},
                    }
                )
            )

        async def from_cli(_ws: Any, frame: dict[str, Any]) -> None:
            client = control.ControlClient(home)
            try:
                reply = await asyncio.to_thread(
                    client.call,
                    "mcp.answer",
                    {"request_id": frame["request_id"], "content": {"name": "Bo", "age": 7}},
                    timeout=10,
                )
            finally:
                client.close()
            assert reply.ok and reply.data == {"request_id": frame["request_id"], "answered": True}

        first = asyncio.run(turn(from_chat))
        second = asyncio.run(turn(from_cli))
    finally:
        if running is not None:
            running.stop()
        model.stop()
    (form_frame,) = [f for f in first if f["type"] == "permission_request" and f.get("form")]
    assert form_frame["permission"] == "_mcp_cap.elicitation"
    assert set(form_frame["form"]["properties"]) == {"name", "age"}
    assert "name and age" in form_frame["prompt"]
    zmq_form = [f for f in zmq_frames if f.get("type") == "permission_request" and f.get("form")]
    assert zmq_form and zmq_form[0]["form"] == form_frame["form"]
    (zmq_bad,) = [f for f in zmq_frames if f.get("id") == "bad1"]
    assert zmq_bad["type"] == "rejected" and "fit the form" in zmq_bad["message"]
    (ws_bad,) = [f for f in first if f.get("id") == "bad2"]
    assert ws_bad["type"] == "rejected" and "fields" in ws_bad["message"]
    (good,) = [f for f in first if f.get("id") == "good"]
    assert good == {
        "type": "answered",
        "id": "good",
        "request_id": good["request_id"],
        "found": True,
    }
    settled = [f for f in first if f["type"] == "permission_settled"]
    assert ("allow_once" in [s["answer"] for s in settled]) and len(settled) == 2
    assert "hello Ann (41)" in first[-1]["text"]
    assert "hello Bo (7)" in second[-1]["text"]
    # the request is kept (schema and all) and settled; the answer's content is not kept
    with sqlite3.connect(config.layout.db) as conn:
        rows = conn.execute(
            "SELECT body, state, answered_by FROM permission_requests WHERE permission = ?",
            ("_mcp_cap.elicitation",),
        ).fetchall()
    # answered by the WebSocket's owner token, then by the local owner (the CLI)
    assert [state for _, state, _ in rows] == ["allow_once"] * 2
    assert sorted(str(by)[:4] for _, _, by in rows) == ["loca", "tok_"]
    assert all(b"Ann" not in body and b"Bo" not in body for body, _, _ in rows)

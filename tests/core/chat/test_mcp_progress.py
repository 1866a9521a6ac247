"""A remote MCP tool's progress reaches a real WebSocket chat client: a real daemon in this
process, the capable fixture server over stdio, the scripted model on loopback; the client
sees tool_progress frames for the call between its tool_started and tool_finished."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from actors.conversation.chat_bridge import ChatBridge
from chalie.gate.tokens import FIRST_TOKEN_FILE
from tests.core.chat.daemon import wait_indexed
from tools.daemon_thread import DaemonThread
from tools.fake_llm import FakeModelServer, load_script
from tools.fixture_mcp.rig import capable_config

pytestmark = pytest.mark.slow

SCRIPT = {
    "steps": [
        {
            "tool_calls": [
                {
                    "name": "find_tools",
                    "arguments": {"query": ["_mcp_cap_count"], "act_summary": "finding"},
                }
            ]
        },
        {
            "tool_calls": [
                {
                    "name": "_mcp_cap_count",
                    "arguments": {"n": 4, "pause": 0.05, "act_summary": "counting"},
                }
            ]
        },
        {"text": "Counted.", "chunk": 4},
    ]
}


def test_remote_progress_reaches_a_websocket_client() -> None:
    model = FakeModelServer(load_script(json.dumps(SCRIPT))).start()
    home = Path(tempfile.mkdtemp(prefix="chp-", dir="/tmp"))
    config = capable_config(model, home)
    running: DaemonThread | None = None
    try:
        running = DaemonThread(config)
        rt = running.rt
        addresses: dict[str, Any] = running.chat().call(ChatBridge.addresses)
        token = (home / FIRST_TOKEN_FILE).read_text().strip()
        wait_indexed(rt, "_mcp_cap_count")

        async def go() -> list[dict[str, Any]]:
            frames: list[dict[str, Any]] = []
            headers = {"Authorization": f"Bearer {token}"}
            async with connect(addresses["websocket"], additional_headers=headers) as ws:
                await ws.send(
                    json.dumps(
                        {
                            "type": "send",
                            "channel": "chat-openai",
                            "text": "count to four",
                            "client_msg_id": "ws-progress",
                        }
                    )
                )
                while True:
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
                    frames.append(frame)
                    if frame["type"] == "permission_request":
                        answer = {
                            "type": "answer",
                            "request_id": frame["request_id"],
                            "answer": "allow_once",
                        }
                        await ws.send(json.dumps(answer))
                    if frame["type"] == "turn_finished":
                        return frames

        frames = asyncio.run(go())
    finally:
        if running is not None:
            running.stop()
        model.stop()
    kinds = [(f["type"], f.get("tool"), f.get("status"), f.get("code")) for f in frames]
    progress = [f for f in frames if f["type"] == "tool_progress"]
    assert [p["progress"] for p in progress] == [1.0, 2.0, 3.0, 4.0], kinds
    assert all(p["tool"] == "_mcp_cap_count" and p["total"] == 4.0 for p in progress)
    assert progress[0]["message"] == "step 1"
    started = next(i for i, f in enumerate(frames) if f.get("tool") == "_mcp_cap_count")
    finished = max(i for i, f in enumerate(frames) if f["type"] == "tool_finished")
    assert started < frames.index(progress[0]) and frames.index(progress[-1]) < finished
    assert frames[finished]["status"] == "success"

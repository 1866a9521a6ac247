"""A real daemon in this process for the Brain's tests: chat web server and inbound MCP server on
ephemeral ports, the scripted model on loopback, the first (owner) token read from its file."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx2

from actors.chat_bridge import ChatBridge
from actors.mcp_server import McpServerActor
from chalie.config import Config
from chalie.tokens import FIRST_TOKEN_FILE
from chalie_app import root as daemon
from chalie_app.root import Runtime
from tests.core.conversation.harness import config_toml
from tools.fake_llm import FakeModelServer, load_script
from tools.fake_llm.script import Player
from tools.waiting import wait_until


class BrainDaemon:
    def __init__(self, extra_toml: str = "") -> None:
        self.server = FakeModelServer(load_script("{}")).start()
        self.home = Path(tempfile.mkdtemp(prefix="chb-", dir="/tmp"))
        text = config_toml(self.server) + "[chat]\nport = 0\n[mcp_server]\nport = 0\n" + extra_toml
        (self.home / "config.toml").write_text(text)
        ready = threading.Event()
        box: dict[str, Runtime] = {}

        def on_ready(rt: Runtime) -> None:
            box["rt"] = rt
            ready.set()

        self.thread = threading.Thread(
            target=daemon.run,
            args=(Config.load(self.home),),
            kwargs={"ready": on_ready},
            daemon=True,
        )
        self.thread.start()
        assert ready.wait(120), "the daemon did not start"
        self.rt = box["rt"]
        try:
            chat = self.rt.child("chat", ChatBridge).within(10)
            wait_until(chat.is_alive, 60, "the chat child to start")
            mcp = self.rt.child("mcp_server", McpServerActor).within(10)
            wait_until(mcp.is_alive, 60, "the MCP server to start")
            self.addresses: dict[str, Any] = chat.call(ChatBridge.addresses)
            self.ws_url: str = self.addresses["websocket"]
            self.base = self.ws_url.replace("ws://", "http://").rsplit("/chat", 1)[0]
            self.hostport = self.base.split("://", 1)[1]
            self.token = (self.home / FIRST_TOKEN_FILE).read_text().strip()
            self.mcp_url: str = mcp.call(McpServerActor.status)["url"]
        except BaseException:
            self.close()
            raise

    def client(self, token: str | None = "owner", **kw: Any) -> httpx2.Client:
        headers = dict(kw.pop("headers", {}))
        if token == "owner":
            token = self.token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return httpx2.Client(base_url=self.base, headers=headers, timeout=30, **kw)

    def script(self, script: dict[str, Any]) -> None:
        self.server.app.player = Player(load_script(json.dumps(script)))
        self.server.app.requests.clear()

    def close(self) -> None:
        self.rt.request_stop()
        self.thread.join(60)
        self.server.stop()
        shutil.rmtree(self.home, ignore_errors=True)

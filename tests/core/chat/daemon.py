"""A real daemon in this process, chat on an ephemeral port, and the scripted model on loopback."""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path
from typing import Any

from actors.chat_bridge import ChatBridge
from chalie.config import Config
from chalie.tokens import FIRST_TOKEN_FILE
from chalie_app import root as daemon
from chalie_app.root import Runtime
from tests.core.conversation.harness import config_toml
from tests.slow import require_slow
from tools.fake_llm import FakeModelServer, load_script
from tools.fake_llm.script import Player
from tools.waiting import wait_until


class Daemon:
    def __init__(self) -> None:
        require_slow("a daemon")
        self.server = FakeModelServer(load_script("{}")).start()
        self.home = Path(tempfile.mkdtemp(prefix="che-", dir="/tmp"))
        text = config_toml(self.server) + "[chat]\nport = 0\n"
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
            # The supervisor starts its children after ``ready``: wait for this one.
            wait_until(chat.is_alive, 60, "the chat child to start")
            self.addresses: dict[str, Any] = chat.call(ChatBridge.addresses)
            self.token = (self.home / FIRST_TOKEN_FILE).read_text().strip()
        except BaseException:
            self.close()
            raise

    def script(self, script: dict[str, Any]) -> None:
        self.server.app.player = Player(load_script(json.dumps(script)))
        self.server.app.requests.clear()

    def close(self) -> None:
        self.rt.request_stop()
        self.thread.join(60)
        self.server.stop()


def clock_script(act_summary: str) -> dict[str, Any]:
    """A turn that finds the clock, reads it (with ``act_summary``), then answers in deltas."""
    return {
        "steps": [
            {
                "tool_calls": [
                    {
                        "name": "find_tools",
                        "arguments": {"query": ["clock"], "act_summary": "finding"},
                    }
                ]
            },
            {
                "tool_calls": [
                    {
                        "name": "clock",
                        "arguments": {"zone": "Asia/Tokyo", "act_summary": act_summary},
                    }
                ]
            },
            {"text": "It is evening in Tokyo.", "chunk": 6},
        ]
    }

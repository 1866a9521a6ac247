"""A real daemon in this process, chat on an ephemeral port, and the scripted model on loopback."""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path
from typing import Any

from chalie import daemon
from chalie.config import Config
from chalie.daemon import Runtime
from chalie.tokens import FIRST_TOKEN_FILE
from tests.conversation.harness import config_toml
from tools.fake_llm import FakeModelServer, load_script
from tools.fake_llm.script import Player


class Daemon:
    def __init__(self) -> None:
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
        self.addresses: dict[str, Any] = self.rt.child("chat").call("addresses", timeout=10)
        self.token = (self.home / FIRST_TOKEN_FILE).read_text().strip()

    def script(self, script: dict[str, Any]) -> None:
        self.server.app.player = Player(load_script(json.dumps(script)))
        self.server.app.requests.clear()

    def close(self) -> None:
        self.rt.request_stop()
        self.thread.join(60)
        self.server.stop()

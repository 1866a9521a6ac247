"""A real daemon in a thread of this process, for tests and benchmarks: the composition root's
``run`` started, waited for until it is ready, and stopped."""

from __future__ import annotations

import threading
import time
from typing import Any

from actors.child_ref import ChildRef
from actors.conversation.chat_bridge import ChatBridge
from chalie.process.config import Config
from chalie_app import root
from chalie_app.root import Runtime
from tools.waiting import wait_until

BUILDING = ("loading", "rebuilding")


class DaemonThread:
    """``chalie_app.root.run(config, **run)`` on a daemon thread; ``rt`` once it is ready.

    Raises if the daemon ends before it is ready (a start-up failure: its exit code is in the
    message) or is not ready within ``timeout`` seconds.
    """

    def __init__(self, config: Config, *, timeout: float = 120.0, **run: Any) -> None:
        ready = threading.Event()
        box: dict[str, Any] = {}

        def on_ready(rt: Runtime) -> None:
            box["rt"] = rt
            ready.set()

        def main() -> None:
            box["exit"] = root.run(config, ready=on_ready, **run)

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.05):
            if not self.thread.is_alive():
                raise RuntimeError(f"the daemon ended before it was ready: exit {box.get('exit')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the daemon was not ready within {timeout} s")
        self.rt: Runtime = box["rt"]
        # Ready for a turn: a find sent while the index is first built is answered at once
        # with discovery-index-building, so a test's first turn waits for the build here.
        discovery = self.rt.services.discovery
        while discovery is not None and discovery.snapshot()["state"] in BUILDING:
            if not self.thread.is_alive():
                raise RuntimeError(f"the daemon ended before it was ready: exit {box.get('exit')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the discovery index was not built within {timeout} s")
            time.sleep(0.05)

    def chat(self, timeout: float = 60.0) -> ChildRef[ChatBridge]:
        """The chat bridge, once it runs (the supervisor starts its children after ``ready``)."""
        chat = self.rt.child("chat", ChatBridge).within(10)
        wait_until(chat.is_alive, timeout, "the chat child to start")
        return chat

    def stop(self, timeout: float = 60.0) -> None:
        self.rt.request_stop()
        self.thread.join(timeout)

"""A real ChatBridge actor on a real loop, over the Conversations double, and what reads a
client's frames."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka

from actors.child_ref import ChildRef
from actors.conversation.chat_bridge import ChatBridge
from actors.loop import EventLoopThread
from chalie.chat.client import ChatClient
from chalie.gate.tokens import FIRST_TOKEN_FILE
from chalie.process.config import Config
from chalie.wire.bus import EventBus
from tests.conversations_double import ConversationsDouble


@dataclass
class Bridge:
    home: Path
    ref: pykka.ActorRef[Any]
    convs: pykka.ActorRef[Any]
    bus: EventBus
    loop: EventLoopThread
    token: str

    @property
    def ws_url(self) -> str:
        return str(self.ref.proxy().addresses().get()["websocket"])

    def addresses(self) -> dict[str, Any]:
        return dict(self.ref.proxy().addresses().get())

    def zmq(self) -> ChatClient:
        return ChatClient.local(self.home)


def start_bridge(home: Path, **config: Any) -> Bridge:
    loop = EventLoopThread()
    loop.start()
    bus = EventBus()
    convs = ConversationsDouble.start(bus)
    cfg = Config.from_mapping({"chat": {"port": 0, **config}}, home=home).chat
    ref = ChatBridge.start(
        cfg, home, home / "chalie.db", loop, bus, ChildRef.to(convs, "conversations")
    )
    ref.proxy().addresses().get(timeout=15)  # on_start has run: the transports listen
    written = home / FIRST_TOKEN_FILE
    token = written.read_text().strip() if written.exists() else ""
    return Bridge(home, ref, convs, bus, loop, token)


def stop_bridge(b: Bridge) -> None:
    b.ref.stop()
    b.convs.stop()
    b.loop.stop()


def collect(client: ChatClient, until: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Frames until one satisfies ``until`` (included)."""
    got: list[dict[str, Any]] = []
    while True:
        frame = client.receive(timeout)
        assert frame is not None, f"no frame in {timeout} s; so far {got}"
        got.append(frame)
        if until(frame):
            return got


def collect_all(client: ChatClient, *kinds: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Frames until one of each kind has arrived, in whatever order they come."""
    wanted = set(kinds)
    got: list[dict[str, Any]] = []
    while wanted:
        frame = client.receive(timeout)
        assert frame is not None, f"no frame in {timeout} s; still waiting for {wanted}; {got}"
        got.append(frame)
        wanted.discard(frame["type"])
    return got

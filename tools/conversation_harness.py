"""A real daemon in this process and the scripted model server on loopback: for the turn
tests (``tests/core/conversation/harness.py`` guards it with the slow mark) and benchmarks."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from actors.child_ref import ChildRef
from actors.conversation.chat_bridge import ChatBridge
from actors.conversation.conversations import Conversations
from chalie.conversation.requests import SendMessage
from chalie.gate.tokens import FIRST_TOKEN_FILE
from chalie.process.config import Config
from chalie.wire.events import TurnFinished
from chalie.wire.messages import Accepted
from tools.daemon_thread import DaemonThread
from tools.fake_llm import FakeModelServer, load_script
from tools.fake_llm.script import Player
from tools.waiting import wait_until

FORMATS = ("openai", "ollama", "anthropic")


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def base_url(server: FakeModelServer, fmt: str) -> str:
    return server.url + ("/v1" if fmt == "openai" else "")


def config_toml(server: FakeModelServer, conversations: str = "") -> str:
    lines: list[str] = []

    def model(name: str, fmt: str, **extra: Any) -> None:
        lines.append(f"[models.{name}]")
        lines.append(f'provider = "{fmt}"')
        lines.append(f'base_url = "{base_url(server, fmt)}"')
        lines.append('model = "scripted"')
        extra.setdefault("retries", 2)
        extra.setdefault("backoff", 0.01)
        # The protocol's tests script every request: the small-model aids that add a
        # request or a call (the framework seed, the answer check) or hold the output to a
        # schema (structured steps) are on for "small" only.
        extra.setdefault("seed_tools", "off")
        extra.setdefault("answer_check", "off")
        extra.setdefault("structured_steps", "off")
        for k, v in extra.items():
            lines.append(f"{k} = {json.dumps(v)}")

    def channel(name: str, **keys: Any) -> None:
        lines.append(f"[channels.{name}]")
        for k, v in keys.items():
            lines.append(f"{k} = {json.dumps(v)}")

    model("default", "openai")
    for fmt in FORMATS:
        model(fmt, fmt)
        model(f"{fmt}-whole", fmt, stream=False)
        channel(f"chat-{fmt}", human_present=True, policy_channel="chat", model=fmt)
        channel(f"bg-{fmt}", model=fmt, pinned=["clock", "calculator"])
        channel(f"bg-{fmt}-whole", model=f"{fmt}-whole", pinned=["clock", "calculator"])
    # The small-model aids as shipped (auto: on for the openai wire).
    model(
        "small",
        "openai",
        seed_tools="auto",
        answer_check="auto",
        memory_brief="on",
        structured_steps="auto",
    )
    channel("small", model="small", human_present=True, policy_channel="chat")
    channel("small-bg", model="small")
    model("impatient", "openai", read_timeout=0.3, retries=1)
    lines.append("[models.refused]")
    lines.append(f'base_url = "http://127.0.0.1:{free_port()}/v1"')
    lines.append("retries = 1")
    lines.append("backoff = 0.01")
    channel("refused", model="refused")
    model("tiny", "openai", context_window=700, max_output_tokens=100)
    channel("steps", model="default", pinned=["calculator"], max_steps=3, max_repeat=100)
    channel("repeat", model="default", pinned=["calculator"])
    channel("clocked", model="default", pinned=["calculator"], wall_clock=0.5)
    channel("tokens", model="default", pinned=["calculator"], token_budget=30)
    channel("hang", model="impatient", pinned=["calculator"])
    channel("tiny", model="tiny", pinned=["calculator"])
    # Holds a summary and a question, not a long first turn as well (compaction tests).
    model("roomy", "openai", context_window=2000, max_output_tokens=100)
    channel("roomy", model="roomy", find_tools=False)
    channel("async", model="default", pinned=["clock"], async_offered=True)
    # A model with the small-model repairs off (tool_call_rescue, answer_nudge).
    model("literal", "openai", tool_call_rescue="off", answer_nudge="off")
    channel("literal", model="literal", pinned=["clock", "calculator"], find_tools=False)
    lines.append("[conversations]")
    if "idle_stop" not in conversations:
        lines.append("idle_stop = 1.0")
    lines.append("max_queued = 2")
    if conversations:
        lines.append(conversations)
    return "\n".join(lines) + "\n"


class Harness:
    """The daemon, the model server, and the live events of every conversation."""

    def __init__(self, extra_toml: str = "", conversations: str = "", clock: Any = None) -> None:
        self.server = FakeModelServer(load_script("{}")).start()
        self.home = Path(tempfile.mkdtemp(prefix="cvh-", dir="/tmp"))
        (self.home / "config.toml").write_text(config_toml(self.server, conversations) + extra_toml)
        self.config = Config.load(self.home)
        self.events: list[Any] = []
        self._lock = threading.Lock()
        self.daemon = DaemonThread(self.config, clock=clock)
        self.rt = self.daemon.rt
        wait_until(self._tree_up, 120, "every child of the tree to run")
        self.sub = self.rt.events.subscribe(None, self._record)

    def _tree_up(self) -> bool:
        assert self.rt.supervisor is not None
        status = self.rt.supervisor.proxy().status().get(timeout=10)
        return all(c["alive"] for c in status["children"])

    def _record(self, event: Any) -> None:
        with self._lock:
            self.events.append(event)

    @property
    def conversations(self) -> ChildRef[Conversations]:
        return self.rt.child("conversations", Conversations).within(10)

    def script(self, script: dict[str, Any]) -> None:
        self.server.app.player = Player(load_script(json.dumps(script)))
        self.server.app.requests.clear()
        self.server.app.received.clear()

    def send(
        self,
        text: str,
        channel: str,
        conversation_id: str | None = None,
        client_msg_id: str = "",
        busy: str = "queue",
    ) -> Accepted:
        result: Accepted = self.conversations.call(
            Conversations.submit,
            SendMessage(
                conversation_id=conversation_id,
                channel=channel,
                text=text,
                client_msg_id=client_msg_id,
                busy=busy,  # type: ignore[arg-type]
            ),
        ).result(10)
        return result

    def of(self, conversation_id: str, kind: type | None = None) -> list[Any]:
        with self._lock:
            return [
                e
                for e in self.events
                if getattr(e, "conversation_id", None) == conversation_id
                and (kind is None or isinstance(e, kind))
                and getattr(e, "recorded", False)
            ]

    def finished(self, accepted: Accepted, timeout: float = 15.0) -> TurnFinished:
        def done() -> TurnFinished | None:
            for e in self.of(accepted.conversation_id, TurnFinished):
                if e.turn_id == accepted.turn_id:
                    return e  # type: ignore[no-any-return]
            return None

        result: TurnFinished = wait_until(done, timeout, f"turn {accepted.turn_id} to finish")
        return result

    def stored(self, conversation_id: str) -> list[Any]:
        result: list[Any] = self.conversations.call(Conversations.events, conversation_id, 0, 1000)
        return result

    def history(self, conversation_id: str) -> list[Any]:
        shown = self.conversations.call(Conversations.show, conversation_id)
        return list(shown["messages"])

    def close(self) -> None:
        self.sub.close()
        self.daemon.stop()
        self.server.stop()


class ChatDaemon:
    """A daemon on a fresh home in /tmp with the scripted model on loopback and chat on an
    ephemeral port; ``addresses`` are the chat bridge's, ``token`` the first (owner) token.

    ``extra_toml`` is appended to the configuration; :meth:`script` gives the model its next
    script; :meth:`close` stops the daemon and the model and removes the home.
    """

    def __init__(self, extra_toml: str = "", *, prefix: str = "chd-") -> None:
        self.server = FakeModelServer(load_script("{}")).start()
        self.home = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        self.daemon: DaemonThread | None = None
        try:
            text = config_toml(self.server) + "[chat]\nport = 0\n" + extra_toml
            (self.home / "config.toml").write_text(text)
            self.daemon = DaemonThread(Config.load(self.home))
            self.rt = self.daemon.rt
            self.addresses: dict[str, Any] = self.daemon.chat().call(ChatBridge.addresses)
            self.token = (self.home / FIRST_TOKEN_FILE).read_text().strip()
        except BaseException:
            self.close()
            raise

    def script(self, script: dict[str, Any]) -> None:
        self.server.app.player = Player(load_script(json.dumps(script)))
        self.server.app.requests.clear()

    def close(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        self.server.stop()
        shutil.rmtree(self.home, ignore_errors=True)


def assert_valid_history(messages: list[Any]) -> None:
    """Every tool call is answered by exactly one tool result before the next user message."""
    open_calls: set[str] = set()
    for m in messages:
        if m.role == "assistant":
            assert not open_calls, f"a new assistant step with calls still open: {open_calls}"
            open_calls = {c.id for c in m.tool_calls}
        elif m.role == "tool":
            assert m.call_id in open_calls, f"a result for an unknown call {m.call_id}"
            open_calls.discard(m.call_id)
        elif m.role == "user":
            assert not open_calls, f"a user message while calls are open: {open_calls}"
    assert not open_calls, f"calls left without a result: {open_calls}"

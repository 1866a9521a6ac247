"""The fixture MCP server in a subprocess, and a real runtime slice (loop, connections, policy,
dispatcher) over it: shared by the MCP tests and the MCP benchmark."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pykka

from actors.calls.dispatcher import DispatcherActor, submit
from actors.child_ref import ChildRef
from actors.directory import Directory
from actors.gate.policy import PolicyActor
from actors.loop import EventLoopThread
from actors.mcp.connections import McpConnections, McpHandle
from actors.mcp.deps import McpDeps, SideWork, preload
from chalie.calls.registry import Registry
from chalie.mcp.admin import McpAdmin
from chalie.mcp.spec import ServerSpec
from chalie.process.config import Config, McpConfig
from chalie.services import Services
from chalie.wire.bus import EventBus
from chalie.wire.messages import ToolCall, ToolOutcome, TurnContext
from tools.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


FAST = McpConfig(
    heartbeat_interval=1.0,
    probe_timeout=1.0,
    connect_timeout=15.0,
    list_timeout=10.0,
    call_timeout=10.0,
    backoff_base=0.2,
    backoff_cap=1.0,
    start_delay=0.0,
)


class FixtureServer:
    """tools/fixture_mcp/server.py in a subprocess; HTTP/SSE report their port on stdout."""

    def __init__(self, *args: str, transport: str = "http", port: int = 0) -> None:
        self.transport = transport
        self.args = args
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.start()

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "tools.fixture_mcp.server",
            "--transport",
            self.transport,
            "--port",
            str(self.port),
            *self.args,
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("PORT "), line
        self.port = int(line.split()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{'sse' if self.transport == 'sse' else 'mcp'}"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def restart(self) -> None:
        self.kill()
        deadline = time.monotonic() + 10
        while True:
            try:
                self.start()
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def stdio_spec(name: str, *args: str, **kw: Any) -> ServerSpec:
    return ServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=("-m", "tools.fixture_mcp.server", "--transport", "stdio", *args),
        cwd=str(ROOT),
        **kw,
    )


def ctx(turn: str = "t1", channel: str = "chat") -> TurnContext:
    return TurnContext(
        conversation_id="conv",
        turn_id=turn,
        channel=channel,  # type: ignore[arg-type]
        scope="unrestricted",
    )


class Rig:
    """A home directory with the MCP slice of the daemon running on it."""

    def __init__(
        self,
        home: Path,
        *,
        config: McpConfig = FAST,
        discovery: Any = None,
        dispatcher: bool = True,
    ) -> None:
        self.home = home
        self.db = home / "chalie.db"
        self.registry = Registry()
        self.loop = EventLoopThread()
        self.loop.start()
        self.bus = EventBus()
        self.policy = PolicyActor.start(self.db, self.bus, approval_expiry=30)
        self.policy.proxy().list().get(timeout=10)  # its store exists before ours opens
        self.admin = McpAdmin(self.db, home)
        self.directory = Directory()
        self.deps = McpDeps(
            db_path=self.db,
            home=home,
            config=config,
            loop=self.loop,
            registry=self.registry,
            discovery=discovery,
            policy=ChildRef.to(self.policy, "policy"),
            side=SideWork(),
            errlog_dir=home / "logs",
        )
        self.handle = McpHandle(self.directory, self.deps.routes, self.loop, self.bus)
        self.mcp: pykka.ActorRef[Any] | None = None
        self.dispatcher: pykka.ActorRef[Any] | None = None
        if dispatcher:
            self.dispatcher = DispatcherActor.start(
                self.registry,
                Services(),
                self.db,
                self.policy,
                None,
                self.bus,
                parts={"mcp": self.handle},
            )

    def add(self, spec: ServerSpec) -> None:
        self.admin.add(spec)

    def start(self) -> None:
        preload(self.deps)
        self.mcp = McpConnections.start(self.deps, directory=self.directory)

    def reload(self) -> dict[str, Any]:
        assert self.mcp is not None
        found: dict[str, Any] = self.mcp.proxy().reload().get(timeout=30)
        return found

    def status(self, name: str) -> str:
        row = self.admin.store.server(name)
        return row.status if row is not None else "missing"

    def wait_online(self, name: str, timeout: float = 20.0) -> None:
        wait_until(lambda: self.status(name) == "online", timeout, f"{name} online")

    def wait_tools(self, name: str, count: int, timeout: float = 20.0) -> None:
        prefix = f"_mcp_{name}_"
        wait_until(
            lambda: (
                sum(1 for e in self.registry if e.name.startswith(prefix) and e.cls.discoverable)
                >= count
            ),
            timeout,
            f"{name} has {count} tools",
        )

    def allow(self, permission: str) -> None:
        for channel in ("chat", "subconscious", "external_agent"):
            self.policy.proxy().set(channel, permission, "allow").get(timeout=5)

    def call(
        self,
        tool: str,
        args: dict[str, Any] | None = None,
        *,
        call_id: str = "c1",
        context: TurnContext | None = None,
    ) -> Future[ToolOutcome]:
        assert self.dispatcher is not None
        arguments = {"act_summary": "a test call", **(args or {})}
        return submit(
            self.dispatcher,
            ToolCall(call_id=call_id, tool=tool, arguments=arguments, context=context or ctx()),
        )

    def run(self, tool: str, args: dict[str, Any] | None = None, **kw: Any) -> ToolOutcome:
        return self.call(tool, args, **kw).result(30)

    def close(self) -> None:
        for ref in (self.dispatcher, self.mcp, self.policy):
            if ref is not None:
                try:
                    ref.stop(timeout=30)
                except pykka.ActorDeadError:
                    pass
        self.deps.side.close()
        asks = self.deps.asks
        if asks is not None and hasattr(asks, "aclose"):
            self.loop.submit(asks.aclose()).result(10)
            asks.close()  # type: ignore[attr-defined]
        self.admin.close()
        self.loop.stop()


def capable_config(model: Any, home: Path, fixture: str = "capable") -> Config:
    """A home whose daemon connects at once to a fixture MCP server (``cap``, over stdio;
    ``fixture`` names its module in tools/fixture_mcp), with chat on an ephemeral port and
    no examples written (the script is the turn's alone). ``model``: a started
    tools.fake_llm.FakeModelServer."""
    from tools.conversation_harness import config_toml

    (home / "config.toml").write_text(
        config_toml(model)
        + "[chat]\nport = 0\n[mcp]\nstart_delay = 0\n"
        + "[discovery]\nwrite_examples = false\n"
    )
    config = Config.load(home)
    admin = McpAdmin(config.layout.db, home)
    admin.add(
        ServerSpec(
            name="cap",
            transport="stdio",
            command=sys.executable,
            args=("-m", f"tools.fixture_mcp.{fixture}"),
            cwd=str(ROOT),
        )
    )
    admin.close()
    return config

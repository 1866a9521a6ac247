"""The inbound MCP server as one ASGI app on one uvicorn server: build, bind, serve, stop.

Lifecycle (:class:`McpHttpServer`), every step on the event loop it is given:

1. :meth:`bind` opens the listening socket first, so a port in use is one
   :class:`PortInUse` before anything else starts; a bind beyond loopback
   needs ``allow_remote`` and is logged as a warning.
2. :meth:`start` builds the app (gate → MCP Streamable HTTP app with the
   DNS-rebinding guard for exactly the bound host and port), starts uvicorn
   on the bound socket and returns once it accepts connections.
3. :attr:`done` completes when uvicorn stops; an unexpected stop is the
   owner's cue to fail (and be restarted by its supervisor).
4. :meth:`stop` asks uvicorn to exit and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.subscriptions import ToolsListChanged
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ServerCapabilities, ToolsCapability
from starlette.applications import Starlette
from starlette.routing import Mount

import chalie
from chalie.mcp_server.gate import CALLER_KEY, Caller, Gate, TokenVerifier
from chalie.mcp_server.gateway import Gateway, announce
from chalie.mcp_server.limits import TokenLimits
from chalie.mcp_server.talk import TalkToChalie
from chalie.mcp_server.validation import TOOL_NAME, input_schema
from chalie.net.admission import Admission, connection_cap, guarded_protocol
from chalie.net.asgi_server import Server
from chalie.net.listener import tcp_listener
from chalie.net.loopback import host_names, is_loopback
from chalie.process import telemetry
from chalie.process.config import McpServerConfig

log = logging.getLogger("chalie.mcp_server")

PATH: Final = "/mcp"
# What the MCPServer would answer that Chalie does not serve (an empty list is not a feature):
# dropped, so a client gets "method not found" and the capabilities say only what is served.
UNSERVED: Final = (
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
)
INSTRUCTIONS: Final = (
    "Chalie is a personal executive assistant with its own tools. Call talk_to_chalie with "
    "a task in natural language; Chalie answers with what it did and found. It will not take "
    "actions that need its user's approval on an agent's behalf, and says so when it cannot."
)
DESCRIPTION: Final = (
    "Hand Chalie a task or question in natural language and get its answer. Chalie uses its "
    "own tools and context; actions that need its user's approval are not taken (the answer "
    "says what it could not do and why). Pass conversation_id from an earlier answer to "
    "continue that exchange; set loop_in_human when the user should see the exchange."
)


class PortInUse(RuntimeError):
    """The configured address is taken; the message is the one line the operator sees."""


class RemoteBindRefused(RuntimeError):
    """A non-loopback host without ``allow_remote``."""


def bind(config: McpServerConfig) -> socket.socket:
    """The listening socket for ``config``; PortInUse / RemoteBindRefused with one clear line."""
    host = config.host
    if not is_loopback(host):
        if not config.allow_remote:
            raise RemoteBindRefused(
                f"[mcp_server] host {host!r} is not loopback; set allow_remote = true to bind it"
            )
        log.warning(
            "the MCP server binds beyond loopback (%s:%d): any host that reaches it may try tokens",
            host,
            config.port,
        )
    try:
        return tcp_listener(host, config.port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"MCP server not started: {host}:{config.port} is already in use "
                "(another Chalie, or set [mcp_server] port)"
            ) from None
        raise PortInUse(
            f"MCP server not started: cannot bind {host}:{config.port}: {exc.strerror}"
        ) from None


def security(config: McpServerConfig, port: int) -> TransportSecuritySettings:
    """The DNS-rebinding guard for exactly this port (and any configured extra names)."""
    names = host_names(config.host)
    hosts = [f"{n}:{port}" for n in names] + list(config.allowed_hosts)
    origins = [f"http://{n}:{port}" for n in names] + list(config.allowed_origins)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


def url_of(host: str, port: int) -> str:
    """The MCP endpoint's URL for a bound host and port."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}{PATH}"


def talk_tool(talk: TalkToChalie) -> Tool:
    """talk_to_chalie with its published schema; the body checks every field itself."""
    tool = Tool.from_function(
        talk.__call__, name=TOOL_NAME, title="Talk to Chalie", description=DESCRIPTION
    )
    tool.parameters = input_schema()
    return tool


def caller_of(ctx: ServerRequestContext[Any]) -> Caller | None:
    """The caller the gate admitted this request as (None: not through the gate)."""
    scope = getattr(ctx.request, "scope", None)
    if not isinstance(scope, dict):
        return None
    found = scope.get("state", {}).get(CALLER_KEY)
    return found if isinstance(found, Caller) else None


class ChalieServer(MCPServer):
    """MCPServer whose tools/list and tools/call follow the caller: talk_to_chalie for all,
    the gateway's tools only for a token that may use them."""

    def __init__(self, gateway: Gateway, **kwargs: Any) -> None:
        self.gateway = gateway
        super().__init__(**kwargs)
        # The SDK opens an OpenTelemetry span per message, continuing the caller's
        # _meta.traceparent: kept when Chalie exports traces (chalie.process.telemetry). Otherwise
        # dropped (the SDK's documented opt-out): the span cost ~3 % of the daemon's CPU
        # under load, and the trail and conversation records are the audit.
        if not telemetry.enabled():
            self.middleware[:] = [
                m for m in self.middleware if type(m).__name__ != "OpenTelemetryMiddleware"
            ]
        low = self._lowlevel_server
        for method in UNSERVED:
            low._request_handlers.pop(method, None)
        setattr(low, "get_capabilities", self.capabilities)  # noqa: B010 (the SDK's one seam)

    def capabilities(self, *_args: Any, **_kwargs: Any) -> ServerCapabilities:
        """What is served, the same in both protocol generations: tools, whose list changes
        only in gateway mode (announced on the session and on ``subscriptions/listen``)."""
        return ServerCapabilities(tools=ToolsCapability(list_changed=self.gateway.enabled))

    async def _handle_list_tools(self, ctx: Any, params: Any) -> Any:
        listed = await super()._handle_list_tools(ctx, params)
        extra = self.gateway.tools(caller_of(ctx))
        if extra:
            listed.tools = [*listed.tools, *extra]
        return listed

    async def _handle_call_tool(self, ctx: Any, params: Any) -> Any:
        if params.name == TOOL_NAME:
            return await super()._handle_call_tool(ctx, params)
        # Absent arguments are none; anything else goes to the dispatcher, which checks it.
        arguments = {} if params.arguments is None else params.arguments
        bus = self._subscriptions
        session = getattr(ctx, "session", None)

        async def publish() -> None:
            await bus.publish(ToolsListChanged())

        return await self.gateway.call(
            caller_of(ctx), params.name, arguments, lambda: announce(session, publish)
        )


def build_app(
    config: McpServerConfig,
    port: int,
    talk: TalkToChalie,
    verifier: Callable[[], TokenVerifier],
    gateway: Gateway | None = None,
) -> tuple[Starlette, Gate, MCPServer]:
    server = ChalieServer(
        gateway or Gateway(False, None),
        name="chalie",
        version=chalie.__version__,
        instructions=INSTRUCTIONS,
        tools=[talk_tool(talk)],
    )
    mcp_app = server.streamable_http_app(
        streamable_http_path=PATH,
        max_request_body_size=config.max_body_bytes,
        session_idle_timeout=config.session_idle_timeout,
        max_sessions=config.max_sessions,
        transport_security=security(config, port),
        host=config.host,
    )
    limits = TokenLimits(
        requests_per_minute=config.requests_per_minute,
        max_concurrent_turns=config.max_concurrent_turns,
    )
    gate = Gate(
        mcp_app,
        verifier,
        limits,
        max_body_bytes=config.max_body_bytes,
        max_sessions=config.max_sessions,
        resource=url_of(config.host, port),
        max_sessions_per_token=config.max_sessions_per_token,
        session_idle_timeout=config.session_idle_timeout,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        # A mounted app's own lifespan does not run: the session manager runs here.
        async with server.session_manager.run():
            yield

    app = Starlette(routes=[Mount("/", app=gate)], lifespan=lifespan)
    return app, gate, server


class McpHttpServer:
    """One uvicorn server for the inbound MCP app, run as a task on the given loop."""

    def __init__(
        self,
        config: McpServerConfig,
        talk: TalkToChalie,
        verifier: Callable[[], TokenVerifier],
        gateway: Gateway | None = None,
    ) -> None:
        self.config = config
        self.talk = talk
        self.gateway = gateway or Gateway(False, None)
        self._verifier = verifier
        self.port = 0
        self.gate: Gate | None = None
        self.done: asyncio.Future[Any] | None = None
        self._uvicorn: Server | None = None
        self._sock: socket.socket | None = None
        self._stopping = False
        self.admission: Admission | None = None

    @property
    def url(self) -> str:
        return url_of(self.config.host, self.port)

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def start(self) -> str:
        sock = bind(self.config)
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        app, self.gate, _ = build_app(
            self.config, self.port, self.talk, self._verifier, self.gateway
        )
        self.admission = Admission(
            "mcp", connection_cap(self.config.max_connections), self.config.request_timeout
        )
        cfg = uvicorn.Config(
            app,
            http=guarded_protocol(self.admission),
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
            # The gate enforces the body limit; uvicorn keeps its own sane defaults.
            limit_concurrency=None,
            server_header=False,
        )
        # Off the main thread uvicorn installs no signal handlers: the daemon keeps its own.
        server = Server(cfg)
        self._uvicorn = server
        loop = asyncio.get_running_loop()
        self.done = loop.create_task(server.serve(sockets=[sock]), name="mcp-server")
        while not server.started:
            if self.done.done():
                sock.close()
                exc = self.done.exception()
                raise RuntimeError(f"the MCP server stopped while starting: {exc!r}")
            await asyncio.sleep(0.005)
        return self.url

    async def stop(self) -> None:
        self._stopping = True
        server, done = self._uvicorn, self.done
        if server is None or done is None:
            return
        server.exit()
        if not done.done():
            try:
                await asyncio.wait_for(asyncio.shield(done), 5.0)
            except (TimeoutError, Exception):
                server.force_exit = True
                done.cancel()
                with contextlib.suppress(BaseException):
                    await done
        # A uvicorn task that died (or was cancelled) never closed its listeners.
        for listener in getattr(server, "servers", ()):
            listener.close()
            with contextlib.suppress(Exception):
                await listener.wait_closed()
        if self._sock is not None:
            self._sock.close()
        self.talk.close()

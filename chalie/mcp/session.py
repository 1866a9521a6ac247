"""One persistent MCP session to one server, held by one owner task on the event loop.

Lifecycle (every method runs on the daemon's loop; other threads submit them
with ``run_coroutine_threadsafe``):

1. :meth:`McpSession.open` starts the owner task, which enters the transport and
   ``mcp.Client`` (``mode="auto"``: 2026-07-28 with mcp 2.3 peers, the
   2025-11-25 handshake with older ones; ``legacy`` when the connection says
   so) and then waits for the stop event;
   anyio needs the enter and the exit in that same task. ``open`` returns the
   negotiated :class:`SessionInfo` or raises :class:`ConnectFailure` (``auth``
   for HTTP 401/403, ``config`` for a missing command, else ``unreachable``),
   bounded by its own timeout (a server that prints junk on stdout, or
   accepts and never answers, only ever meets that timeout).
2. Calls (:meth:`call`, :meth:`list_tools`, :meth:`probe`) run in their own
   tasks, never in the owner task. ``probe`` is the heartbeat: ``ping`` on a
   handshake-era session, ``server/discover`` on 2026-07-28 (which has no
   ping), each under a timeout.
3. ``tools/list_changed`` and ``prompts/list_changed`` reach ``on_change`` (and
   ``resources/list_changed``: a server's first resources bring its proxy):
   through the message handler on a handshake-era session, through a
   ``subscriptions/listen`` stream (its own task) on 2026-07-28.
   ``resources/updated`` for a resource this link read drops what it read
   (the next read asks the server again): on a handshake-era session the
   link subscribed with ``resources/subscribe`` when it read the resource; on
   2026-07-28 the listen stream is reopened with the URI in its filter.
4. If the owner's ``async with`` ends by itself (an HTTP server died), it
   reports ``on_lost(reason)``. Some losses never end it (a killed stdio child
   or SSE server answer every request with "Connection closed"): the
   heartbeat finds those.
5. :meth:`close` sets the stop event and waits for the owner (a stdio child
   gets stdin closed, then SIGTERM, then SIGKILL), cancelling it past a bound.

Error text that leaves this module is scrubbed of every resolved secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Final, Literal, TextIO

import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation
from mcp_types import (
    INVALID_REQUEST,
    CallToolResult,
    CreateMessageRequestParams,
    CreateMessageResult,
    CreateTaskResult,
    ElicitRequestParams,
    ElicitResult,
    ErrorData,
    GetTaskResult,
    ListRootsResult,
    LoggingMessageNotificationParams,
    Root,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

import chalie
from chalie.mcp.client_tasks import ClientTasks, TaskClient
from chalie.mcp.oauth import LoginRequired
from chalie.mcp.peer import CURRENT, Asks, CallScope
from chalie.mcp.spec import ServerSpec
from chalie.mcp.stdio import bounded_stdio_client
from chalie.net.tls import tls_context
from chalie.process import telemetry
from chalie.process.logs import Throttle

# A listing changed: tools, prompts, or resources (a server with none gets no resources
# proxy until it has some).
_LIST_CHANGED: Final = frozenset(
    {
        "notifications/tools/list_changed",
        "notifications/prompts/list_changed",
        "notifications/resources/list_changed",
    }
)
log = logging.getLogger("chalie.mcp")
# The SDK's loggers that log what a peer sends (a junk line, a bad tool name, a broken
# message), each as often as the peer likes. ("client" is the SDK session's own name.)
PEER_DRIVEN_LOGGERS: Final = (
    "client",
    "mcp.client.client",
    "mcp.client.caching",
    "mcp.client.sse",
    "mcp.client.stdio",
    "mcp.client.streamable_http",
    "mcp.shared.dispatcher",
    "mcp.shared.jsonrpc_dispatcher",
    "mcp.shared.tool_name_validation",
)
# httpx2 logs every request at INFO with its full URL: one line per heartbeat per server, and
# a URL may carry a credential in its query. Only its warnings reach our log.
logging.getLogger("httpx2").setLevel(logging.WARNING)
# The SDK's client debug lines carry the endpoint URL and every message: never below INFO.
# A server decides how often the SDK logs (an error with a traceback per junk line on a
# stdio server's stdout): one line each, and a bounded number a minute.
logging.getLogger("mcp.client").setLevel(logging.INFO)
for _name in PEER_DRIVEN_LOGGERS:  # a logger's filters do not apply to its children
    logging.getLogger(_name).addFilter(Throttle())

MAX_PAGES: Final = 200
MAX_TOOLS: Final = 5000  # per server: a hostile list must not flood the index
# A task's polling interval: the server's suggestion, within these bounds (seconds).
TASK_POLL_MIN: Final = 0.05
TASK_POLL_MAX: Final = 10.0
TASK_POLL_DEFAULT: Final = 1.0
MAX_LISTED: Final = 1000  # resources, templates or prompts a listing keeps
MAX_READS: Final = 256  # resources a link keeps what it read of (a subscription each)
CLOSE_GRACE: Final = 6.0
MAX_LOG_LINE: Final = 1000
LOG_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "notice": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "alert": logging.CRITICAL,
    "emergency": logging.CRITICAL,
}
# A server's notifications/message lines: one logger, throttled like the SDK's junk lines.
server_log = logging.getLogger("chalie.mcp.server_log")
server_log.addFilter(Throttle())
FailureKind = Literal["auth", "unreachable", "config"]


class ConnectFailure(Exception):
    """Connecting failed; ``kind`` says how, ``message`` is safe to show and store."""

    def __init__(self, kind: FailureKind, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status


class NotConnected(Exception):
    """A call reached a link whose session is not open."""


@dataclass(frozen=True)
class SessionInfo:
    protocol: str
    server_name: str
    server_version: str


def leaves(exc: BaseException) -> list[BaseException]:
    """The innermost exceptions of a (nested) exception group."""
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for inner in exc.exceptions:
            out.extend(leaves(inner))
        return out
    return [exc]


def task_support(tools: list[Any]) -> dict[str, str]:
    """Which listed tools run as tasks: name -> "optional" or "required"."""
    out = {}
    for tool in tools:
        execution = getattr(tool, "execution", None)
        support = getattr(execution, "task_support", None)
        if support in ("optional", "required"):
            out[str(tool.name)] = str(support)
    return out


def describe(exc: BaseException) -> str:
    """One line naming the first meaningful leaf of an exception (group)."""
    found = leaves(exc)
    for leaf in found:
        if not isinstance(leaf, asyncio.CancelledError):
            text = str(leaf).strip() or type(leaf).__name__
            if isinstance(leaf, MCPError):
                return f"{leaf.error.message} (error {leaf.error.code})"
            if isinstance(leaf, httpx2.ConnectError):
                return f"cannot connect ({text})"
            if isinstance(leaf, TimeoutError):
                return "timed out"
            return f"{type(leaf).__name__}: {text}"
    return "cancelled"


class TooLarge(httpx2.StreamError):
    """A JSON answer past max_result_bytes (the SDK ends its request with PARSE_ERROR)."""


class _BoundedBody(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self._inner, self._limit = inner, limit

    async def __aiter__(self) -> Any:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise TooLarge(f"the answer is larger than {self._limit} bytes; refused")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedTransport(httpx2.AsyncBaseTransport):
    """An HTTP server's JSON answers are read up to ``limit`` bytes, never more (SSE events
    have the SDK's own per-event limit); a bigger one fails its request at once."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int) -> None:
        self._inner, self._limit = inner, limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        kind = response.headers.get("content-type", "")
        if not kind.startswith("application/json"):
            return response
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_BoundedBody(stream, self._limit),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class McpSession:
    """One server's session; see the module doc for its lifecycle."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        on_change: Callable[[], None] = lambda: None,
        on_lost: Callable[[str], None] = lambda reason: None,
        errlog: TextIO | None = None,
        read_timeout: float = 60.0,
        asks: Asks | None = None,
        auth: httpx2.Auth | None = None,
        hidden: tuple[str, ...] = (),
        max_message: int = 8 * 1024 * 1024,
    ) -> None:
        """``auth``: an OAuth server's provider (chalie.mcp.oauth); ``hidden``: more values
        (its tokens) error text must never show; ``max_message``: the largest message a
        stdio server may send (chalie.mcp.stdio), and the largest result any server may."""
        self.max_message = max_message
        self._spec = spec  # resolved: never log it
        self._auth = auth
        self.needs_login = False
        self._path = httpx2.URL(spec.url).path if spec.url else ""
        self._asks = asks
        self.roots: tuple[str, ...] = spec.roots
        self._inflight: dict[int, CallScope] = {}
        self._next_call = 0
        self._on_change = on_change
        self._on_lost = on_lost
        self._errlog = errlog
        self._read_timeout = read_timeout
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        # The legacy SSE transport, for an http spec whose Streamable HTTP attempt failed
        # (spec.sse_fallback: an imported URL that named no type).
        self.over_sse = spec.transport == "sse"
        self._stop: asyncio.Event | None = None
        # uri -> what the server answered when it was last read; dropped on resources/updated
        self._read: dict[str, Any] = {}
        self._subscribed: set[str] = set()
        self.updates = 0  # resources/updated notifications seen (for status and tests)
        self.prompts: dict[str, Any] = {}  # name -> Prompt, as last listed
        # tool -> its execution.taskSupport ("optional", "required"), as last listed
        self.task_support: dict[str, str] = {}
        self.task_lifetime = 3600.0  # seconds a task may run (the [mcp] task_timeout)
        self.auth_status: int | None = None
        self._reported_lost = False
        self._devnull: TextIO | None = None
        # made here (an actor's thread), never on the event loop
        self._tls: ssl.SSLContext | bool = tls_context() if spec.transport != "stdio" else True
        self.info: SessionInfo | None = None
        self._secrets = sorted(
            {
                v
                for v in (*spec.headers.values(), *spec.env.values(), spec.url, *hidden)
                if len(v) >= 4
            },
            key=len,
            reverse=True,
        )

    # -- safety ------------------------------------------------------------------
    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "***")
        return text[:500]

    async def _on_response(self, response: httpx2.Response) -> None:
        if self.needs_login:
            return  # only a new link (after chalie mcp login) clears it
        if response.status_code in (401, 403):
            self.auth_status = response.status_code
        elif response.status_code < 300 and response.request.url.path == self._path:
            self.auth_status = None  # the MCP endpoint itself (not an OAuth metadata fetch)

    def login_required(self) -> None:
        """The OAuth grant needs the owner (the provider found no way on by itself)."""
        self.needs_login = True
        self.auth_status = 401

    async def _on_message(self, message: Any) -> None:
        method = getattr(message, "method", None)
        if isinstance(method, str) and method.startswith("notifications/"):
            self._note(f"notification {method[:80]}")
        if method in _LIST_CHANGED:
            self._on_change()
        elif method == "notifications/resources/updated":
            uri = getattr(getattr(message, "params", None), "uri", None)
            if uri is not None:
                self._updated(str(uri))

    def _updated(self, uri: str) -> None:
        """A resource changed on the server: what was read of it is stale."""
        self.updates += 1
        self._read.pop(uri, None)

    # -- what the server asks of us (on the loop) ----------------------------------------
    def scope(self) -> CallScope | None:
        """The call a server's request belongs to: the current task's, else the only one."""
        found = CURRENT.get()
        if found is not None:
            return found
        if len(self._inflight) == 1:
            return next(iter(self._inflight.values()))
        return None

    async def _list_roots(self, context: Any) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=uri) for uri in self.roots])  # type: ignore[arg-type]

    async def _sample(
        self, context: Any, params: CreateMessageRequestParams
    ) -> CreateMessageResult | ErrorData:
        if self._asks is None:
            return ErrorData(code=INVALID_REQUEST, message="sampling is not available")
        return await self._asks.sample(
            self._spec.name, self.scope(), params, self._spec.sampling_tokens
        )

    async def _elicit(self, context: Any, params: ElicitRequestParams) -> ElicitResult | ErrorData:
        if self._asks is None:
            return ElicitResult(action="decline")
        return await self._asks.elicit(self._spec.name, self.scope(), params)

    def _note(self, text: str) -> None:
        """One line in the server's log (what the Brain shows beside its log lines)."""
        if self._errlog is not None:
            with contextlib.suppress(Exception):
                self._errlog.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")
                self._errlog.flush()

    async def _log(self, params: LoggingMessageNotificationParams) -> None:
        """A server's log message, into its log: one line, scrubbed, throttled."""
        level = LOG_LEVELS.get(str(params.level), logging.INFO)
        data = params.data if isinstance(params.data, str) else repr(params.data)
        text = " ".join(self.scrub(str(data)[: MAX_LOG_LINE * 2]).split())[:MAX_LOG_LINE]
        origin = f" [{str(params.logger)[:60]}]" if params.logger else ""
        server_log.log(level, "mcp server %s%s: %s", self._spec.name, origin, text)
        self._note(f"{params.level}{origin} {text}")

    async def set_roots(self, roots: tuple[str, ...]) -> None:
        """New roots; the server hears roots/list_changed (handshake protocols; 2026-07-28 has
        no client notifications: the server asks again on its next call)."""
        self.roots = roots
        client = self._client
        if client is not None and client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                await client.send_roots_list_changed()

    # -- the owner task -------------------------------------------------------------
    def _transport(self, stack_http: list[httpx2.AsyncClient]) -> Any:
        spec = self._spec
        hooks: dict[str, list[Callable[..., Any]]] = {"response": [self._on_response]}
        if spec.transport == "stdio":
            params = StdioServerParameters(
                command=spec.command,
                args=list(spec.args),
                env=dict(spec.env) or None,
                cwd=spec.cwd or None,
            )
            return bounded_stdio_client(params, self._errlog or self._stderr(), self.max_message)
        if spec.transport == "http" and not self.over_sse:
            http = httpx2.AsyncClient(
                verify=self._tls,
                headers=dict(spec.headers),
                timeout=httpx2.Timeout(30.0, read=300.0),
                event_hooks=hooks,
                auth=self._auth,
                transport=BoundedTransport(
                    httpx2.AsyncHTTPTransport(verify=self._tls), self.max_message
                ),
            )
            stack_http.append(http)
            # An SSE event past the limit fails its call at once (results.remote_error).
            return streamable_http_client(
                spec.url, http_client=http, max_sse_event_size=self.max_message
            )

        def factory(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            return httpx2.AsyncClient(
                verify=self._tls,
                headers=headers,
                timeout=timeout or httpx2.Timeout(30.0, read=300.0),
                auth=auth,
                event_hooks=hooks,
            )

        return sse_client(spec.url, headers=dict(spec.headers), httpx_client_factory=factory)

    def _stderr(self) -> TextIO:
        """Our stderr for a stdio child, or /dev/null when it has no file descriptor."""
        try:
            sys.stderr.fileno()
            return sys.stderr
        except (AttributeError, OSError, ValueError):
            if self._devnull is None:
                self._devnull = open(os.devnull, "w")
            return self._devnull

    def _failure(self, exc: BaseException) -> ConnectFailure:
        if self.needs_login or any(isinstance(leaf, LoginRequired) for leaf in leaves(exc)):
            self.login_required()
            self.auth_status = 401
            return ConnectFailure(
                "auth", f"needs login: run chalie mcp login {self._spec.name}", 401
            )
        if self.auth_status is not None:
            return ConnectFailure(
                "auth",
                f"the server refused our credentials (HTTP {self.auth_status})",
                self.auth_status,
            )
        for leaf in leaves(exc):
            if isinstance(leaf, FileNotFoundError):
                return ConnectFailure(
                    "config", self.scrub(f"command not found: {self._spec.command}")
                )
            if isinstance(leaf, PermissionError):
                return ConnectFailure("config", self.scrub(f"cannot run {self._spec.command}"))
        return ConnectFailure("unreachable", self.scrub(describe(exc)))

    async def _own(self, ready: asyncio.Future[SessionInfo], stop: asyncio.Event) -> None:
        opened = False
        try:
            async with AsyncExitStack() as stack:
                http: list[httpx2.AsyncClient] = []
                transport = self._transport(http)
                for client in http:
                    await stack.enter_async_context(client)
                session = TaskClient(
                    transport,
                    mode=self._spec.protocol,
                    read_timeout_seconds=self._read_timeout,
                    message_handler=self._on_message,
                    cache=None,
                    client_info=Implementation(name="chalie", version=chalie.__version__),
                    list_roots_callback=self._list_roots,
                    sampling_callback=self._sample,
                    elicitation_callback=self._elicit,
                    logging_callback=self._log,
                    log_level="info",
                    # a server's sampling and elicitation may also come as tasks
                    client_tasks=ClientTasks(),
                )
                client_ = await stack.enter_async_context(session)
                self._client = client_
                info = client_.server_info
                self.info = SessionInfo(
                    protocol=str(client_.protocol_version),
                    server_name=str(getattr(info, "name", "") or ""),
                    server_version=str(getattr(info, "version", "") or ""),
                )
                if client_.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    self._listener = asyncio.create_task(self._listen(client_))
                if not ready.done():
                    ready.set_result(self.info)
                opened = True
                await stop.wait()
                self._client = None
                if self._listener is not None:
                    self._listener.cancel()
                    await asyncio.gather(self._listener, return_exceptions=True)
        except asyncio.CancelledError:
            if not ready.done():
                ready.set_exception(
                    ConnectFailure("unreachable", "the connection attempt was cancelled")
                )
            raise
        except BaseException as exc:
            failure = self._failure(exc)
            if not opened:
                if not ready.done():
                    ready.set_exception(failure)
            elif not stop.is_set():
                self._lost(failure.message)
        finally:
            self._client = None
            if not ready.done():
                ready.set_exception(ConnectFailure("unreachable", "the session ended at once"))
            elif opened and not stop.is_set():
                self._lost("the session ended")

    def _lost(self, reason: str) -> None:
        if not self._reported_lost:
            self._reported_lost = True
            self._on_lost(reason)

    async def _listen(self, client: Client, ready: asyncio.Event | None = None) -> None:
        uris = sorted(self._subscribed)
        caps = self.capabilities()
        try:
            async with client.listen(
                tools_list_changed=True,
                prompts_list_changed=caps.get("prompts", False),
                resource_subscriptions=uris,
            ) as sub:
                if ready is not None:
                    ready.set()
                async for event in sub:
                    uri = getattr(event, "uri", None)
                    if uri is not None:
                        self._updated(str(uri))
                    else:
                        self._on_change()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info(
                "%s: no tools/list_changed stream (%s)", self._spec.name, self.scrub(describe(exc))
            )
        finally:
            if ready is not None:
                ready.set()

    # -- the public surface (on the loop) ---------------------------------------------
    async def open(self, timeout: float) -> SessionInfo:
        """Connect; SessionInfo, or ConnectFailure within ``timeout`` seconds."""
        if self._owner is not None:
            raise RuntimeError("a McpSession opens once; make a new one to reconnect")
        if not (self._spec.sse_fallback and self._spec.transport == "http"):
            return await self._attempt(timeout)
        # As the clients these entries are copied from do: Streamable HTTP first, then
        # the legacy SSE transport (an SSE endpoint refuses the POST at once: 404/405).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            return await self._attempt(timeout / 2)
        except ConnectFailure as first:
            if first.kind != "unreachable":
                raise
            log.info(
                "%s: no Streamable HTTP (%s); trying SSE", self._spec.name, first.message[:200]
            )
            self._owner = None
            self.over_sse = True
            try:
                return await self._attempt(max(0.1, deadline - loop.time()))
            except ConnectFailure as second:
                raise ConnectFailure(
                    second.kind,
                    f"Streamable HTTP: {first.message}; SSE: {second.message}",
                    second.status,
                ) from None

    async def _attempt(self, timeout: float) -> SessionInfo:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[SessionInfo] = loop.create_future()
        # After a timeout nobody awaits it any more: its late failure is retrieved here.
        ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._stop = asyncio.Event()
        self._owner = asyncio.create_task(
            self._own(ready, self._stop), name=f"mcp-{self._spec.name}"
        )
        try:
            return await asyncio.wait_for(asyncio.shield(ready), timeout)
        except TimeoutError:
            await self.close(grace=1.0)
            raise ConnectFailure("unreachable", f"no handshake within {timeout:g} s") from None
        except ConnectFailure:
            await self.close(grace=1.0)
            raise

    @property
    def connected(self) -> bool:
        return self._client is not None

    def _require(self) -> Client:
        client = self._client
        if client is None:
            raise NotConnected(f"{self._spec.name} is not connected")
        return client

    async def list_tools(self, timeout: float) -> list[Any]:
        """Every tool the server lists, page by page (a repeated cursor ends the walk)."""
        client = self._require()
        out: list[Any] = []
        cursor: str | None = None
        seen: set[str] = set()
        async with asyncio.timeout(timeout):
            for _ in range(MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                out.extend(page.tools)
                cursor = page.next_cursor
                if len(out) >= MAX_TOOLS:
                    log.warning(
                        "%s lists more than %d tools; the rest are ignored",
                        self._spec.name,
                        MAX_TOOLS,
                    )
                    del out[MAX_TOOLS:]
                    break
                if not cursor or cursor in seen:
                    break
                seen.add(cursor)
        self.task_support = task_support(out)
        return out

    async def probe(self, timeout: float) -> float:
        """The heartbeat: seconds one liveness round trip took; raises on failure or timeout."""
        client = self._require()
        started = time.monotonic()
        async with asyncio.timeout(timeout):
            if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                await client.session.send_discover(client.protocol_version)
            else:
                await client.session.send_ping()
        return time.monotonic() - started

    def capabilities(self) -> dict[str, bool]:
        """What the server offers besides tools: resources, subscriptions, prompts, tasks."""
        client = self._client
        if client is None:
            return {}
        try:
            caps = client.server_capabilities
        except Exception:
            return {}
        res = caps.resources
        return {
            "resources": res is not None,
            "subscribe": bool(res is not None and getattr(res, "subscribe", False)),
            "prompts": caps.prompts is not None,
            "tasks": caps.tasks is not None,
        }

    async def _pages(self, fetch: Callable[[str | None], Any], field: str) -> list[Any]:
        out: list[Any] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            page = await fetch(cursor)
            out.extend(getattr(page, field) or ())
            cursor = page.next_cursor
            if len(out) >= MAX_LISTED:
                del out[MAX_LISTED:]
                break
            if not cursor or cursor in seen:
                break
            seen.add(cursor)
        return out

    async def list_resources(self, timeout: float) -> tuple[list[Any], list[Any]]:
        """The server's resources and resource templates (each bounded)."""
        client = self._require()
        async with asyncio.timeout(timeout):
            resources = await self._pages(
                lambda c: client.list_resources(cursor=c, cache_mode="bypass"), "resources"
            )
            try:
                templates = await self._pages(
                    lambda c: client.list_resource_templates(cursor=c, cache_mode="bypass"),
                    "resource_templates",
                )
            except MCPError:
                templates = []  # a server with no templates may not know the method
        return resources, templates

    async def read_resource(self, uri: str, timeout: float) -> tuple[Any, bool]:
        """(the server's ReadResourceResult, whether it came from what was read before).

        A fresh read subscribes to the resource when the server allows it, so an update
        drops what was read; without subscriptions nothing is kept."""
        client = self._require()
        held = self._read.get(uri)
        if held is not None:
            return held, True
        caps = self.capabilities()
        async with asyncio.timeout(timeout):
            # subscribed before the read: an update between the two is not missed
            if caps.get("subscribe") and uri not in self._subscribed:
                if len(self._subscribed) < MAX_READS:
                    await self._subscribe(client, uri)
            result = await client.read_resource(uri, cache_mode="bypass")
        if uri in self._subscribed:
            self._read[uri] = result
        return result, False

    async def _subscribe(self, client: Client, uri: str) -> None:
        if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            self._subscribed.add(uri)
            old, ready = self._listener, asyncio.Event()
            self._listener = asyncio.create_task(self._listen(client, ready))
            if old is not None:
                old.cancel()
                await asyncio.gather(old, return_exceptions=True)
            await ready.wait()  # the new stream's filter holds the URI
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await client.subscribe_resource(uri)
        self._subscribed.add(uri)

    async def list_prompts(self, timeout: float) -> list[Any]:
        client = self._require()
        async with asyncio.timeout(timeout):
            listed = await self._pages(
                lambda c: client.list_prompts(cursor=c, cache_mode="bypass"), "prompts"
            )
        self.prompts = {str(p.name): p for p in listed}
        return listed

    async def get_prompt(self, name: str, arguments: dict[str, str], timeout: float) -> Any:
        client = self._require()
        async with asyncio.timeout(timeout):
            return await client.get_prompt(name, arguments)

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        timeout: float,
        scope: CallScope | None = None,
    ) -> Any:
        """One tools/call; the CallToolResult, or MCPError / NotConnected / a transport error.

        Every call carries a progress token (the SDK sends one with a progress callback);
        the server's progress, sampling and elicitation within it reach ``scope``."""
        client = self._require()
        scope = scope or CallScope(proxy=tool, call_id="")
        self._next_call += 1
        key = self._next_call
        self._inflight[key] = scope
        token = CURRENT.set(scope)
        sink = scope.on_progress

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            if sink is not None:
                shown = " ".join(self.scrub(message).split())[:300] if message else None
                sink(progress, total, shown)

        try:
            with telemetry.within_call(scope.call_id):  # the SDK's request span: its child
                support = self.task_support.get(tool)
                if support and client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                    return await self._call_task(client, tool, arguments, progress)
                return await client.call_tool(
                    tool, arguments, read_timeout_seconds=timeout, progress_callback=progress
                )
        finally:
            CURRENT.reset(token)
            self._inflight.pop(key, None)

    async def _call_task(
        self,
        client: Client,
        tool: str,
        arguments: dict[str, Any],
        progress: Callable[[float, float | None, str | None], Any],
    ) -> Any:
        """A task-augmented tools/call (2025-11-25): create, poll tasks/get at the server's
        interval, fetch tasks/result; a cancel or the task's lifetime sends tasks/cancel.

        The SDK has the task types but sends no task requests (and would refuse a
        CreateTaskResult as a tools/call result), so these go as raw requests."""
        send = client.session._dispatcher.send_raw_request
        lifetime = self.task_lifetime
        params = {"name": tool, "arguments": arguments, "task": {"ttl": int(lifetime * 1000)}}
        raw = await send("tools/call", params, {"timeout": self._read_timeout})
        task = CreateTaskResult.model_validate(raw).task
        task_id = task.task_id
        try:
            async with asyncio.timeout(lifetime):
                while task.status == "working":
                    interval = (task.poll_interval or TASK_POLL_DEFAULT * 1000) / 1000
                    await asyncio.sleep(min(TASK_POLL_MAX, max(TASK_POLL_MIN, interval)))
                    got = await send("tasks/get", {"taskId": task_id}, {"timeout": 30.0})
                    task = GetTaskResult.model_validate(got)
                    if task.status_message:
                        await progress(0.0, None, task.status_message)
                if task.status == "cancelled":
                    raise MCPError(-32000, f"the server cancelled task {task_id[:40]}")
                # completed, failed, or input_required (the server asks within tasks/result)
                out = await send("tasks/result", {"taskId": task_id}, {"timeout": lifetime})
                return CallToolResult.model_validate(out)
        except (asyncio.CancelledError, TimeoutError):
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(
                    asyncio.shield(send("tasks/cancel", {"taskId": task_id}, {"timeout": 5.0})),
                    5.0,
                )
            raise

    async def close(self, grace: float = CLOSE_GRACE) -> None:
        """End the session; the owner task gets ``grace`` seconds to leave cleanly."""
        if self._stop is not None:
            self._stop.set()
        owner = self._owner
        if owner is not None and not owner.done():
            done, _ = await asyncio.wait({owner}, timeout=grace)
            if not done:
                owner.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait({owner}, timeout=2.0)
        if self._devnull is not None:
            self._devnull.close()
            self._devnull = None

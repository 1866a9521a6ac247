"""The MCP executor: abilities with ``isolation = "mcp"`` (remote tool proxies) run over their
server's one persistent session.

``start`` reads the ConnectionView its server's McpConnectionActor last published
(:mod:`chalie.mcp.connection_view`): a proxy that cannot run (quarantined, gone, on a
disabled server, its server offline or refusing our credentials) is answered
at once with its own code; otherwise the call is submitted to the session on
the event loop with the job's timeout (a task created on the loop by one ``call_soon``, no
cross-thread future in between), and the mapped result reaches ``done`` from
the loop thread, exactly once. The call carries its :class:`CallScope`: the server's
progress becomes live ``tool_progress`` events on the call's conversation (the chat
client's tooltip, an inbound agent's own progress), and its sampling and elicitation
requests know whose turn they are in. A call that finds the connection broken asks
the actor to probe it now. ``cancel`` cancels the call's task, which the SDK
turns into an MCP ``notifications/cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any, Final

from actors.child_ref import ChildUnavailable
from actors.mcp.connections import McpHandle
from chalie.calls.execution import FAULTS, Done, Job
from chalie.mcp import results
from chalie.mcp.connection_view import outcome, refusal
from chalie.mcp.extras import RESOURCES, extra_name, kind_of, run_extra
from chalie.mcp.peer import CallScope, Progress
from chalie.mcp.proxy import McpProxy, is_proxy
from chalie.result import ToolResult
from chalie.wire.actor_messages import ProbeConnection
from chalie.wire.bus import EventBus
from chalie.wire.events import ToolProgress

log = logging.getLogger("chalie.calls.dispatch")


PROGRESS_PER_SECOND: Final = 20  # a call's progress events past this are dropped (a flood)


def progress_sink(bus: EventBus | None, job: Job) -> Progress | None:
    """Where a call's remote progress goes: a live ToolProgress on its conversation."""
    if bus is None:
        return None
    ctx = job.context
    window = [0.0, 0]  # the current second's start, events sent in it

    def sink(done: float, total: float | None, message: str | None) -> None:  # on the loop
        now = time.monotonic()
        if now - window[0] >= 1.0:
            window[0], window[1] = now, 0
        if window[1] >= PROGRESS_PER_SECOND and (total is None or done < total):
            return
        window[1] += 1
        bus.publish(
            ctx.conversation_id,
            ToolProgress(
                conversation_id=ctx.conversation_id,
                turn_id=ctx.turn_id,
                call_id=job.call_id,
                tool=job.tool,
                progress=float(done),
                total=float(total) if total is not None else None,
                message=message,
                ts=time.time(),
            ),
        )

    return sink


def follow_links(turns: Any, job: Job, server: str, rich: Any) -> None:
    """A result that links a resource of its server: that server's resources proxy becomes
    callable in the turn (the read is still gated by the server's policy)."""
    items = rich.get("items") if isinstance(rich, dict) else None
    if any(isinstance(i, dict) and i.get("type") == "resource_link" for i in items or ()):
        with contextlib.suppress(Exception):
            turns.inject(job.context.turn_id, [extra_name(server, RESOURCES)])


class McpExecutor:
    """Runs proxy calls on their servers' sessions; see the module docstring."""

    def __init__(self, handle: McpHandle | None) -> None:
        self._handle = handle
        self._lock = threading.Lock()
        # job id -> its task on the loop (None until the loop has created it)
        self._calls: dict[str, asyncio.Task[Any] | None] = {}

    def start(self, job: Job, done: Done) -> None:
        cls = job.entry.cls
        if not is_proxy(cls):
            done(FAULTS.no_executor(job.tool, "mcp"))
            return
        assert issubclass(cls, McpProxy)
        server, tool = cls.mcp_server, cls.mcp_tool
        if kind_of(cls):
            self._extra(job, done, server, kind_of(cls))
            return
        if cls.mcp_state == "quarantined":
            done(results.quarantined(server, tool, cls.mcp_changed))
            return
        if cls.mcp_state != "active":
            done(
                results.unknown_tool(
                    server, tool, "its server is disabled" if cls.mcp_state == "disabled" else ""
                )
            )
            return
        handle = self._handle
        if handle is None:
            done(results.unreachable(server, tool, "MCP connections are not running"))
            return
        route = handle.routes.get(server)
        refused = refusal(route, server, job.tool, tool)
        if refused is not None:
            done(refused)
            return
        assert route is not None and route.link is not None
        link, gen = route.link, route.gen
        job_id, params, timeout = job.job_id, dict(job.params), job.timeout
        scope = CallScope(
            proxy=job.tool,
            call_id=job.call_id,
            context=job.context,
            on_progress=progress_sink(handle.bus, job),
        )

        def finished(task: asyncio.Task[Any]) -> None:  # on the loop
            with self._lock:
                self._calls.pop(job_id, None)
            try:
                result, suspect = outcome(server, job.tool, tool, timeout, link, task)
            except Exception as exc:
                log.exception("mapping the result of %s failed", job.tool)
                result, suspect = FAULTS.executor_failed(job.tool, type(exc).__name__), False
            if result.rich and handle.turns is not None:
                follow_links(handle.turns, job, server, result.rich)
            done(result)
            if suspect:
                with contextlib.suppress(ChildUnavailable):
                    handle.connection(server).tell(ProbeConnection(gen))

        def begin() -> None:  # on the loop
            with self._lock:
                if job_id not in self._calls:
                    return  # cancelled before it began: the dispatcher already ended it
                task = asyncio.get_running_loop().create_task(
                    link.call(tool, params, timeout, scope)
                )
                self._calls[job_id] = task
            task.add_done_callback(finished)

        with self._lock:
            self._calls[job_id] = None
        try:
            handle.loop.call_soon(begin)
        except Exception as exc:
            with self._lock:
                self._calls.pop(job_id, None)
            log.exception("submitting %s to its MCP session failed", job.tool)
            done(FAULTS.executor_failed(job.tool, type(exc).__name__))

    def _extra(self, job: Job, done: Done, server: str, kind: str) -> None:
        """A server's resources or prompts proxy (chalie.mcp.extras) over its session."""
        handle = self._handle
        route = handle.routes.get(server) if handle is not None else None
        if handle is None or route is None or route.status != "online" or route.link is None:
            if route is not None and route.auth_status is not None:
                login = route.status == "needs-login"
                done(results.auth_failed(server, kind, route.auth_status, login=login))
            else:
                why = route.reason or route.status if route is not None else "not connected"
                done(results.unreachable(server, kind, why))
            return
        link, job_id, params = route.link, job.job_id, dict(job.params)

        def finished(task: asyncio.Task[Any]) -> None:  # on the loop
            with self._lock:
                self._calls.pop(job_id, None)
            if task.cancelled():
                done(
                    ToolResult.error(
                        "cancelled",
                        f"The call to {job.tool} was cancelled.",
                        hint="the call was cancelled; do not continue with its result.",
                    )
                )
                return
            error = task.exception()
            done(task.result() if error is None else FAULTS.executor_failed(job.tool, repr(error)))

        def begin() -> None:  # on the loop
            with self._lock:
                if job_id not in self._calls:
                    return
                task = asyncio.get_running_loop().create_task(
                    run_extra(link, server, kind, params, job.timeout)
                )
                self._calls[job_id] = task
            task.add_done_callback(finished)

        with self._lock:
            self._calls[job_id] = None
        handle.loop.call_soon(begin)

    def cancel(self, job_id: str) -> None:
        with self._lock:
            task = self._calls.pop(job_id, None)
        if task is not None and self._handle is not None:
            with contextlib.suppress(Exception):  # the loop is gone: so is the task
                self._handle.loop.call_soon(task.cancel)

    def close(self) -> None:
        with self._lock:
            tasks = [t for t in self._calls.values() if t is not None]
            self._calls.clear()
        if self._handle is not None:
            for task in tasks:
                with contextlib.suppress(Exception):
                    self._handle.loop.call_soon(task.cancel)

"""The MCP executor: abilities with ``isolation = "mcp"`` (remote tool proxies) run over their
server's one persistent session.

``start`` reads the Route its server's McpConnectionActor last published
(:mod:`chalie.mcp.route`): a proxy that cannot run (quarantined, gone, on a
disabled server, its server offline or refusing our credentials) is answered
at once with its own code; otherwise the call is submitted to the session on
the event loop with the job's timeout, and the mapped result reaches
``done`` from the loop thread, exactly once. A call that finds the
connection broken asks the actor to probe it now. ``cancel`` cancels the
call's task, which the SDK turns into an MCP ``notifications/cancelled``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from typing import Any

from actors.mcp_connections import McpHandle, Suspect
from actors.supervisor import ChildUnavailable
from chalie.execution import FAULTS, Done, Job
from chalie.mcp import results
from chalie.mcp.proxy import McpProxy, is_proxy
from chalie.mcp.route import outcome, refusal

log = logging.getLogger("chalie.dispatch")


class McpExecutor:
    """Runs proxy calls on their servers' sessions; see the module docstring."""

    def __init__(self, handle: McpHandle | None) -> None:
        self._handle = handle
        self._lock = threading.Lock()
        self._calls: dict[str, concurrent.futures.Future[Any]] = {}

    def start(self, job: Job, done: Done) -> None:
        cls = job.entry.cls
        if not is_proxy(cls):
            done(FAULTS.no_executor(job.tool, "mcp"))
            return
        assert issubclass(cls, McpProxy)
        server, tool = cls.mcp_server, cls.mcp_tool
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
        try:
            fut = handle.loop.submit(link.call(tool, dict(job.params), job.timeout))
        except Exception as exc:
            log.exception("submitting %s to its MCP session failed", job.tool)
            done(FAULTS.executor_failed(job.tool, type(exc).__name__))
            return
        with self._lock:
            self._calls[job.job_id] = fut

        def finished(f: concurrent.futures.Future[Any]) -> None:
            with self._lock:
                self._calls.pop(job.job_id, None)
            try:
                result, suspect = outcome(server, job.tool, tool, job.timeout, link, f)
            except Exception as exc:
                log.exception("mapping the result of %s failed", job.tool)
                result, suspect = FAULTS.executor_failed(job.tool, type(exc).__name__), False
            done(result)
            if suspect:
                with contextlib.suppress(ChildUnavailable):
                    handle.connection(server).tell(Suspect(gen))

        fut.add_done_callback(finished)

    def cancel(self, job_id: str) -> None:
        with self._lock:
            fut = self._calls.get(job_id)
        if fut is not None:
            fut.cancel()

    def close(self) -> None:
        with self._lock:
            calls = list(self._calls.values())
        for fut in calls:
            fut.cancel()

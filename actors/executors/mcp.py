"""The MCP executor: abilities with ``isolation = "mcp"`` (remote tool proxies) run through
their server's McpConnectionActor.

``start`` tells the server's connection actor a :class:`RemoteCall` and
returns; the actor runs the call on the event loop over its one persistent
session with the job's timeout, maps the outcome and calls ``done`` (once).
A proxy that cannot run (quarantined, gone, on a disabled server) is
answered here at once with its own code; a server with no running
connection is ``mcp-unreachable`` naming it. ``cancel`` reaches the remote
server as an MCP cancellation.
"""

from __future__ import annotations

import logging
import threading

from actors.mcp_connections import CancelRemoteCall, McpHandle, RemoteCall
from actors.supervisor import ChildUnavailable
from chalie.execution import FAULTS, Done, Job
from chalie.mcp import results
from chalie.mcp.proxy import is_proxy
from chalie.result import ToolResult

log = logging.getLogger("chalie.dispatch")


class McpExecutor:
    """Sends proxy calls to their connection actors; see the module docstring."""

    def __init__(self, handle: McpHandle | None) -> None:
        self._handle = handle
        self._lock = threading.Lock()
        self._servers: dict[str, str] = {}  # job id → server, for cancel

    def start(self, job: Job, done: Done) -> None:
        cls = job.entry.cls
        if not is_proxy(cls):
            done(FAULTS.no_executor(job.tool, "mcp"))
            return
        server, tool = cls.mcp_server, cls.mcp_tool  # type: ignore[attr-defined]
        state = cls.mcp_state  # type: ignore[attr-defined]
        if state == "quarantined":
            done(results.quarantined(server, tool, cls.mcp_changed))  # type: ignore[attr-defined]
            return
        if state != "active":
            why = "its server is disabled" if state == "disabled" else ""
            done(results.unknown_tool(server, tool, why))
            return
        if self._handle is None:
            done(results.unreachable(server, tool, "MCP connections are not running"))
            return
        with self._lock:
            self._servers[job.job_id] = server

        def finished(result: ToolResult) -> None:
            with self._lock:
                self._servers.pop(job.job_id, None)
            done(result)

        try:
            self._handle.tell(
                server,
                RemoteCall(job.job_id, job.tool, tool, dict(job.params), job.timeout, finished),
            )
        except ChildUnavailable:
            finished(results.unreachable(server, tool, "not connected"))
        except Exception as exc:
            log.exception("sending %s to its MCP connection failed", job.tool)
            finished(FAULTS.executor_failed(job.tool, type(exc).__name__))

    def cancel(self, job_id: str) -> None:
        with self._lock:
            server = self._servers.get(job_id)
        if server is None or self._handle is None:
            return
        try:
            self._handle.tell(server, CancelRemoteCall(job_id))
        except ChildUnavailable:
            pass

    def close(self) -> None:
        pass  # the connections are supervised actors of their own

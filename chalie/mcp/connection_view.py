"""The call path's view of one connection: an immutable snapshot its actor publishes.

The connection actor owns the session, the status and the tool rows; after
every change it publishes a new :class:`ConnectionView` (one dict assignment, so any
thread reads a consistent one without a lock, the way the dispatcher reads
the policy view). The MCP executor answers from it at once (quarantined,
gone, offline, refused credentials) or submits the call straight to the
session on the event loop: no actor hop on the hot path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcp import MCPError

from chalie.mcp import results
from chalie.mcp.session import McpSession, NotConnected, describe
from chalie.mcp.tools import ToolRow
from chalie.result import ToolResult


@dataclass(frozen=True)
class ConnectionView:
    server: str
    gen: int
    status: str
    reason: str = ""
    link: McpSession | None = None
    auth_status: int | None = None
    rows: Mapping[str, ToolRow] = field(default_factory=dict)  # proxy → row


def refusal(route: ConnectionView | None, server: str, proxy: str, tool: str) -> ToolResult | None:
    """The result for a call that cannot be sent, or None when it may go."""
    if route is None:
        return results.unreachable(server, tool, "not connected")
    row = route.rows.get(proxy)
    if row is None or row.remote != tool or row.state in ("gone", "incompatible"):
        return results.unknown_tool(server, tool, row.problem if row is not None else "")
    if row.state == "quarantined":
        return results.quarantined(server, tool, row.changed)
    if route.status != "online" or route.link is None:
        if route.auth_status is not None:
            return results.auth_failed(
                server, tool, route.auth_status, login=route.status == "needs-login"
            )
        return results.unreachable(server, tool, route.reason or route.status)
    return None


def outcome(
    server: str,
    proxy: str,
    tool: str,
    timeout: float,
    link: McpSession,
    fut: asyncio.Future[Any] | concurrent.futures.Future[Any],
) -> tuple[ToolResult, bool]:
    """A finished call's ToolResult, and whether the connection itself looks broken."""
    if fut.cancelled():
        return ToolResult.error(
            "cancelled",
            f"The call to {proxy} was cancelled.",
            hint="the call was cancelled; do not continue with its result.",
        ), False
    error = fut.exception()
    if error is None:
        try:
            return results.call_result(server, tool, fut.result()), False
        except Exception as exc:
            return results.remote_error(server, tool, -32603, type(exc).__name__), False
    if link.needs_login:
        return results.auth_failed(server, tool, 401, login=True), True
    if link.auth_status is not None:
        return results.auth_failed(server, tool, link.auth_status), True
    if isinstance(error, NotConnected):
        return results.unreachable(server, tool, "not connected"), True
    if isinstance(error, TimeoutError):
        return results.timed_out(server, tool, timeout), False
    if isinstance(error, MCPError):
        mapped = results.remote_error(server, tool, error.error.code, error.error.message)
        return mapped, mapped.code == "mcp-unreachable"
    return results.unreachable(server, tool, link.scrub(describe(error))), True

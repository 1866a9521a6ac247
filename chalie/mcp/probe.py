"""``test``: connect to one server, list its tools, measure, disconnect; nothing is kept."""

from __future__ import annotations

import time
from typing import Any, TextIO

from chalie.mcp.session import ConnectFailure, McpSession, describe
from chalie.mcp.spec import ServerSpec


async def test_server(
    resolved: ServerSpec, *, timeout: float = 30.0, errlog: TextIO | None = None
) -> dict[str, Any]:
    """A report: ok, protocol version, connect/list/probe latency, tool names (or the error)."""
    link = McpSession(resolved, errlog=errlog)
    started = time.monotonic()
    try:
        info = await link.open(timeout)
    except ConnectFailure as exc:
        return {"name": resolved.name, "ok": False, "kind": exc.kind, "error": exc.message}
    try:
        connected = time.monotonic()
        tools = await link.list_tools(timeout)
        listed = time.monotonic()
        probe = await link.probe(min(timeout, 10.0))
        return {
            "name": resolved.name,
            "ok": True,
            "protocol": info.protocol,
            "server": f"{info.server_name} {info.server_version}".strip(),
            "connect_ms": round((connected - started) * 1000, 1),
            "list_ms": round((listed - connected) * 1000, 1),
            "probe_ms": round(probe * 1000, 1),
            "tools": [str(getattr(t, "name", ""))[:120] for t in tools],
        }
    except Exception as exc:
        return {
            "name": resolved.name,
            "ok": False,
            "kind": "unreachable",
            "error": link.scrub(describe(exc)),
        }
    finally:
        await link.close(grace=3.0)

"""A fixture MCP server (stdio, 2025-11-25) that reports progress straight to its stdout.

``python -m tools.fixture_mcp.stamper``. Raw JSON-RPC lines: one tool, ``stamp`` (``n``,
``pause``), sends ``n`` progress notifications whose message is the wall-clock time it was
written, each written and flushed on the server's one thread. The mcp SDK's stdio server
writes through ``anyio.wrap_file`` (a worker-thread hop for the write and one for the
flush, per message); this one has none, so a benchmark can tell the server's part of a
progress delay from the client's (tools/bench/bench_mcp_asks.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

TOOL = {
    "name": "stamp",
    "description": "Report progress n times, each message the wall-clock time it was sent.",
    "inputSchema": {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "pause": {"type": "number"}},
        "required": ["n"],
    },
}


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def stamp(msg: dict[str, Any]) -> None:
    params = msg.get("params") or {}
    args = params.get("arguments") or {}
    token = (params.get("_meta") or {}).get("progressToken")
    n, pause = int(args.get("n", 1)), float(args.get("pause", 0.01))
    for i in range(n):
        if token is not None:
            note = {"progressToken": token, "progress": i + 1, "total": n}
            note["message"] = repr(time.time())
            send({"jsonrpc": "2.0", "method": "notifications/progress", "params": note})
        await asyncio.sleep(pause)
    result = {"content": [{"type": "text", "text": f"stamped {n}"}]}
    send({"jsonrpc": "2.0", "id": msg["id"], "result": result})


def answer(msg: dict[str, Any]) -> dict[str, Any] | None:
    method = msg.get("method")
    if method == "initialize":
        return {
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "stamper", "version": "1"},
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": [TOOL]}
    return None


async def run() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    jobs: set[asyncio.Task[None]] = set()
    while line := await reader.readline():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict) or "method" not in msg or "id" not in msg:
            continue
        if msg["method"] == "tools/call":
            job = asyncio.create_task(stamp(msg))
            jobs.add(job)
            job.add_done_callback(jobs.discard)
            continue
        result = answer(msg)
        if result is None:
            error = {"code": -32601, "message": f"method not found: {msg['method']}"}
            send({"jsonrpc": "2.0", "id": msg["id"], "error": error})
        else:
            send({"jsonrpc": "2.0", "id": msg["id"], "result": result})


if __name__ == "__main__":
    asyncio.run(run())

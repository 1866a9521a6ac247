"""A fixture MCP server (stdio, 2025-11-25) whose tools run as tasks.

``python -m tools.fixture_mcp.tasks``. Written on raw JSON-RPC lines because
the mcp SDK has the task types but serves no ``tasks/*`` requests. Tools:
``render`` (``execution.taskSupport = required``: without a ``task`` in the call
it is ``-32601 ... requires task augmentation``; as a task it sleeps ``seconds``
and answers ``rendered <text> after <seconds> s``), ``quick`` (``optional``:
direct or as a task), ``seen`` (the status of every task the server holds, as
JSON). Tasks: ``tasks/get``, ``tasks/result`` (waits for the end), ``tasks/cancel``;
a task suggests a ``pollInterval`` of ``--poll`` milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
import uuid
from typing import Any

TOOLS = [
    {
        "name": "render",
        "description": "Render a long job (it runs as a task).",
        "inputSchema": {
            "type": "object",
            "properties": {"seconds": {"type": "number"}, "text": {"type": "string"}},
            "required": ["seconds"],
        },
        "execution": {"taskSupport": "required"},
    },
    {
        "name": "quick",
        "description": "Answer at once, or as a task.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "execution": {"taskSupport": "optional"},
    },
    {
        "name": "seen",
        "description": "The status of every task.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]


class MethodNotFound(Exception):
    """A request for a method this fixture does not serve (JSON-RPC -32601)."""


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


class Server:
    def __init__(self, poll_ms: int) -> None:
        self.poll_ms = poll_ms
        self.tasks: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, asyncio.Task[None]] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.done: dict[str, asyncio.Event] = {}
        self.out = sys.stdout

    def send(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps(message) + "\n")
        self.out.flush()

    def task_view(self, task_id: str) -> dict[str, Any]:
        return dict(self.tasks[task_id])

    async def work(self, task_id: str, tool: str, args: dict[str, Any]) -> None:
        try:
            if tool == "render":
                seconds = float(args.get("seconds", 0))
                await asyncio.sleep(seconds)
                text = f"rendered {args.get('text', '')} after {seconds:g} s"
            else:
                text = f"quick {args.get('text', '')}"
            self.results[task_id] = {"content": [{"type": "text", "text": text}]}
            self.set(task_id, "completed")
        except asyncio.CancelledError:
            self.set(task_id, "cancelled")
        finally:
            self.done[task_id].set()

    def set(self, task_id: str, status: str) -> None:
        self.tasks[task_id].update(status=status, lastUpdatedAt=now())

    def tool_result(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name == "seen":
            statuses = {k: v["status"] for k, v in self.tasks.items()}
            return {"content": [{"type": "text", "text": json.dumps(statuses)}]}
        return {"content": [{"type": "text", "text": f"quick {args.get('text', '')}"}]}

    async def handle(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "initialize":
            return {
                "protocolVersion": "2025-11-25",
                "capabilities": {
                    "tools": {},
                    "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}},
                },
                "serverInfo": {"name": "tasks", "version": "1"},
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": TOOLS}
        if method == "tools/call":
            name, args = params.get("name"), params.get("arguments") or {}
            task = params.get("task")
            if name not in ("render", "quick", "seen"):
                raise LookupError(f"unknown tool {name}")
            if task is None:
                if name == "render":
                    raise PermissionError("render requires task augmentation")
                return self.tool_result(name, args)
            task_id = uuid.uuid4().hex
            self.tasks[task_id] = {
                "taskId": task_id,
                "status": "working",
                "createdAt": now(),
                "lastUpdatedAt": now(),
                "ttl": task.get("ttl"),
                "pollInterval": self.poll_ms,
            }
            self.done[task_id] = asyncio.Event()
            self.runs[task_id] = asyncio.create_task(self.work(task_id, name, args))
            return {"task": self.task_view(task_id)}
        if method in ("tasks/get", "tasks/result", "tasks/cancel"):
            task_id = str(params.get("taskId", ""))
            if task_id not in self.tasks:
                raise KeyError(f"no task {task_id}")
            if method == "tasks/get":
                return self.task_view(task_id)
            if method == "tasks/cancel":
                run = self.runs.get(task_id)
                if run is not None and not run.done():
                    run.cancel()
                    await self.done[task_id].wait()
                return self.task_view(task_id)
            await self.done[task_id].wait()
            if self.tasks[task_id]["status"] != "completed":
                raise RuntimeError(f"task {task_id} was {self.tasks[task_id]['status']}")
            meta = {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
            return {**self.results[task_id], "_meta": meta}
        if "id" in msg:
            raise MethodNotFound(f"method not found: {method}")
        return None

    async def answer(self, msg: dict[str, Any]) -> None:
        try:
            result = await self.handle(msg)
        except PermissionError as exc:
            self.send(
                {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": str(exc)}}
            )
            return
        except MethodNotFound as exc:
            self.send(
                {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": str(exc)}}
            )
            return
        except Exception as exc:
            self.send(
                {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32602, "message": str(exc)}}
            )
            return
        if "id" in msg and result is not None:
            self.send({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        pending: set[asyncio.Task[None]] = set()
        while line := await reader.readline():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict) or "method" not in msg:
                continue  # a response to something we never ask
            job = asyncio.create_task(self.answer(msg))
            pending.add(job)
            job.add_done_callback(pending.discard)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--poll", type=int, default=200, help="suggested poll interval, ms")
    args = parser.parse_args()
    asyncio.run(Server(args.poll).run())


if __name__ == "__main__":
    main()

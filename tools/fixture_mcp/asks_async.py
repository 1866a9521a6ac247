"""A fixture MCP server (stdio, 2025-11-25) that asks the CLIENT to sample and elicit as tasks.

``python -m tools.fixture_mcp.asks_async [--poll MS]``. What server-everything's
``trigger-sampling-request-async`` and ``trigger-elicitation-request-async`` do, on raw
JSON-RPC lines (the mcp SDK sends no task-augmented request): each tool is listed only
when the client's ``initialize`` declared ``tasks.requests.sampling.createMessage``
(resp. ``tasks.requests.elicitation.create``) beside ``sampling`` (resp.
``elicitation``). A call sends ``sampling/createMessage`` (resp. ``elicitation/create``)
with ``task: {ttl}``; the client answers a ``CreateTaskResult``; the server polls
``tasks/get`` every ``--poll`` ms until the task ends, then fetches ``tasks/result`` and
answers ``[COMPLETED] ...`` with every status it saw and the result as JSON (or
``[FAILED]``/``[CANCELLED]`` with the task's message, ``[SYNC]`` when the client answered
without a task). ``tasks_seen`` answers the client's ``tasks/list`` as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

SAMPLING = {
    "name": "trigger-sampling-request-async",
    "description": "Ask the client's model (as a task the client runs) and poll for it.",
    "inputSchema": {
        "type": "object",
        "properties": {"prompt": {"type": "string"}, "maxTokens": {"type": "integer"}},
        "required": ["prompt"],
    },
}
ELICITATION = {
    "name": "trigger-elicitation-request-async",
    "description": "Ask the client's user for a name (as a task the client runs) and poll.",
    "inputSchema": {"type": "object", "properties": {}},
}
SEEN = {
    "name": "tasks_seen",
    "description": "The client's tasks/list, as JSON.",
    "inputSchema": {"type": "object", "properties": {}},
}
MAX_POLLS = 600


class ClientError(Exception):
    """The client answered one of our requests with an error."""


class Server:
    def __init__(self, poll_ms: int) -> None:
        self.poll = poll_ms / 1000
        self.caps: dict[str, Any] = {}
        self.next_id = 0
        self.waiting: dict[int, asyncio.Future[Any]] = {}

    def send(self, message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    async def ask(self, method: str, params: dict[str, Any]) -> Any:
        """One request to the client; its result, or ClientError."""
        self.next_id += 1
        key = self.next_id
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[key] = answer
        self.send({"jsonrpc": "2.0", "id": f"s{key}", "method": method, "params": params})
        try:
            return await answer
        finally:
            self.waiting.pop(key, None)

    def tools(self) -> list[dict[str, Any]]:
        tasks = (self.caps.get("tasks") or {}).get("requests") or {}
        listed = [SEEN]
        if "sampling" in self.caps and "createMessage" in (tasks.get("sampling") or {}):
            listed.append(SAMPLING)
        if "elicitation" in self.caps and "create" in (tasks.get("elicitation") or {}):
            listed.append(ELICITATION)
        return listed

    async def as_task(self, method: str, params: dict[str, Any]) -> str:
        created = await self.ask(method, {**params, "task": {"ttl": 300_000}})
        if "task" not in created:
            return f"[SYNC] the client answered at once:\n{json.dumps(created)}"
        task = created["task"]
        task_id, status = task["taskId"], task["status"]
        seen = [f"created {task_id}: {status}"]
        polls = 0
        while status not in ("completed", "failed", "cancelled") and polls < MAX_POLLS:
            await asyncio.sleep(self.poll)
            polls += 1
            got = await self.ask("tasks/get", {"taskId": task_id})
            status = got["status"]
            seen.append(
                f"poll {polls}: {status}"
                + (f" - {got['statusMessage']}" if got.get("statusMessage") else "")
            )
        if status != "completed":
            return f"[{status.upper()}] " + "\n".join(seen)
        result = await self.ask("tasks/result", {"taskId": task_id})
        return "[COMPLETED] " + "\n".join(seen) + "\nresult: " + json.dumps(result)

    async def call(self, name: str, args: dict[str, Any]) -> str:
        if name == SAMPLING["name"]:
            return await self.as_task(
                "sampling/createMessage",
                {
                    "messages": [
                        {"role": "user", "content": {"type": "text", "text": str(args["prompt"])}}
                    ],
                    "systemPrompt": "You are a helpful test server.",
                    "maxTokens": int(args.get("maxTokens", 100)),
                },
            )
        if name == ELICITATION["name"]:
            return await self.as_task(
                "elicitation/create",
                {
                    "mode": "form",
                    "message": "Who are you?",
                    "requestedSchema": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                },
            )
        if name == SEEN["name"]:
            return json.dumps(await self.ask("tasks/list", {}))
        raise LookupError(f"unknown tool {name}")

    async def handle(self, msg: dict[str, Any]) -> Any:
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "initialize":
            self.caps = params.get("capabilities") or {}
            return {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "asks-async", "version": "1"},
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": self.tools()}
        if method == "tools/call":
            text = await self.call(str(params.get("name")), params.get("arguments") or {})
            return {"content": [{"type": "text", "text": text}]}
        raise LookupError(f"method not found: {method}")

    async def answer(self, msg: dict[str, Any]) -> None:
        try:
            result = await self.handle(msg)
        except (ClientError, LookupError, KeyError) as exc:
            if "id" in msg:
                error = {
                    "code": -32601 if isinstance(exc, LookupError) else -32603,
                    "message": str(exc),
                }
                self.send({"jsonrpc": "2.0", "id": msg["id"], "error": error})
            return
        if "id" in msg:
            self.send({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    def answered(self, msg: dict[str, Any]) -> None:
        """The client's answer to one of our requests."""
        ident = str(msg.get("id", ""))
        waiting = self.waiting.get(int(ident[1:])) if ident[1:].isdigit() else None
        if waiting is None or waiting.done():
            return
        if "error" in msg:
            waiting.set_exception(ClientError(json.dumps(msg["error"])))
        else:
            waiting.set_result(msg.get("result"))

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
            if not isinstance(msg, dict):
                continue
            if "method" not in msg:
                self.answered(msg)
                continue
            job = asyncio.create_task(self.answer(msg))
            pending.add(job)
            job.add_done_callback(pending.discard)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--poll", type=int, default=100, help="ms between two tasks/get")
    args = parser.parse_args()
    asyncio.run(Server(args.poll).run())


if __name__ == "__main__":
    main()

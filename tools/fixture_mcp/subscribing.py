"""A fixture MCP server (stdio, 2025-11-25) that offers ``resources/subscribe``.

``python -m tools.fixture_mcp.subscribing [--no-subscribe]``. Written on raw JSON-RPC
lines because the mcp SDK's server offers resource subscriptions only on 2026-07-28 (its
listen stream), not on the handshake generation. Resources: ``notes://today`` (text that
``edit`` changes; a subscriber hears ``notifications/resources/updated``) and
``notes://other`` (never changes). Tools: ``edit`` (``text``), ``reads`` (how many reads the
server answered), ``subscribed`` (the URIs subscribed to, as JSON). ``--no-subscribe``:
the capability is not offered and ``resources/subscribe`` is method-not-found.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

TOOLS = [
    {
        "name": "edit",
        "description": "Replace today's notes (subscribers hear resources/updated).",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
    {
        "name": "reads",
        "description": "How many resource reads the server answered.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "subscribed",
        "description": "The resources subscribed to.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]
RESOURCES = [
    {"uri": "notes://today", "name": "today", "mimeType": "text/plain"},
    {"uri": "notes://other", "name": "other", "mimeType": "text/plain"},
]


class MethodNotFound(Exception):
    """A request for a method this fixture does not serve (JSON-RPC -32601)."""


class Server:
    def __init__(self, subscribe: bool) -> None:
        self.subscribe = subscribe
        self.texts = {"notes://today": "Buy milk.", "notes://other": "Nothing new."}
        self.reads = 0
        self.subscribed: set[str] = set()

    def send(self, message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    def text(self, text: str) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": text}]}

    def handle(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "initialize":
            resources: dict[str, Any] = {"listChanged": False}
            if self.subscribe:
                resources["subscribe"] = True
            return {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}, "resources": resources},
                "serverInfo": {"name": "subscribing", "version": "1"},
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": TOOLS}
        if method == "resources/list":
            return {"resources": RESOURCES}
        if method == "resources/templates/list":
            return {"resourceTemplates": []}
        if method == "resources/read":
            uri = str(params.get("uri", ""))
            if uri not in self.texts:
                raise KeyError(f"no resource {uri}")
            self.reads += 1
            return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": self.texts[uri]}]}
        if method in ("resources/subscribe", "resources/unsubscribe") and self.subscribe:
            uri = str(params.get("uri", ""))
            if uri not in self.texts:
                raise KeyError(f"no resource {uri}")
            if method == "resources/subscribe":
                self.subscribed.add(uri)
            else:
                self.subscribed.discard(uri)
            return {}
        if method == "tools/call":
            name, args = params.get("name"), params.get("arguments") or {}
            if name == "edit":
                self.texts["notes://today"] = str(args.get("text", ""))
                if "notes://today" in self.subscribed:
                    self.send(
                        {
                            "jsonrpc": "2.0",
                            "method": "notifications/resources/updated",
                            "params": {"uri": "notes://today"},
                        }
                    )
                return self.text("edited")
            if name == "reads":
                return self.text(str(self.reads))
            if name == "subscribed":
                return self.text(json.dumps(sorted(self.subscribed)))
            raise KeyError(f"unknown tool {name}")
        if "id" in msg:
            raise MethodNotFound(f"method not found: {method}")
        return None

    def answer(self, msg: dict[str, Any]) -> None:
        try:
            result = self.handle(msg)
        except MethodNotFound as exc:
            error = {"code": -32601, "message": str(exc)}
            self.send({"jsonrpc": "2.0", "id": msg["id"], "error": error})
            return
        except Exception as exc:
            error = {"code": -32602, "message": str(exc)}
            self.send({"jsonrpc": "2.0", "id": msg["id"], "error": error})
            return
        if "id" in msg and result is not None:
            self.send({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and "method" in msg:
                self.answer(msg)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-subscribe", action="store_true")
    args = parser.parse_args()
    asyncio.run(Server(not args.no_subscribe).run())


if __name__ == "__main__":
    main()

"""One agent token's flood of ``talk_to_chalie`` calls over the real inbound MCP server: the
quota tests and tools/bench/bench_trust.py share it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client


def flood(url: str, secret: str, text: str, calls: int) -> list[Any]:
    """Up to ``calls`` talk_to_chalie calls, each a new conversation; stops after the first
    refused one (which is the last of the list)."""

    async def go() -> list[Any]:
        found: list[Any] = []
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode="auto") as client:  # type: ignore[arg-type]
                for i in range(calls):
                    args = {
                        "message": text,
                        "agent_name": "flooder",
                        "project_or_task_name": f"flood {i}",
                        "loop_in_human": False,
                    }
                    result = await client.call_tool("talk_to_chalie", args)
                    found.append(result)
                    if result.is_error:
                        break
        return found

    return asyncio.run(go())


def code_of(result: Any) -> Any:
    """The error code of a refused call's structured content."""
    data = result.structured_content or {}
    return data.get("code") or data.get("error", {}).get("code")

"""A real daemon in this process, chat on an ephemeral port, and the scripted model on loopback
(``tools/daemon_thread.py``); a test that starts one must carry the slow mark."""

from __future__ import annotations

from typing import Any

from chalie_app.root import Runtime
from tests.slow import require_slow
from tools.conversation_harness import ChatDaemon
from tools.waiting import wait_until


class Daemon(ChatDaemon):
    def __init__(self) -> None:
        require_slow("a daemon")
        super().__init__(prefix="che-")


def clock_script(act_summary: str) -> dict[str, Any]:
    """A turn that finds the clock, reads it (with ``act_summary``), then answers in deltas."""
    return {
        "steps": [
            {
                "tool_calls": [
                    {
                        "name": "find_tools",
                        "arguments": {"query": ["clock"], "act_summary": "finding"},
                    }
                ]
            },
            {
                "tool_calls": [
                    {
                        "name": "clock",
                        "arguments": {"zone": "Asia/Tokyo", "act_summary": act_summary},
                    }
                ]
            },
            {"text": "It is evening in Tokyo.", "chunk": 6},
        ]
    }


def wait_indexed(rt: Runtime, tool: str) -> None:
    """Until the remote tool is registered and its name finds it in the index."""
    wait_until(lambda: rt.registry.get(tool) is not None, 60, "the remote tool")
    discovery = rt.services.discovery
    assert discovery is not None
    wait_until(lambda: tool in discovery.find([tool]).names, 60, "the remote tool in the index")

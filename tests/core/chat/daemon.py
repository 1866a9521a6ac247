"""A real daemon in this process, chat on an ephemeral port, and the scripted model on loopback
(``tools/daemon_thread.py``); a test that starts one must carry the slow mark."""

from __future__ import annotations

from typing import Any

from tests.slow import require_slow
from tools.conversation_harness import ChatDaemon


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

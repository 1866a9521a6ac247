"""The chat desk's double for the inbound MCP tests (the conversations' is
``tests/conversations_double.py``, shared with the chat tests)."""

from __future__ import annotations

from chalie.mcp_server.exchange import AgentExchange


class FakeDesk:
    """A chat desk with ``humans`` people connected, recording what it was shown."""

    def __init__(self, humans: int = 1) -> None:
        self.humans = humans
        self.shown: list[AgentExchange] = []

    def humans_connected(self) -> int:
        return self.humans

    def surface(self, exchange: AgentExchange) -> int:
        self.shown.append(exchange)
        return self.humans

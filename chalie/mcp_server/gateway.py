"""Gateway mode: an agent whose token carries the permission calls Chalie's tools directly.

What a caller sees and may call (one rule, :meth:`Gateway.opens_for`): with
``[mcp_server] gateway`` on and a token created with ``--gateway``, the
agent's ``tools/list`` holds ``talk_to_chalie``, ``find_tools`` and the tools
``find_tools`` injected for that token; otherwise only ``talk_to_chalie``.

Each direct call is one :class:`~chalie.wire.messages.ToolCall` through the
dispatcher chokepoint (:class:`ToolsPort`), with a restricted
:class:`~chalie.wire.messages.TurnContext` on the ``external_agent`` channel (no
human present: ``ask`` is ``deny``). The token's name is in the context's
conversation id (``mcp-gateway:ID``, recorded on every trail row) and its
turn id (``gateway:ID``, the key of the tools find_tools injected; the
token's id, so a new token reusing the name inherits nothing). The
outcome comes back as MCP content: the envelope as text, the status, code
and rich payload as structured content. When a call changes what the token
sees, ``notifications/tools/list_changed`` goes out: on the server's
subscription bus (2026-07-28 ``subscriptions/listen``) and on the session
(legacy protocol).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any, Final, Protocol

from mcp_types import CallToolResult, TextContent
from mcp_types import Tool as MCPTool

from chalie.mcp_server.gate import Caller
from chalie.mcp_server.rich import blocks
from chalie.wire.messages import ToolCall, ToolOutcome, TurnContext

log = logging.getLogger("chalie.mcp_server")

CHANNEL: Final = "external_agent"
FIND_TOOLS: Final = "find_tools"
TURN_PREFIX: Final = "gateway:"
CONVERSATION_PREFIX: Final = "mcp-gateway:"
# Longer names are no tool's: refused here, so the trail never stores them.
MAX_NAME: Final = 200


class ToolsPort(Protocol):
    """The dispatcher and the registry, as the gateway uses them (built in actors/)."""

    async def call(self, call: ToolCall) -> ToolOutcome: ...

    def injected(self, turn_id: str) -> frozenset[str]: ...

    def descriptors(self, names: tuple[str, ...]) -> list[dict[str, Any]]: ...


def turn_id(token_id: str) -> str:
    return TURN_PREFIX + token_id


def context_for(caller: Caller) -> TurnContext:
    """The restricted context of a token's direct calls: only find_tools and what it found."""
    return TurnContext(
        conversation_id=CONVERSATION_PREFIX + caller.token_id,
        turn_id=turn_id(caller.token_id),
        principal=caller.principal,
        channel=CHANNEL,
        human_present=False,
        allow_async=False,
        injected=(FIND_TOOLS,),
        scope="restricted",
        initiator="model",
    )


def refused(name: str) -> CallToolResult:
    """A call to a tool this caller cannot see: the same answer whether or not it exists."""
    shown = name[:80]
    message = f"no tool named {shown!r} is available to this token."
    return CallToolResult(
        content=[TextContent(type="text", text=f"unknown-tool: {message}")],
        structured_content={"error": {"code": "unknown-tool", "message": message}},
        is_error=True,
    )


def as_result(outcome: ToolOutcome) -> CallToolResult:
    """The dispatcher's outcome as MCP content: envelope text, the rest structured."""
    return CallToolResult(
        content=[TextContent(type="text", text=outcome.envelope), *blocks([outcome.rich])],
        structured_content={
            "call_id": outcome.call_id,
            "tool": outcome.tool,
            "status": outcome.status,
            "code": outcome.code,
            "rich": outcome.rich,
        },
        is_error=outcome.status != "success",
    )


def as_tool(descriptor: dict[str, Any]) -> MCPTool:
    return MCPTool(
        name=str(descriptor["name"]),
        description=str(descriptor.get("description") or ""),
        input_schema=dict(descriptor["input_schema"]),
    )


class Gateway:
    """The gateway's one rule and its two operations; runs on the server's event loop."""

    def __init__(self, enabled: bool, port: ToolsPort | None) -> None:
        self.enabled = enabled and port is not None
        self._port = port

    def opens_for(self, caller: Caller | None) -> bool:
        """The one rule: the server allows it and the caller's token carries the permission."""
        return self.enabled and caller is not None and caller.gateway

    def names(self, caller: Caller | None) -> tuple[str, ...]:
        """The tools beyond talk_to_chalie this caller sees, in a stable order."""
        if not self.opens_for(caller) or self._port is None:
            return ()
        assert caller is not None
        found = self._port.injected(turn_id(caller.token_id)) - {FIND_TOOLS}
        return (FIND_TOOLS, *sorted(found))

    def tools(self, caller: Caller | None) -> list[MCPTool]:
        names = self.names(caller)
        if not names or self._port is None:
            return []
        return [as_tool(d) for d in self._port.descriptors(names)]

    async def call(
        self,
        caller: Caller | None,
        name: str,
        arguments: Any,
        changed: Callable[[], Any],
    ) -> CallToolResult:
        """Run one direct call through the dispatcher; ``changed`` is awaited when the list moved.

        A caller without the gateway gets ``unknown-tool`` and nothing is
        dispatched. Any other name goes to the dispatcher, which refuses a tool
        the token's turn does not hold (``unknown-tool``) at the chokepoint.
        """
        if not self.opens_for(caller) or self._port is None:
            if caller is not None:
                log.warning(
                    "MCP direct tool call refused: the token is not a gateway token",
                    extra={"token_id": caller.token_id, "scope": caller.scope},
                )
            return refused(name)
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
            return refused(str(name))
        assert caller is not None
        before = self.names(caller)
        call = ToolCall(
            call_id=f"mcp-{uuid.uuid4().hex}",
            tool=name,
            arguments=arguments,
            context=context_for(caller),
        )
        outcome = await self._port.call(call)
        if self.names(caller) != before:
            try:
                await changed()
            except Exception:
                log.exception("could not announce a changed tool list")
        return as_result(outcome)


async def announce(session: Any, publish: Callable[[], Any]) -> None:
    """tools/list_changed on both generations: the subscription bus and the legacy session."""
    with contextlib.suppress(Exception):
        await publish()
    if session is not None:
        with contextlib.suppress(Exception):
            await session.send_tool_list_changed()

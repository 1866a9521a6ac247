"""The tool catalogue: descriptors, the channel's scoped remote tools, what find_tools
injected into a turn, and the tooltip of a call about to start.

One object, built once by the composition root (``chalie_app.root.Runtime.catalogue``)
and read by every TurnActor (it is the :class:`chalie.conversation.turn.Catalogue`
port) and by the inbound MCP server's gateway (``actors.mcp.server.DispatcherTools``).
Reads only, never blocking: the registry is a dict under a lock and the injections are
:class:`chalie.services.TurnTools`.
"""

from __future__ import annotations

from typing import Any

from chalie.calls import healing
from chalie.calls.registry import Registry
from chalie.mcp.proxy import scoped_to
from chalie.services import TurnTools
from chalie.wire.tool_names import FRAMEWORK_FIELDS

# A name longer than this is no tool's (the registry is not asked).
MAX_NAME = 200


class ToolCatalogue:
    """The registry and the turns' injections, as a turn (or a gateway's token) sees them."""

    def __init__(self, registry: Registry, turns: TurnTools) -> None:
        self._registry = registry
        self._turns = turns

    def descriptors(
        self, names: tuple[str, ...], allow_async: bool = False
    ) -> list[dict[str, Any]]:
        """The registered ones of ``names``, in that order (``async`` offered or not)."""
        return self._registry.described(names, allow_async=allow_async)

    def injected(self, turn_id: str) -> frozenset[str]:
        return self._turns.injected(turn_id)

    def forget(self, turn_id: str) -> None:
        """Release a finished turn's injections."""
        self._turns.forget(turn_id)

    def scoped(self, channel: str) -> tuple[str, ...]:
        return scoped_to(self._registry, channel)

    def summary(self, tool: str, arguments: dict[str, Any]) -> str:
        """The tooltip for a call about to start (the dispatcher records the same one)."""
        entry = self._registry.get(tool) if len(tool) <= MAX_NAME else None
        if entry is None:
            return ""
        params = {k: v for k, v in arguments.items() if k not in FRAMEWORK_FIELDS}
        return healing.summary_for(entry.cls, arguments.get("act_summary"), params)[0]

"""Proxy abilities: one Ability class per remote tool, made from its cached row.

A proxy is a real member of the ability hierarchy (the dispatcher resolves,
validates, gates, renders and records it like any other); its ``isolation``
is ``"mcp"``, so the MCP executor runs it through its server's connection.

A callable proxy (state ``active`` on an enabled server) has the remote input
schema as its parameters and the cleaned remote description as its summary.
Every other known remote tool (quarantined, gone, incompatible, or on a
disabled server) stays registered as a *refusing* proxy: not discoverable,
any arguments accepted, ``internal`` so no human is asked about a call that
cannot run, and the executor answers it with the code that says why
(``mcp-tool-quarantined``, ``mcp-unknown-tool``). Only removing the server
unregisters its names.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

from chalie.ability import Ability
from chalie.mcp.tools import State, ToolRow, clean_text, proxy_parameters
from chalie.result import ToolResult

TOOLTIP_MAX: Final = 120


class McpProxy(Ability):
    """Base of every proxy class; concrete ones are made by :func:`proxy_class`."""

    abstract = True
    proxy = True
    isolation = "mcp"  # type: ignore[assignment]
    mcp_server: ClassVar[str] = ""
    mcp_tool: ClassVar[str] = ""
    mcp_state: ClassVar[State | str] = "active"
    mcp_changed: ClassVar[str] = ""

    def run(self, params: Any) -> ToolResult:
        return ToolResult.error(
            "internal-error", f"{self.name} is a remote MCP tool and runs only through the MCP "
            "executor.", hint="this is a fault in the runtime's set-up, not in your call.",
        )


def words(name: str) -> str:
    return " ".join(clean_text(name.replace("_", " ").replace("-", " ").replace(".", " ")).split())


def summary_for(row: ToolRow) -> str:
    """The description the model and the index see: the remote's, cleaned, with provenance."""
    described = clean_text(row.description)
    origin = f"(remote tool {clean_text(row.remote, 120)} on MCP server {row.server})"
    if not described:
        # many remote tools carry no description: the name's words are the prose
        return f"{words(row.remote).capitalize() or 'Remote tool'} {origin}."
    return f"{described} {origin}"


def proxy_class(row: ToolRow, *, enabled: bool = True, timeout: float = 60.0) -> type[McpProxy]:
    """The Ability class for one cached remote tool (see the module doc for its two kinds)."""
    usable = enabled and row.state == "active"
    state: str = row.state if enabled else "disabled"
    parameters: dict[str, Any] = (
        proxy_parameters(row.schema) if usable else {"type": "object", "properties": {}}
    )
    attrs: dict[str, Any] = {
        "__module__": __name__,
        "__qualname__": f"McpProxy.{row.proxy}",
        "name": row.proxy,
        "summary": summary_for(row),
        "tooltip": clean_text(f"{row.remote} on {row.server}", TOOLTIP_MAX),
        "examples": (),
        "parameters": parameters,
        "discoverable": usable,
        "internal": not usable,
        "timeout": timeout,
        "mcp_server": row.server,
        "mcp_tool": row.remote,
        "mcp_state": state,
        "mcp_changed": row.changed,
    }
    cls = type(f"McpProxy_{row.proxy}", (McpProxy,), attrs)
    return cls


def is_proxy(cls: type[Ability]) -> bool:
    return isinstance(cls, type) and issubclass(cls, McpProxy)

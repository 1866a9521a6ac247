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

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from chalie.ability import Ability
from chalie.calls.registry import Entry, Registry
from chalie.mcp.store import McpStore
from chalie.mcp.tools import State, ToolRow, clean_text, proxy_parameters
from chalie.result import ToolResult
from chalie.store.store_place import Place

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
            "internal-error",
            f"{self.name} is a remote MCP tool and runs only through the MCP executor.",
            hint="this is a fault in the runtime's set-up, not in your call.",
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


def proxy_class(
    row: ToolRow, *, enabled: bool = True, timeout: float = 60.0, channels: tuple[str, ...] = ()
) -> type[McpProxy]:
    """The Ability class for one cached remote tool (see the module doc for its two kinds).

    ``channels`` (the server's): when set, the tool is not discoverable and is
    offered on those channels only (:func:`scoped_to`).
    """
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
        "discoverable": usable and not channels,
        "internal": not usable,
        "timeout": timeout,
        "mcp_server": row.server,
        "mcp_tool": row.remote,
        "mcp_state": state,
        "mcp_changed": row.changed,
        "mcp_channels": tuple(channels) if usable else (),
    }
    cls = type(f"McpProxy_{row.proxy}", (McpProxy,), attrs)
    return cls


def scoped_to(registry: Registry, channel: str) -> tuple[str, ...]:
    """The remote tools scoped to ``channel`` (their server's ``channels`` names it)."""
    return tuple(sorted(e.name for e in registry if channel in getattr(e.cls, "mcp_channels", ())))


def is_proxy(cls: type[Ability]) -> bool:
    return isinstance(cls, type) and issubclass(cls, McpProxy)


def signature(cls: type[Ability]) -> tuple[Any, ...]:
    """What makes two proxy classes interchangeable (same state, prose, schema, timeout)."""
    return (
        getattr(cls, "mcp_state", None),
        cls.summary,
        cls.discoverable,
        getattr(cls, "mcp_channels", ()),
        cls.timeout,
        repr(sorted(dict(cls.parameters).items(), key=lambda kv: kv[0])),
    )


@dataclass
class Installed:
    """What an install changed for discovery: entries to (re)index, names to drop."""

    index: list[Entry] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)


def install(
    registry: Registry,
    rows: Iterable[ToolRow],
    *,
    enabled: bool,
    timeout: float,
    channels: tuple[str, ...] = (),
) -> Installed:
    """Register (or replace) the proxy of every row; unchanged classes are left alone."""
    out = Installed()
    for row in rows:
        cls = proxy_class(row, enabled=enabled, timeout=timeout, channels=channels)
        old = registry.get(row.proxy)
        old_cls = old.cls if old is not None else None
        if old_cls is not None and is_proxy(old_cls) and signature(old_cls) == signature(cls):
            continue
        if old_cls is not None and not is_proxy(old_cls):
            continue  # a built-in owns the name: never shadow it
        if old is not None:
            registry.remove(row.proxy)
        entry = registry.add(cls, source=f"mcp:{row.server}", ref=f"mcp:{row.server}:{row.proxy}")
        if cls.discoverable:
            out.index.append(entry)
        elif old_cls is not None and old_cls.discoverable:
            out.drop.append(row.proxy)
    return out


def uninstall(registry: Registry, names: Iterable[str]) -> list[str]:
    """Unregister proxies (a removed server); the names that were discoverable."""
    dropped = []
    for name in names:
        entry = registry.get(name)
        if entry is not None and is_proxy(entry.cls):
            registry.remove(name)
            if entry.cls.discoverable:
                dropped.append(name)
    return dropped


def install_cached(registry: Registry, db_path: Place, call_timeout: float) -> None:
    """Register the proxy of every tool cached in ``db_path`` (servers offline or not).

    The daemon does this before any connection starts, so discovery indexes remote
    tools from its first build; the CLI does it so ``tools list``, ``tools find``,
    ``tools call`` and an offline ``index rebuild`` see the catalogue the daemon serves.
    ``call_timeout`` is the configured default for servers that set none.
    """
    if isinstance(db_path, Path) and not db_path.exists():
        return  # nothing was ever configured; do not create the database for a read
    store = McpStore(db_path)
    try:
        rows = store.tools()
        for server in store.servers():
            install(
                registry,
                [r for r in rows if r.server == server.name],
                enabled=server.spec.enabled,
                timeout=server.spec.timeout(call_timeout),
                channels=server.spec.channels,
            )
    finally:
        store.close()

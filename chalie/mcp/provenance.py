"""Where a proxy comes from, in words: for the policy list and approval prompts.

The store and the policy's patterns are imported when a name is a proxy's: the
CLI shows every trail row and rule through :func:`suffix`, and most are not.
"""

from __future__ import annotations

from pathlib import Path

from chalie.process.home import Home
from chalie.store.store_place import Place
from chalie.wire.mcp_names import PREFIX, SERVER_WILDCARD, server_of


def provenance(db_path: Place, name: str) -> str | None:
    """``remote tool 'X' on MCP server s`` for a proxy (or ``s.*``), None for anything else."""
    from chalie.mcp.store import McpStore

    wildcard = SERVER_WILDCARD.match(name)
    if wildcard:
        return f"every tool of MCP server {wildcard.group(1)}"
    tool = name.partition(".")[0]
    server = server_of(tool)
    if server is None or not tool.startswith(PREFIX):
        return None
    store = McpStore(db_path)
    try:
        row = store.tool_by_proxy(tool)
    finally:
        store.close()
    if row is None:
        return f"a tool of MCP server {server}"
    return f"remote tool {row.remote[:80]!r} on MCP server {row.server}"


def suffix(home: Path, name: str) -> str:
    """``  [remote tool 'x' on MCP server s]`` for a proxy name, else "" (CLI displays)."""
    if not name.startswith(PREFIX):
        return ""
    try:
        found = provenance(Home(home).db, name)
    except Exception:  # a display aid: an unreadable store shows nothing rather than failing
        return ""
    return f"  [{found}]" if found else ""

"""Managing connections: the operations ``chalie mcp``, the control endpoint and the
``mcp_manager`` ability share (one rule, one place).

Every mutation goes to the store (and secrets to the secrets file) and then
calls ``on_change`` so a running daemon reconciles its connection actors.
Views never contain a secret: specs are shown with references only
(:func:`chalie.mcp.secrets.shown`).
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chalie.mcp import server_log
from chalie.mcp.importing import ImportFileError, parse_servers
from chalie.mcp.secrets import MissingSecret, SecretFile, resolve, seal, shown
from chalie.mcp.spec import ServerSpec, SpecError, check_spec
from chalie.mcp.store import McpStore, ServerExists, ServerRow, daemon_id
from chalie.mcp.tools import ToolRow, approve
from chalie.store.store_place import Place


class McpAdminError(ValueError):
    """A management request that cannot be done; the message says why."""


def tool_view(row: ToolRow) -> dict[str, Any]:
    out: dict[str, Any] = {
        "proxy": row.proxy,
        "remote": row.remote,
        "state": row.state,
        "description": row.description[:200],
    }
    if row.changed:
        out["changed"] = row.changed
    if row.problem:
        out["problem"] = row.problem
    return out


def server_view(row: ServerRow, tools: list[ToolRow]) -> dict[str, Any]:
    spec = row.spec
    target = spec.url if spec.transport != "stdio" else " ".join((spec.command, *spec.args))
    return {
        "name": spec.name,
        "transport": spec.transport,
        "target": target[:200],
        "enabled": spec.enabled,
        "status": row.status if spec.enabled else "disabled",
        "since": row.status_since,
        "reason": row.status_reason,
        "last_heartbeat": row.last_heartbeat,
        "protocol": row.protocol,
        "latency_ms": row.latency_ms,
        "last_error": row.last_error,
        "tools": sum(1 for t in tools if t.state == "active"),
        "quarantined": sum(1 for t in tools if t.state == "quarantined"),
        # The other daemons on a shared store: each its own connection, its own status.
        **(
            {
                "daemons": [
                    {"daemon": d.daemon, "status": d.status, "since": d.status_since}
                    for d in row.daemons
                ]
            }
            if row.daemons
            else {}
        ),
    }


class McpAdmin:
    """The management operations over one data directory."""

    def __init__(
        self, db_path: Place, home: Path, *, on_change: Callable[[], None] | None = None
    ) -> None:
        self.store = McpStore(db_path, daemon=daemon_id(home))
        self.secrets = SecretFile(home)
        self.logs_dir = home / "logs"
        self._on_change = on_change or (lambda: None)

    def close(self) -> None:
        self.store.close()

    def _changed(self) -> None:
        self.store.changed()  # every other daemon on a shared store reconciles too
        self._on_change()

    def _require(self, name: str) -> ServerRow:
        row = self.store.server(str(name)[:64])
        if row is None:
            raise McpAdminError(f"no MCP server named {str(name)[:40]!r}")
        return row

    # -- views -------------------------------------------------------------------------
    def list(self) -> list[dict[str, Any]]:
        tools = self.store.tools()
        return [
            server_view(row, [t for t in tools if t.server == row.name])
            for row in self.store.servers()
        ]

    def show(self, name: str) -> dict[str, Any]:
        row = self._require(name)
        tools = self.store.tools(row.name)
        return {
            **server_view(row, tools),
            "spec": shown(row.spec),
            "tool_list": [tool_view(t) for t in tools],
        }

    def tools(self, name: str) -> builtins.list[dict[str, Any]]:
        return [tool_view(t) for t in self.store.tools(self._require(name).name)]

    # -- changes -----------------------------------------------------------------------
    def add(self, spec: ServerSpec, *, replace: bool = False) -> dict[str, Any]:
        try:
            spec = check_spec(spec)
        except SpecError as exc:
            raise McpAdminError(str(exc)) from None
        if not replace and self.store.server(spec.name) is not None:
            raise McpAdminError(f"an MCP server named {spec.name!r} already exists")
        sealed = seal(spec, self.secrets)
        try:
            self.store.add_server(sealed, replace=replace)
        except ServerExists as exc:
            raise McpAdminError(str(exc)) from None
        self._changed()
        return shown(sealed)

    def import_text(self, text: str | bytes, *, replace: bool = False) -> dict[str, Any]:
        try:
            parsed = parse_servers(text)
        except ImportFileError as exc:
            raise McpAdminError(str(exc)) from None
        added: list[str] = []
        skipped: list[str] = []
        for spec in parsed.specs:
            if not replace and self.store.server(spec.name) is not None:
                skipped.append(spec.name)
                continue
            self.store.add_server(seal(spec, self.secrets), replace=replace)
            added.append(spec.name)
        if added:
            self._changed()
        return {"added": added, "skipped_existing": skipped, "problems": parsed.problems}

    def set_enabled(self, name: str, enabled: bool) -> dict[str, Any]:
        row = self._require(name)
        self.store.set_enabled(row.name, enabled)
        self._changed()
        return {"name": row.name, "enabled": enabled}

    def remove(self, name: str) -> dict[str, Any]:
        row = self._require(name)
        revoked = 0
        if row.spec.oauth:  # the grant is revoked at the authorization server, then forgotten
            # Imported here: the OAuth client is the mcp SDK (hundreds of ms); only a
            # server that used OAuth needs it, and the other admin commands never do.
            from chalie.mcp.oauth import revoke

            try:
                revoked = revoke(resolve(row.spec, self.secrets), self.secrets)
            except MissingSecret:
                revoked = 0
        tools = len(self.store.tools(row.name))
        self.store.remove_server(row.name)
        dropped = self.secrets.drop_server(row.name)
        # Its log goes with it (the connection actor closes its stream on stop; an open
        # file unlinked here is freed then).
        logs = server_log.remove(self.logs_dir, row.name)
        self._changed()
        return {
            "name": row.name,
            "removed_tools": tools,
            "removed_secrets": dropped,
            "revoked_tokens": revoked,
            "removed_logs": logs,
        }

    def approve(self, name: str, tool: str | None = None) -> dict[str, Any]:
        row = self._require(name)
        held = self.store.tools(row.name)
        if tool is not None:
            chosen = [t for t in held if tool in (t.remote, t.proxy)]
            if not chosen:
                raise McpAdminError(f"{row.name} has no tool {tool[:80]!r}")
        else:
            chosen = held
        waiting = [t for t in chosen if t.state == "quarantined"]
        if tool is not None and not waiting:
            raise McpAdminError(f"{tool[:80]} on {row.name} is not quarantined")
        now = time.time()
        self.store.write_tools([approve(t, now=now) for t in waiting])
        if waiting:
            self._changed()
        return {"name": row.name, "approved": [t.proxy for t in waiting]}

    def spec(self, name: str) -> ServerSpec:
        return self._require(name).spec

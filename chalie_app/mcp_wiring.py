"""The composition root's piece for MCP outbound: the deps, the handle, the child spec."""

from __future__ import annotations

import contextlib
from typing import Any

from actors.calls.dispatcher import DispatcherActor
from actors.directory import Directory
from actors.gate.policy import PolicyActor
from actors.mcp.connections import McpConnections, McpHandle
from actors.mcp.deps import McpDeps, preload
from chalie.process.supervision import ChildSpec


class McpWiring:
    """The composition root's piece for MCP outbound, built inside ``child_specs``.

    Building it registers every cached proxy (so the discovery actor, which
    starts later, indexes them from its first build, offline), makes the
    handle the MCP executor uses (``parts={"mcp": wiring.handle}``), puts the
    management operations in ``services.mcp`` for the mcp_manager
    ability, and gives the tree its child spec (``wiring.spec``).
    """

    def __init__(self, rt: Any) -> None:
        from actors.mcp.asks import ServerAsks
        from chalie.mcp.admin import McpAdmin

        self.directory = Directory()
        asks = ServerAsks(
            rt.config.mcp,
            rt.db_path,
            rt.child("policy", PolicyActor),
            rt.events,
            dict(rt.config.models),
            approval_expiry=rt.config.approval_expiry,
            trail=rt.child("dispatcher", DispatcherActor),
        )
        deps = McpDeps(
            db_path=rt.db_path,
            home=rt.config.home,
            config=rt.config.mcp,
            loop=rt.loop,
            registry=rt.registry,
            discovery=rt.services.discovery,
            policy=rt.child("policy", PolicyActor),
            errlog_dir=rt.config.home / "logs",
            asks=asks,
        )
        self.deps = deps
        self.handle = McpHandle(
            self.directory, deps.routes, rt.loop, rt.events, turns=rt.services.turns
        )
        preload(deps)

        def reload() -> None:
            with contextlib.suppress(Exception):
                rt.child("mcp", McpConnections).within(30).call(McpConnections.reload)

        rt.services.mcp = McpAdmin(rt.db_path, rt.config.home, on_change=reload)
        rt.services.loop = rt.loop
        directory = self.directory
        self.spec = ChildSpec(
            "mcp", lambda: McpConnections.start(deps, directory=directory), shutdown=60.0
        )

"""McpConnections: the supervisor of one McpConnectionActor per enabled server, and its handle.

The connection actor is :mod:`actors.mcp.connection`; what the connections share is
:mod:`actors.mcp.deps`; the composition root's piece that builds them is
:mod:`chalie_app.mcp_wiring`.
"""

from __future__ import annotations

import contextlib
import logging
import random
from typing import Any

import pykka

from actors.actor import tell_quietly
from actors.child_ref import ChildRef, ChildUnavailable
from actors.directory import Directory
from actors.loop import EventLoopThread
from actors.mcp.connection import STOP_GRACE, McpConnectionActor, child_id
from actors.mcp.deps import McpDeps, announce, serve_skills
from actors.process.supervisor import Supervisor
from chalie.mcp.connection_view import ConnectionView
from chalie.mcp.proxy import Installed, install, uninstall
from chalie.mcp.spec import ServerSpec
from chalie.mcp.store import CHANGED, McpStore, daemon_id
from chalie.process.supervision import ChildSpec
from chalie.store.sql import Follower, follow
from chalie.wire.actor_messages import RefreshServer
from chalie.wire.bus import EventBus
from chalie.wire.mcp_names import server_of

log = logging.getLogger("chalie.mcp")


class McpConnections(Supervisor):
    """One McpConnectionActor per enabled server, children added and removed at run time.

    ``reload()`` reconciles the children with the store: a new or re-enabled
    server gets a child, a removed or disabled one loses it (its proxies stay
    registered as refusing ones while the server exists), a changed spec
    restarts it, and every child re-reads its rows (approvals).
    """

    def __init__(self, deps: McpDeps, *, directory: Directory | None = None, **kwargs: Any) -> None:
        # the directory is shared across restarts: the executor keeps it
        super().__init__([], directory=directory, **kwargs)
        self._deps = deps
        self._specs: dict[str, ServerSpec] = {}
        self._store: McpStore | None = None
        self._follower: Follower | None = None

    def on_start(self) -> None:
        super().on_start()
        self._store = McpStore(self._deps.db_path, daemon=daemon_id(self._deps.home))
        me = self.actor_ref

        def changed(_payload: str) -> None:  # an operator's change, on any daemon
            with contextlib.suppress(pykka.ActorDeadError):
                me.proxy().reload()

        self._follower = follow(self._deps.db_path, CHANGED, changed)
        self._reconcile(starting=True)

    def on_stop(self) -> None:
        if self._follower is not None:
            self._follower.close()
        super().on_stop()

    def on_failure(self, *exc: Any) -> None:
        if self._follower is not None:
            self._follower.close()  # a restart follows anew
        super().on_failure(*exc)
        if self._store is not None:
            self._store.close()
        aclose = getattr(self._deps.asks, "aclose", None)
        if aclose is not None:  # the sampling model's connections, on the loop
            with contextlib.suppress(Exception):
                self._deps.loop.submit(aclose()).result(5)

    # -- dynamic children ---------------------------------------------------------------
    def _add(self, spec: ServerSpec, delay: float = 0.0) -> None:
        deps = self._deps
        self._specs[spec.name] = spec
        self.add_child(
            ChildSpec(
                child_id(spec.name),
                lambda: McpConnectionActor.start(spec, deps, delay=delay),
                shutdown=STOP_GRACE + 1,
            )
        )

    def _drop(self, name: str) -> None:
        self._specs.pop(name, None)
        self.remove_child(child_id(name))

    def _reconcile(self, *, starting: bool = False) -> dict[str, Any]:
        assert self._store is not None
        deps = self._deps
        rows = self._store.tools()
        servers = {s.name: s.spec for s in self._store.servers()}
        stopped, started = [], []
        for name in list(self._specs):
            spec = servers.get(name)
            if spec is None or not spec.enabled or spec != self._specs[name]:
                self._drop(name)
                stopped.append(name)
        # proxies of servers that no longer exist leave the registry
        known = {e.name for e in deps.registry if server_of(e.name) is not None}
        gone = [n for n in known if server_of(n) not in servers]
        dropped = uninstall(deps.registry, gone)
        announce(deps, Installed(drop=dropped))
        for server in sorted({s for n in gone if (s := server_of(n)) is not None}):
            serve_skills(deps, server, [])  # its prompts leave find_skills too
        for name, spec in servers.items():
            if name in self._specs:
                continue  # a running child owns its server's proxies (it re-reads on RefreshServer)
            announce(
                deps,
                install(
                    deps.registry,
                    [r for r in rows if r.server == name],
                    enabled=spec.enabled,
                    timeout=deps.timeout(spec),
                    channels=spec.channels,
                ),
            )
            if spec.enabled:
                base = deps.config.start_delay if starting else 0.0
                self._add(spec, random.uniform(base, 2 * base))
                started.append(name)
        for name in self._specs:
            if name not in started:
                ref = self.child(child_id(name))
                if ref is not None:
                    tell_quietly(ref, RefreshServer())
        return {"started": started, "stopped": stopped, "unregistered": len(gone)}

    def reload(self) -> dict[str, Any]:
        """Bring the children in line with the store (after any ``chalie mcp`` change)."""
        return self._reconcile()

    def servers(self) -> list[str]:
        return sorted(self._specs)


class McpHandle:
    """What the MCP executor needs: the published routes, the loop, the connection actors."""

    def __init__(
        self,
        directory: Directory,
        routes: dict[str, ConnectionView],
        loop: EventLoopThread,
        bus: EventBus | None = None,
        *,
        turns: Any = None,
    ) -> None:
        self.directory = directory
        self.routes = routes
        self.loop = loop
        self.bus = bus  # where a call's progress is published
        # the turns' injected tools (chalie.services.TurnTools): a result's resource link
        # makes its server's resources proxy callable in the turn
        self.turns = turns

    def connection(self, server: str) -> ChildRef[McpConnectionActor]:
        return self.directory.ref(child_id(server), McpConnectionActor)

    def tell(self, server: str, message: Any) -> None:
        """Raises ChildUnavailable when the server has no running connection."""
        self.connection(server).tell(message)

    def status(self, server: str, timeout: float = 5.0) -> dict[str, Any] | None:
        try:
            return self.connection(server).within(timeout).call(McpConnectionActor.status)
        except (ChildUnavailable, pykka.Timeout):
            return None

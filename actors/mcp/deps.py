"""What the MCP connection actors share: their dependencies and the side thread for updates.

The side thread applies discovery and policy updates in order, so no connection waits on
an embedder or on the PolicyActor.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from actors.child_ref import ChildRef
from actors.gate.policy import PolicyActor
from actors.loop import EventLoopThread
from chalie.calls.registry import Registry
from chalie.discovery.engine import registry_docs
from chalie.mcp.connection_view import ConnectionView
from chalie.mcp.peer import Asks
from chalie.mcp.proxy import Installed, install_cached
from chalie.mcp.spec import ServerSpec
from chalie.process.config import McpConfig
from chalie.store.store_place import Place
from chalie.wire import messages

log = logging.getLogger("chalie.mcp")

ANNOUNCE_ATTEMPTS: Final = 10
ANNOUNCE_RETRY: Final = 3.0


class SideWork:
    """One thread applying discovery and policy updates in order; no connection waits on them."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="mcp-side-work", daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], None]) -> None:
        with self._lock:
            self._pending += 1
            self._idle.clear()
        self._queue.put(work)

    def _run(self) -> None:
        while True:
            work = self._queue.get()
            if work is None:
                return
            try:
                work()
            except Exception:
                log.exception("an MCP index or policy update failed")
            finally:
                with self._lock:
                    self._pending -= 1
                    if not self._pending:
                        self._idle.set()

    def wait_idle(self, timeout: float) -> bool:
        return self._idle.wait(timeout)

    def close(self) -> None:
        self._queue.put(None)


@dataclass
class McpDeps:
    """Everything a connection needs, built once by the composition root."""

    db_path: Place
    home: Path
    config: McpConfig
    loop: EventLoopThread
    registry: Registry
    discovery: Any = None  # actors.discovery.DiscoveryHandle
    policy: ChildRef[PolicyActor] | None = None
    side: SideWork = field(default_factory=SideWork)
    errlog_dir: Path | None = None
    # server → the ConnectionView its actor last published (read by the MCP executor, lock-free)
    routes: dict[str, ConnectionView] = field(default_factory=dict)
    # where servers' sampling and elicitation requests go (None: refused and declined)
    asks: Asks | None = None

    def timeout(self, spec: ServerSpec) -> float:
        return spec.timeout(self.config.call_timeout)


def announce(deps: McpDeps, change: Installed) -> None:
    """Hand the discovery index what an install changed (on the side thread)."""
    if deps.discovery is None or not (change.index or change.drop):
        return
    docs = registry_docs(change.index)
    drop = list(change.drop)

    def work() -> None:
        # The index may still be building at start-up (the handle then times out): retry.
        for attempt in range(ANNOUNCE_ATTEMPTS):
            try:
                if drop:
                    deps.discovery.remove(drop)
                if docs:
                    deps.discovery.add(docs)
                return
            except Exception as exc:
                if attempt == ANNOUNCE_ATTEMPTS - 1:
                    raise
                log.info("discovery did not take the MCP update yet (%s); retrying", exc)
                time.sleep(ANNOUNCE_RETRY)

    deps.side.submit(work)


def serve_skills(deps: McpDeps, server: str, skills: list[Any]) -> None:
    """Hand discovery the playbooks (prompts) a server serves now (on the side thread)."""
    if deps.discovery is None or not hasattr(deps.discovery, "serve_skills"):
        return

    def work() -> None:
        for attempt in range(ANNOUNCE_ATTEMPTS):
            try:
                deps.discovery.serve_skills(server, skills)
                return
            except Exception as exc:
                if attempt == ANNOUNCE_ATTEMPTS - 1:
                    raise
                log.info("discovery did not take %s's prompts yet (%s); retrying", server, exc)
                time.sleep(ANNOUNCE_RETRY)

    deps.side.submit(work)


def back_to_ask(deps: McpDeps, proxies: list[str]) -> None:
    """A quarantined tool's policy returns to ask on every channel (explicit rows beat ``*``)."""
    policy = deps.policy
    if policy is None or not proxies:
        return

    def work() -> None:
        for proxy in proxies:
            for channel in messages.CHANNELS:
                policy.within(10).call(PolicyActor.set, channel, proxy, "ask")

    deps.side.submit(work)


def preload(deps: McpDeps) -> None:
    """Register every cached proxy before any child starts (discovery indexes them offline)."""
    install_cached(deps.registry, deps.db_path, deps.config.call_timeout)

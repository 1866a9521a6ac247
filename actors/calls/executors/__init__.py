"""The executors, one module each, and the one table that picks one per ability's ``isolation``.

A new way to run tools is one module here and one row in :data:`EXECUTORS`:
the dispatcher builds every registered executor at start from an
:class:`ExecutorEnv` and never branches on the isolation itself. Where the
``process`` abilities run is the ``[workers] engine`` setting, one row of
:data:`WORKER_ENGINES` each (the daemon's own worker processes, or a Ray
cluster); an engine's module is imported only when it is chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from actors.calls.executors.immediate import ImmediateExecutor
from actors.calls.executors.inline import DEFAULT_LANE_QUEUE, InlineExecutor
from actors.calls.executors.mcp import McpExecutor
from actors.calls.executors.process import ProcessExecutor, WorkerPool
from actors.directory import Directory
from chalie.calls.execution import Executor
from chalie.process.config import WorkersConfig
from chalie.services import Services


@dataclass(frozen=True)
class ExecutorEnv:
    """What an executor may need to start: settings and the runtime parts it talks to."""

    inline_threads: int = 16
    lane_limit: int | None = None
    lane_queue: int = DEFAULT_LANE_QUEUE
    workers: WorkerPool | None = None
    services: Services = field(default_factory=Services)
    # The supervisor tree's children: an executor finds the actor it talks to with
    # ``env.children.ref("mcp", McpConnections)`` (a typed, restart-proof ChildRef).
    children: Directory = field(default_factory=Directory)
    # Anything else a test or a future executor is handed by name.
    parts: Mapping[str, Any] = field(default_factory=dict)
    # [workers]: which engine runs the process abilities, and its settings.
    worker_settings: WorkersConfig = field(default_factory=WorkersConfig)
    # The drop-in folder (an engine on other hosts ships it there).
    dropins: Path | None = None


Factory = Callable[[ExecutorEnv], Executor]


def _lanes(env: ExecutorEnv) -> InlineExecutor:
    return InlineExecutor(env.inline_threads, env.lane_limit, env.lane_queue)


def _ray(env: ExecutorEnv) -> Executor:
    from actors.calls.executors.ray_tasks import RayExecutor  # imports Ray when it connects

    return RayExecutor(env.worker_settings, env.dropins)


# [workers] engine -> factory of the executor the process abilities run on.
WORKER_ENGINES: Final[dict[str, Factory]] = {
    "local": lambda env: ProcessExecutor(env.workers),
    "ray": _ray,
}

# isolation -> factory. The one table: add a row to add a way to run tools.
EXECUTORS: Final[dict[str, Factory]] = {
    "immediate": lambda env: ImmediateExecutor(_lanes(env)),
    "inline": _lanes,
    "process": lambda env: WORKER_ENGINES[env.worker_settings.engine](env),
    "mcp": lambda env: McpExecutor(env.parts.get("mcp")),
}


def build(env: ExecutorEnv, table: Mapping[str, Factory] | None = None) -> dict[str, Executor]:
    """One executor per registered isolation."""
    return {isolation: make(env) for isolation, make in (table or EXECUTORS).items()}


__all__ = ["EXECUTORS", "WORKER_ENGINES", "ExecutorEnv", "Factory", "build"]

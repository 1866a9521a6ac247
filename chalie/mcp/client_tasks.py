"""Client-side tasks (MCP 2025-11-25): a server's sampling or elicitation run as a task here.

A server that sees ``tasks.requests.sampling.createMessage`` (or
``tasks.requests.elicitation.create``) in our capabilities may send its
``sampling/createMessage`` / ``elicitation/create`` with a ``task`` field
(server-everything's ``trigger-sampling-request-async`` and
``trigger-elicitation-request-async`` do). Lifecycle of one such task, in order:

1. The request is answered at once with a ``CreateTaskResult`` (status ``working``);
   the request itself (without ``task``) runs in the background through the session's
   own callbacks: the same gate, budget and questions to the owner as a plain one
   (chalie.mcp.peer).
2. The server polls ``tasks/get`` (the task's status, at our ``pollInterval``), may
   ``tasks/list`` or ``tasks/cancel`` it, and fetches ``tasks/result``, which waits for
   the end: the result the plain request would have had (with the related-task
   ``_meta``), or its error.
3. A task is dropped ``ttl`` ms after its creation (the server's, bounded by
   :data:`MAX_TTL`), and every task still running is cancelled when the session ends.

The SDK advertises no task capability and routes no ``tasks/*`` request to a client
(METHOD_NOT_FOUND); :class:`TaskClient` adds both to its session, the SDK's one seam
for them (its private ``_build_capabilities`` and ``_on_request``, as
``chalie.mcp.session`` already sends raw task requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from mcp import Client, MCPError
from mcp_types import (
    INVALID_PARAMS,
    ClientTasksCapability,
    ClientTasksRequestsCapability,
    TasksCancelCapability,
    TasksCreateElicitationCapability,
    TasksCreateMessageCapability,
    TasksElicitationCapability,
    TasksListCapability,
    TasksSamplingCapability,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

# The requests a server may send as tasks.
AUGMENTABLE: Final = frozenset({"sampling/createMessage", "elicitation/create"})
POLL_INTERVAL_MS: Final = 500  # what tasks/get suggests
MAX_TTL: Final = 3_600_000  # ms a task is kept at most (a server asking more gets this)
MAX_TASKS: Final = 64  # tasks a session holds at once; past it a new one is refused
RELATED: Final = "io.modelcontextprotocol/related-task"
TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})

Handler = Callable[[Any, str, Mapping[str, Any] | None], Awaitable[dict[str, Any]]]


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


@dataclass
class _Task:
    task_id: str
    ttl: int
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    status: str = "working"
    message: str | None = None
    result: dict[str, Any] | None = None
    error: MCPError | None = None
    runner: asyncio.Task[None] | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "taskId": self.task_id,
            "status": self.status,
            "createdAt": _iso(self.created),
            "lastUpdatedAt": _iso(self.updated),
            "ttl": self.ttl,
            "pollInterval": POLL_INTERVAL_MS,
        }
        if self.message:
            out["statusMessage"] = self.message
        return out

    def end(self, status: str, message: str | None = None) -> None:
        if self.status in TERMINAL:
            return
        self.status, self.message, self.updated = status, message, time.time()
        self.ended.set()


class ClientTasks:
    """One session's client-side tasks (on the session's loop only)."""

    def __init__(self) -> None:
        self._tasks: dict[str, _Task] = {}

    def capability(self) -> ClientTasksCapability:
        return ClientTasksCapability(
            list=TasksListCapability(),
            cancel=TasksCancelCapability(),
            requests=ClientTasksRequestsCapability(
                sampling=TasksSamplingCapability(create_message=TasksCreateMessageCapability()),
                elicitation=TasksElicitationCapability(create=TasksCreateElicitationCapability()),
            ),
        )

    async def handle(
        self, plain: Handler, dctx: Any, method: str, params: Mapping[str, Any] | None
    ) -> dict[str, Any] | None:
        """The answer to a request this module serves, or None: ``plain`` answers it."""
        self._prune()
        if method in AUGMENTABLE and params is not None and isinstance(params.get("task"), dict):
            return self._start(plain, dctx, method, params)
        if method == "tasks/get":
            return self._find(params).view()
        if method == "tasks/result":
            return await self._result(self._find(params))
        if method == "tasks/cancel":
            task = self._find(params)
            if task.status in TERMINAL:
                raise MCPError(INVALID_PARAMS, f"task {task.task_id} has already ended")
            if task.runner is not None:
                task.runner.cancel()
            task.end("cancelled", "cancelled by the server")
            return task.view()
        if method == "tasks/list":
            return {"tasks": [t.view() for t in self._tasks.values()]}
        return None

    def close(self) -> None:
        """The session ended: every running task is cancelled."""
        for task in self._tasks.values():
            if task.runner is not None:
                task.runner.cancel()
            task.end("cancelled", "the session ended")
        self._tasks.clear()

    # -- the steps ---------------------------------------------------------------------------
    def _start(
        self, plain: Handler, dctx: Any, method: str, params: Mapping[str, Any]
    ) -> dict[str, Any]:
        if len(self._tasks) >= MAX_TASKS:
            raise MCPError(INVALID_PARAMS, f"at most {MAX_TASKS} tasks at once; retry later")
        asked = params["task"].get("ttl")
        ttl = min(MAX_TTL, asked) if isinstance(asked, int) and asked > 0 else MAX_TTL
        task = _Task(task_id=uuid.uuid4().hex, ttl=ttl)
        request = {k: v for k, v in params.items() if k != "task"}

        async def run() -> None:
            try:
                result = await plain(dctx, method, request)
            except MCPError as exc:
                task.error = exc
                task.end("failed", exc.error.message[:300])
            except Exception as exc:  # a fault in the callback: the server hears it failed
                task.error = MCPError(-32603, f"the {method} task failed ({type(exc).__name__})")
                task.end("failed", task.error.error.message)
            else:
                task.result = {**result, "_meta": {RELATED: {"taskId": task.task_id}}}
                task.end("completed")

        task.runner = asyncio.get_running_loop().create_task(run())
        self._tasks[task.task_id] = task
        return {"task": task.view()}

    def _find(self, params: Mapping[str, Any] | None) -> _Task:
        task_id = (params or {}).get("taskId")
        task = self._tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            raise MCPError(INVALID_PARAMS, f"no task {str(task_id)[:64]!r}")
        return task

    async def _result(self, task: _Task) -> dict[str, Any]:
        await task.ended.wait()
        if task.result is not None:
            return task.result
        if task.error is not None:
            raise task.error
        raise MCPError(-32603, f"task {task.task_id} was {task.status}")

    def _prune(self) -> None:
        now = time.time()
        for task_id, task in list(self._tasks.items()):
            if now - task.created > task.ttl / 1000:
                if task.runner is not None:
                    task.runner.cancel()
                del self._tasks[task_id]


@dataclass
class TaskClient(Client):
    """The SDK's Client whose session serves client-side tasks (:class:`ClientTasks`)."""

    client_tasks: ClientTasks | None = None

    async def _build_session(self, exit_stack: contextlib.AsyncExitStack) -> Any:
        session = await super()._build_session(exit_stack)
        tasks = self.client_tasks
        if tasks is None:
            return session
        plain_request = session._on_request
        plain_capabilities = session._build_capabilities
        exit_stack.callback(tasks.close)

        async def on_request(dctx: Any, method: str, params: Mapping[str, Any] | None) -> Any:
            answer = await tasks.handle(plain_request, dctx, method, params)
            return answer if answer is not None else await plain_request(dctx, method, params)

        def capabilities(version: str) -> Any:
            caps = plain_capabilities(version)
            if version in MODERN_PROTOCOL_VERSIONS:
                return caps  # tasks are a 2025-11-25 feature
            return caps.model_copy(update={"tasks": tasks.capability()})

        setattr(session, "_on_request", on_request)  # noqa: B010 (the SDK's one seam)
        setattr(session, "_build_capabilities", capabilities)  # noqa: B010
        return session

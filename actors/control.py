"""The control actor: the tree's child that owns the control endpoint, its commands and its desk.

It builds, in order, the :class:`~chalie.call_desk.CallDesk` for CLI tool
calls, the :class:`~actors.control_commands.ControlCommands` and their routing
table, and the :class:`~actors.control_server.ControlEndpoint` that serves
them; it fails (and the supervisor restarts it) when the endpoint stops
serving, and closes all three when it stops.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any

import pykka

from actors.control_commands import ControlCommands, ControlHost
from actors.control_server import ControlEndpoint
from actors.loop import EventLoopThread
from actors.supervisor import SupervisedActor
from chalie.call_desk import CallDesk
from chalie.events import EventBus
from chalie.messages import EndpointDied, ToolCall, ToolOutcome
from chalie.routing import Route, Router


class ControlActor(SupervisedActor):
    """The tree's child for the control endpoint: starts it, stops it, fails when it dies."""

    def __init__(
        self,
        host: ControlHost,
        *,
        home: Path,
        loop: EventLoopThread,
        events: EventBus,
        dispatch: Callable[[ToolCall], Future[ToolOutcome]],
        end_turn: Callable[[str], None] | None = None,
        routes: Sequence[Route[Any]] = (),
    ) -> None:
        super().__init__()
        # The operator may call any registered tool and need not write an act_summary.
        desk = CallDesk(
            events,
            dispatch,
            channel="chat",
            human_present=True,
            prefix="cli",
            scope="unrestricted",
            initiator="framework",
            end_turn=end_turn,
        )
        self._commands = ControlCommands(host, desk)
        # ``routes``: other children's commands (conversations), rows beside ours.
        self._endpoint = ControlEndpoint(home, loop, Router([*self._commands.routes(), *routes]))

    def on_start(self) -> None:
        self._endpoint.start()
        self._endpoint.on_exit(self._endpoint_exited)

    def _endpoint_exited(self, error: BaseException | None) -> None:
        # Runs on the loop thread: hand the failure to the actor, whose
        # on_receive raising under a tell fails it, and the supervisor restarts it.
        with contextlib.suppress(pykka.ActorDeadError):
            self.actor_ref.tell(EndpointDied(error))

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, EndpointDied):
            raise RuntimeError(f"control endpoint stopped serving: {message.error!r}")
        return None

    def on_stop(self) -> None:
        self._close()

    def on_failure(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close()

    def _close(self) -> None:
        self._endpoint.stop()
        self._commands.close()

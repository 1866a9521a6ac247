"""The control actor: the tree's child that owns the control endpoint, its commands and its desk.

It builds, in order, the :class:`~chalie.calls.direct_calls.DirectCalls` for CLI tool
calls, the :class:`~actors.process.control_commands.ControlCommands` and their routing
table, and the :class:`~actors.process.control_server.ControlEndpoint` that serves
them; it fails (and the supervisor restarts it) when the endpoint stops
serving, and closes all three when it stops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from actors.host import Host
from actors.loop import EventLoopThread
from actors.process.control_commands import ControlCommands
from actors.process.control_server import ControlEndpoint
from actors.process.serving import ServingActor
from chalie.calls.direct_calls import DirectCalls
from chalie.process.routing import Route, Router
from chalie.wire.bus import EventBus
from chalie.wire.messages import ToolCall, ToolOutcome


class ControlActor(ServingActor):
    """The tree's child for the control endpoint: starts it, stops it, fails when it dies."""

    serving = "the control endpoint"

    def __init__(
        self,
        host: Host,
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
        desk = DirectCalls(
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
        self.stopped_serving(repr(error))

    def close(self) -> None:
        self._endpoint.stop()
        self._commands.close()

"""A routing table for request/reply commands: one :class:`Route` a command, one :class:`Router`.

A route is a row: the command's name, the Struct its arguments must match,
and the handler that answers it. The router checks a raw frame against the
table (size, encoding, name, arguments) before anything acts on it, and runs
the handler so that no fault inside one escapes as anything but a structured
``internal-error`` reply. The control socket uses it today; a chat bridge's
commands can use the same shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from chalie.process import control
from chalie.wire.messages import ControlReply

log = logging.getLogger("chalie.process.routing")

A = TypeVar("A", bound=control.Args)


@dataclass(frozen=True)
class Route(Generic[A]):
    """One command: ``name``, its argument type, and ``handler(args) -> ControlReply``."""

    name: str
    args: type[A]
    handler: Callable[[A], ControlReply]


class Router:
    """Checks requests against its routes and runs the matching handler."""

    def __init__(self, routes: Iterable[Route[Any]]) -> None:
        self._routes: dict[str, Route[Any]] = {}
        for route in routes:
            if route.name in self._routes:
                raise ValueError(f"two routes for the command {route.name!r}")
            self._routes[route.name] = route

    @property
    def commands(self) -> Mapping[str, type[control.Args]]:
        return {name: route.args for name, route in self._routes.items()}

    def parse(self, frame: bytes) -> tuple[Route[Any], control.Args] | ControlReply:
        """The route and the checked arguments, or the error reply to send back."""
        parsed = control.parse_request(frame, self.commands)
        if isinstance(parsed, ControlReply):
            return parsed
        command, args = parsed
        return self._routes[command], args

    def run(self, route: Route[Any], args: control.Args) -> ControlReply:
        """The handler's reply; any exception becomes an ``internal-error`` reply, logged."""
        try:
            return route.handler(args)
        except Exception as exc:
            log.exception("control command %s failed", route.name)
            return control.failure(
                control.INTERNAL, f"{route.name} failed: {type(exc).__name__}: {exc}"
            )

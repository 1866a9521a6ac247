"""ServingActor: a supervised actor that owns a server running on the event loop.

Lifecycle, in order:

1. The subclass's ``on_start`` starts its server on the loop.
2. If the server stops serving without being asked, the loop thread calls
   :meth:`ServingActor.stopped_serving`, which tells the actor
   :class:`~chalie.wire.actor_messages.EndpointDied`; handling it raises, so the actor
   fails and its supervisor restarts it (with a fresh server).
3. ``on_end`` (from ``on_stop``, or from ``on_failure``, which pykka runs
   instead of ``on_stop`` after a failed message) calls the subclass's
   :meth:`close` once.
"""

from __future__ import annotations

from typing import Any

from actors.actor import SupervisedActor, tell_quietly
from chalie.wire.actor_messages import EndpointDied


class ServingActor(SupervisedActor):
    """See the module docstring; subclasses set ``serving`` and implement ``close``."""

    # What the actor serves, for the failure's message ("the MCP server", ...).
    serving = "the server"

    def stopped_serving(self, error: str) -> None:
        """From any thread: the server ended unexpectedly; the actor fails on its own thread."""
        tell_quietly(self.actor_ref, EndpointDied(self.serving, error))

    def close(self) -> None:
        """Stop the server and release what the actor holds (idempotent)."""

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, EndpointDied):
            raise RuntimeError(f"{message.what} stopped serving: {message.error}")
        return super().on_receive(message)

    def on_end(self) -> None:
        self.close()

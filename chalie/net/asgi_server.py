"""The uvicorn server every HTTP server of ours runs: it stops when asked, not at a clock's tick.

uvicorn's own :class:`uvicorn.Server` notices ``should_exit`` in a main loop that sleeps
0.1 s between looks, and its shutdown sleeps a fixed 0.1 s after asking the connections to
close, then looks again every 0.1 s until they have: every stop costs 0.1-0.3 s, however
idle the server. This one keeps uvicorn's protocol, its startup and its duties per tick
(the Date header, the request limit), and changes how it waits:

1. :meth:`Server.exit` (from any thread) sets ``should_exit`` and wakes the main loop at
   once. ``should_exit`` set directly (uvicorn's signal handlers) is still seen at the next
   tick.
2. :meth:`Server.shutdown` stops listening, asks every connection to close, and waits until
   the last connection and the last request task have ended, woken by each one's end
   (never by a clock), for at most ``timeout_graceful_shutdown`` seconds; then it cancels
   the tasks left and, unless ``force_exit``, runs the lifespan shutdown, as uvicorn does.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Final, TypeVar

import uvicorn

log = logging.getLogger("chalie.net.asgi_server")

T = TypeVar("T")

# uvicorn's tick: its date header is refreshed every 10 ticks.
TICK: Final = 0.1


class _Watched(set[T]):
    """A set that calls ``left`` each time a member leaves it."""

    def __init__(self, left: Callable[[], None]) -> None:
        super().__init__()
        self._left = left

    def discard(self, item: object) -> None:
        super().discard(item)
        self._left()

    def remove(self, item: T) -> None:
        super().remove(item)
        self._left()


class Server(uvicorn.Server):
    """A uvicorn server whose stop waits on events, not on a clock."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._wake = asyncio.Event()
        self._left = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # uvicorn's protocols add themselves and their tasks to these, and take themselves
        # out when they end: each removal wakes a shutdown waiting for the last one.
        self.server_state.connections = _Watched(self._left.set)
        self.server_state.tasks = _Watched(self._left.set)

    def exit(self) -> None:
        """Ask the server to stop (from any thread): its main loop wakes at once."""
        self.should_exit = True
        loop = self._loop  # set before the main loop's first look at should_exit
        if loop is None:
            return  # not in its main loop yet: it sees should_exit at its first tick
        try:
            loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:
            pass  # the loop is closed: the server is gone already

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            try:
                async with asyncio.timeout(TICK):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                while (state.connections or state.tasks) and not self.force_exit:
                    self._left.clear()
                    await self._left.wait()
        except TimeoutError:
            log.warning(
                "cancelling %d request task(s) still running at the end of the graceful shutdown",
                len(state.tasks),
            )
            for task in list(state.tasks):
                task.cancel()
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()

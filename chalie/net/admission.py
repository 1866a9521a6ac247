"""What an HTTP listener admits: a cap on its connections, a deadline on incomplete requests.

A thousand half-open TCP connections used to take every file descriptor of
the daemon, and the next ZeroMQ socket (the control socket, the chat socket)
made libzmq abort the process. Three rules, in order, hold that off:

1. **A reserve of descriptors.** :func:`raise_descriptor_limit` lifts the soft
   ``RLIMIT_NOFILE`` to the hard one at start; :func:`connection_cap` gives
   each listener at most its share of what is left once :data:`RESERVE_SHARE`
   (at least :data:`RESERVE_MIN`) is kept for everything else: ZeroMQ, SQLite,
   worker pipes, outbound MCP connections.
2. **A cap per listener.** :class:`Admission` counts the HTTP connections a
   listener holds; past its cap the oldest connection that has not finished
   sending a request is closed to make room (a flood of half-open connections
   evicts itself, a real client's request arrives in milliseconds); if every
   connection is busy, the newcomer is closed at once.
3. **A deadline on each request.** A request (its headers and body) must
   arrive within ``request_timeout`` of its first byte, or of the connection's
   opening; otherwise the connection is closed. Idle keep-alive connections
   are uvicorn's own ``timeout_keep_alive``.

:func:`guarded_protocol` makes the uvicorn ``httptools`` protocol class that
applies an :class:`Admission`; everything runs on the server's event loop.
A WebSocket leaves the count once upgraded (the chat bridge caps its clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("chalie.net.admission")

RESERVE_MIN: Final = 128
RESERVE_SHARE: Final = 0.25
MIN_CAP: Final = 16


def raise_descriptor_limit() -> int:
    """Lift the soft descriptor limit to the hard one (as far as allowed); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return int(soft)


def reserve(limit: int) -> int:
    """Descriptors no listener may take."""
    return max(RESERVE_MIN, int(limit * RESERVE_SHARE))


def connection_cap(configured: int, *, listeners: int = 2, limit: int | None = None) -> int:
    """The connections one listener may hold: its configured cap within its fair share."""
    if limit is None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        limit = 1 << 20 if soft == resource.RLIM_INFINITY else int(soft)
    share = (limit - reserve(limit)) // max(1, listeners)
    return max(MIN_CAP, min(configured, share))


@dataclass
class AdmissionStats:
    admitted: int = 0
    evicted: int = 0  # closed to make room: had not finished a request
    refused: int = 0  # closed at once: every connection was busy
    timed_out: int = 0  # their request did not arrive in time


class Admission:
    """One listener's connections: the cap, the incomplete ones by age, their deadlines."""

    def __init__(self, name: str, cap: int, request_timeout: float) -> None:
        self.name = name
        self.cap = cap
        self.request_timeout = request_timeout
        self.stats = AdmissionStats()
        self._open: set[Any] = set()
        # Connections whose request has not fully arrived, oldest first, with their deadline.
        self._waiting: OrderedDict[Any, asyncio.TimerHandle] = OrderedDict()

    @property
    def held(self) -> int:
        return len(self._open)

    @property
    def incomplete(self) -> int:
        return len(self._waiting)

    def admit(self, conn: Any, loop: asyncio.AbstractEventLoop) -> bool:
        """Count a new connection; False (and it must be closed) when there is no room."""
        if len(self._open) >= self.cap:
            if not self._waiting:
                self.stats.refused += 1
                return False
            oldest = next(iter(self._waiting))
            self.stats.evicted += 1
            self._close(oldest)
        self._open.add(conn)
        self.stats.admitted += 1
        self.waiting(conn, loop)
        return True

    def waiting(self, conn: Any, loop: asyncio.AbstractEventLoop) -> None:
        """A request has begun (or the connection opened): it must arrive by the deadline."""
        if conn in self._waiting or conn not in self._open:
            return
        self._waiting[conn] = loop.call_later(self.request_timeout, self._expire, conn)

    def arrived(self, conn: Any) -> None:
        """The request is in: no deadline until the next one begins."""
        timer = self._waiting.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def release(self, conn: Any) -> None:
        """The connection closed, or left HTTP (a WebSocket upgrade)."""
        self.arrived(conn)
        self._open.discard(conn)

    def _expire(self, conn: Any) -> None:
        if conn in self._waiting:
            self.stats.timed_out += 1
            self._close(conn)

    def _close(self, conn: Any) -> None:
        self.release(conn)
        transport = getattr(conn, "transport", None)
        if transport is not None:
            transport.abort()


def guarded_protocol(admission: Admission) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, applying ``admission`` to every connection."""

    class Guarded(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if not admission.admit(self, self.loop):
                log.warning(
                    "connection refused: every connection is busy",
                    extra={"listener": admission.name, "cap": admission.cap},
                )
                transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            admission.release(self)
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            admission.waiting(self, self.loop)
            super().on_message_begin()

        def on_message_complete(self) -> None:
            admission.arrived(self)
            super().on_message_complete()

        def handle_websocket_upgrade(self) -> None:
            admission.release(self)
            super().handle_websocket_upgrade()

    Guarded.__name__ = f"Guarded{admission.name.title().replace('-', '')}"
    return Guarded

"""The control endpoint: a ZeroMQ ROUTER on ipc://<home>/control.sock, served on the loop thread.

Lifecycle, in order:

1. :meth:`ControlEndpoint.start` binds the socket (the file chmod 0600) from a
   coroutine on the daemon's :class:`~actors.loop.EventLoopThread`.
2. Each request frame is checked by the :class:`~chalie.process.routing.Router`; a
   bad one is answered with a structured error at once, on the loop.
3. A good one runs its route's handler on a small thread pool, so a slow
   command (a tool call waiting for a human's approval, a long-poll) never
   holds up ``status`` from another terminal; the reply goes back to that
   client only.
4. Any fault inside a handler becomes an ``internal-error`` reply and is
   logged (:meth:`Router.run`): the endpoint keeps serving.
5. :meth:`ControlEndpoint.stop` cancels the serving task, closes the socket
   and removes the socket file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

import zmq
import zmq.asyncio

from actors.loop import EventLoopThread
from chalie.process import control
from chalie.process.routing import Router
from chalie.wire.messages import ControlReply

log = logging.getLogger("chalie.process.control")

# A frame larger than this makes libzmq drop the peer before we read it:
# a memory bound. Requests between MAX_REQUEST_BYTES and this are answered
# with oversized-request.
_TRANSPORT_LIMIT: Final = 8 * 1024 * 1024
_MAX_IN_FLIGHT: Final = 64


class ControlEndpoint:
    """Serves control requests for one daemon; ``router`` checks each and runs its handler."""

    def __init__(
        self, home: Path, loop: EventLoopThread, router: Router, *, threads: int = 8
    ) -> None:
        self.home = home
        self._loop = loop
        self._router = router
        self._pool = concurrent.futures.ThreadPoolExecutor(
            threads, thread_name_prefix="chalie-control"
        )
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._inode: int | None = None
        self._on_exit: Callable[[BaseException | None], None] | None = None
        self._in_flight = 0
        self.served = 0

    # -- lifecycle ----------------------------------------------------------------
    def start(self, timeout: float = 5.0) -> None:
        bound: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop.submit(self._start(bound)).result(timeout)
        bound.result(timeout)

    async def _start(self, bound: concurrent.futures.Future[None]) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._serve(bound), name="control-endpoint"
        )
        self._task.add_done_callback(self._served)

    def on_exit(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback(error)`` on the loop thread if serving ends without stop()."""
        self._on_exit = callback
        if self._task is not None and self._task.done():
            self._served(self._task)

    def _served(self, task: asyncio.Task[None]) -> None:
        # Always retrieve the outcome, so asyncio never reports it as unretrieved.
        error = None if task.cancelled() else task.exception()
        if self._stopping or self._on_exit is None:
            return
        log.error("control endpoint stopped serving: %r", error)
        self._on_exit(error)

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping = True
        if self._task is not None and self._loop.is_alive():
            task = self._task

            async def cancel() -> None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

            try:
                self._loop.submit(cancel()).result(timeout)
            except (concurrent.futures.TimeoutError, RuntimeError) as exc:
                log.error("control endpoint did not stop: %s", exc)
        self._pool.shutdown(wait=False, cancel_futures=True)
        path = control.socket_path(self.home)
        try:
            # Only our own socket file: a restarted endpoint may have bound a new one.
            if self._inode is not None and os.stat(path).st_ino == self._inode:
                path.unlink()
        except FileNotFoundError:
            pass

    # -- the socket ---------------------------------------------------------------
    async def _serve(self, bound: concurrent.futures.Future[None]) -> None:
        ctx = zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, _TRANSPORT_LIMIT)
        path = control.socket_path(self.home)
        try:
            path.unlink(missing_ok=True)  # a stale file from a killed daemon; we hold the lock
            sock.bind(control.endpoint(self.home))
            os.chmod(path, 0o600)
            self._inode = os.stat(path).st_ino
        except BaseException as exc:
            sock.close()
            bound.set_exception(exc)
            raise
        bound.set_result(None)
        log.info("control endpoint listening", extra={"socket": str(path)})
        pending: set[asyncio.Task[None]] = set()
        try:
            while True:
                frames = await sock.recv_multipart()
                task = asyncio.get_running_loop().create_task(self._answer(sock, frames))
                pending.add(task)
                task.add_done_callback(pending.discard)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            sock.close()

    async def _answer(self, sock: zmq.asyncio.Socket, frames: list[bytes]) -> None:
        if len(frames) < 2:
            return  # not even an identity and a body: nobody to answer
        ident, route, body = frames[0], frames[1:-1], frames[-1]
        if any(route):
            # REQ puts one empty delimiter before the body; anything else is a
            # multi-part body we do not speak. Answer on a clean envelope.
            reply = control.failure(control.MALFORMED, "a request is exactly one frame")
            route = [b""] if frames[1] == b"" else []
        else:
            reply = await self._reply_to(body)
        try:
            await sock.send_multipart([ident, *route, control.encode_reply(reply)])
        except zmq.ZMQError as exc:
            log.info("control client went away before its reply: %s", exc)

    async def _reply_to(self, body: bytes) -> ControlReply:
        parsed = self._router.parse(body)
        if isinstance(parsed, ControlReply):
            log.warning("bad control request: %s", parsed.error, extra={"bytes": len(body)})
            return parsed
        route, args = parsed
        if self._in_flight >= _MAX_IN_FLIGHT:
            return control.failure(
                control.UNAVAILABLE, "too many control requests in flight; retry"
            )
        self._in_flight += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, self._router.run, route, args)
        except RuntimeError as exc:  # the pool is shut down: the daemon is stopping
            return control.failure(control.UNAVAILABLE, f"the daemon is stopping ({exc})")
        finally:
            self._in_flight -= 1
            self.served += 1

"""The daemon's one uvloop event-loop thread for network I/O.

Lifecycle, in order:

1. :meth:`EventLoopThread.start` creates a uvloop loop inside a new thread and
   returns once the loop is running.
2. Other threads hand it work with :meth:`submit` (a coroutine, answered by a
   ``concurrent.futures.Future``) or :meth:`call_soon`. Async code must never
   wait on a pykka future directly: it awaits an actor with
   :meth:`actors.child_ref.ChildRef.acall` (answered by a callback through
   ``call_soon_threadsafe``), or runs a blocking call with ``run_in_executor``.
3. :meth:`stop` cancels every task still on the loop, lets them finish their
   cancellation, closes async generators and the loop, and joins the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import uvloop

log = logging.getLogger("chalie.loop")
T = TypeVar("T")


class LoopNotRunning(RuntimeError):
    """Work was handed to a loop thread that is not running."""


class EventLoopThread:
    """One uvloop loop in one thread, started and stopped by the daemon."""

    def __init__(self, name: str = "chalie-loop") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or not self.is_alive():
            raise LoopNotRunning(f"{self._name} is not running")
        return self._loop

    @property
    def thread_ident(self) -> int | None:
        return self._thread.ident if self._thread else None

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def start(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{self._name} was already started")
        # A daemon thread: if the process must die without stop(), the loop
        # must not keep it alive; stop() is still the orderly path.
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise LoopNotRunning(f"{self._name} did not start within {timeout} s")

    def _run(self) -> None:
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
        finally:
            try:
                self._cancel_all(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()
                log.debug("event loop closed", extra={"loop_thread": self._name})

    @staticmethod
    def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        results = loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error(
                    "task failed while the loop stopped: %s: %s",
                    type(result).__name__,
                    result,
                    extra={"task": task.get_name()},
                )

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run a coroutine on the loop from any other thread."""
        try:
            loop = self.loop
        except LoopNotRunning:
            coro.close()  # never leave a created coroutine un-awaited
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule a plain callback on the loop from any other thread."""
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 5.0) -> bool:
        """Cancel the loop's tasks, close it and join its thread; True once it is gone."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return True
        self._stopping = True
        if thread.is_alive():
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:
                pass  # already closed: the thread is on its way out
            thread.join(timeout)
        if thread.is_alive():
            log.error(
                "event loop thread did not stop",
                extra={"loop_thread": self._name, "timeout": timeout},
            )
            return False
        return True

"""Our futures: CallbackFuture (pykka's, calling back when answered) and Reply (a cheap one)."""

from __future__ import annotations

import _thread
import concurrent.futures
import logging
import sys
import threading
from collections.abc import Callable
from concurrent.futures._base import (
    CANCELLED as _CANCELLED,
)
from concurrent.futures._base import (
    CANCELLED_AND_NOTIFIED as _CANCELLED_AND_NOTIFIED,
)
from concurrent.futures._base import (
    FINISHED as _FINISHED,
)
from concurrent.futures._base import (
    PENDING as _PENDING,
)
from concurrent.futures._base import (
    RUNNING as _RUNNING,
)
from typing import Any, TypeVar

import pykka

log = logging.getLogger("chalie.supervisor")

T = TypeVar("T")


class CallbackFuture(pykka.ThreadingFuture[Any]):
    """pykka's threading future that also calls back when it is answered.

    Every ask of an :class:`Actor` returns one (pykka's
    ``_create_future`` hook), so async code can await an actor's answer
    without a thread blocked on it (:meth:`ChildRef.acall`). The callbacks run
    on the answering thread (the actor's, or the one that stops it and fails
    what is left in its inbox with ActorDeadError).
    """

    def __init__(self) -> None:
        super().__init__()
        self._hook_lock = threading.Lock()
        self._settled = False
        self._callbacks: list[Callable[[CallbackFuture], None]] = []

    def add_done_callback(self, fn: Callable[[CallbackFuture], None]) -> None:
        """Call ``fn(self)`` once answered (at once if it already is)."""
        with self._hook_lock:
            if not self._settled:
                self._callbacks.append(fn)
                return
        fn(self)

    def set(self, value: Any | None = None) -> None:
        super().set(value)
        self._settle()

    def set_exception(self, exc_info: Any = None) -> None:
        super().set_exception(exc_info if exc_info is not None else sys.exc_info())
        self._settle()

    def _settle(self) -> None:
        with self._hook_lock:
            self._settled = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("a future's callback failed")


class Reply(concurrent.futures.Future[T]):
    """A ``concurrent.futures.Future`` that costs one lock release to answer and one to wait on.

    The standard future routes both through a ``threading.Condition``
    (Python-level lock juggling while the answering thread holds the GIL and
    the waiter is waking); here a pending future holds a C lock that the
    answer releases, so a waiter blocks in a single ``acquire``. Same
    interface and states (``result``, ``exception``, ``done``, ``cancel``,
    ``add_done_callback``; ``asyncio.wrap_future`` accepts it), except that
    ``concurrent.futures.wait`` and ``as_completed`` do not take it (nothing
    here uses them). Callbacks run on the answering thread, after the
    waiters are released, exactly as with the standard future.
    """

    def __init__(self) -> None:  # no super().__init__(): its Condition is what this avoids
        self._state = _PENDING
        self._result: T | None = None
        self._exception: BaseException | None = None
        self._done_callbacks: list[Callable[[concurrent.futures.Future[T]], object]] = []
        self._mutex = _thread.allocate_lock()  # guards the state change
        self._gate = _thread.allocate_lock()  # held while pending
        self._gate.acquire()

    def __repr__(self) -> str:
        state = self._state
        shown = f"<{type(self).__name__} at {id(self):#x} state={state.lower()}"
        if state == _FINISHED:
            if self._exception is not None:
                return f"{shown} raised {type(self._exception).__name__}>"
            return f"{shown} returned {type(self._result).__name__}>"
        return f"{shown}>"

    # -- answering ---------------------------------------------------------------------
    def _settle(self, state: str, result: T | None, exception: BaseException | None) -> None:
        with self._mutex:
            if self._state not in (_PENDING, _RUNNING):
                raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
            self._result, self._exception, self._state = result, exception, state
            callbacks, self._done_callbacks = self._done_callbacks, []
            self._gate.release()
        for fn in callbacks:
            _call_back(fn, self)

    def set_result(self, result: T) -> None:
        self._settle(_FINISHED, result, None)

    def set_exception(self, exception: BaseException | None) -> None:
        self._settle(_FINISHED, None, exception)

    def cancel(self) -> bool:
        with self._mutex:
            if self._state in (_RUNNING, _FINISHED):
                return False
            if self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED):
                return True
            self._state = _CANCELLED
            callbacks, self._done_callbacks = self._done_callbacks, []
            self._gate.release()
        for fn in callbacks:
            _call_back(fn, self)
        return True

    def set_running_or_notify_cancel(self) -> bool:
        with self._mutex:
            if self._state == _CANCELLED:
                self._state = _CANCELLED_AND_NOTIFIED
                return False
            if self._state == _PENDING:
                self._state = _RUNNING
                return True
            raise RuntimeError(f"Future in unexpected state: {self._state}")

    # -- asking --------------------------------------------------------------------------
    def cancelled(self) -> bool:
        return self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED)

    def running(self) -> bool:
        return self._state == _RUNNING

    def done(self) -> bool:
        return self._state in (_CANCELLED, _CANCELLED_AND_NOTIFIED, _FINISHED)

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[T]], object]) -> None:
        with self._mutex:
            if self._state in (_PENDING, _RUNNING):
                self._done_callbacks.append(fn)
                return
        _call_back(fn, self)

    def _wait(self, timeout: float | None) -> None:
        if self._state in (_PENDING, _RUNNING):
            gate = self._gate
            if timeout is None:
                got = gate.acquire()
            elif timeout > 0:
                got = gate.acquire(timeout=timeout)
            else:
                got = gate.acquire(blocking=False)
            if not got:
                raise TimeoutError()
            gate.release()  # free for every other waiter

    def result(self, timeout: float | None = None) -> T:
        self._wait(timeout)
        if self._state != _FINISHED:
            raise concurrent.futures.CancelledError()
        if self._exception is not None:
            try:
                raise self._exception
            finally:
                self = None  # type: ignore[assignment]  # no cycle through the traceback
        return self._result  # type: ignore[return-value]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        if self._state != _FINISHED:
            raise concurrent.futures.CancelledError()
        return self._exception


def _call_back(fn: Callable[[Any], object], future: Any) -> None:
    try:
        fn(future)
    except Exception:
        log.exception("exception calling callback for %r", future)

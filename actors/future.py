"""CallbackFuture: pykka's threading future that also calls back when it is answered."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

import pykka

log = logging.getLogger("chalie.supervisor")


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

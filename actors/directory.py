"""Directory: child id -> current ref, the source every restart-proof ChildRef reads."""

from __future__ import annotations

import functools
import threading
from typing import Any, TypeVar

import pykka

from actors.child_ref import ChildRef

A = TypeVar("A", bound=pykka.Actor)


class Directory:
    """child id -> current ref, written by the supervisor thread, read by any thread.

    The composition root may create it and hand it to the Supervisor, so
    restart-proof :class:`ChildRef` handles can be made without asking the
    supervisor anything.
    """

    def __init__(self) -> None:
        self._refs: dict[str, pykka.ActorRef[Any]] = {}
        self._lock = threading.Lock()

    def set(self, child_id: str, ref: pykka.ActorRef[Any] | None) -> None:
        with self._lock:
            if ref is None:
                self._refs.pop(child_id, None)
            else:
                self._refs[child_id] = ref

    def get(self, child_id: str) -> pykka.ActorRef[Any] | None:
        with self._lock:
            return self._refs.get(child_id)

    def ref(self, child_id: str, kind: type[A]) -> ChildRef[A]:
        """A typed, restart-proof handle on the child ``child_id``, an actor of class ``kind``."""
        return ChildRef(functools.partial(self.get, child_id), child_id, kind)

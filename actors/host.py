"""What the tree's children may ask of the running daemon: one protocol, the composition
root's :class:`chalie_app.root.Runtime` as its children see it.

An actor or a part that needs the runtime takes a :class:`Host` and uses the members it
needs; a test may hand any object that has those (the protocol is checked by mypy at
the composition root, where the Runtime is handed over).
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pykka

from actors.child_ref import ChildRef
from actors.loop import EventLoopThread
from chalie.calls.registry import Registry
from chalie.process.config import Config
from chalie.services import Services
from chalie.store.store_place import Place
from chalie.wire.bus import EventBus
from chalie.wire.messages import ToolCall, ToolOutcome

if TYPE_CHECKING:
    from chalie.conversation.catalogue import ToolCatalogue

A = TypeVar("A", bound=pykka.Actor)


class Host(Protocol):
    """The running daemon: its settings, shared parts and children.

    Read-only, but for ``config``: the Brain writes a changed section back (the
    child it restarts reads the new one).
    """

    config: Config

    @property
    def registry(self) -> Registry: ...

    @property
    def catalogue(self) -> ToolCatalogue:
        """The one tool catalogue (the registry and the turns' injections)."""
        ...

    @property
    def events(self) -> EventBus: ...

    @property
    def loop(self) -> EventLoopThread: ...

    @property
    def services(self) -> Services: ...

    @property
    def db_path(self) -> Place: ...

    @property
    def started(self) -> float: ...

    @property
    def supervisor(self) -> pykka.ActorRef[Any] | None: ...

    def child(self, child_id: str, kind: type[A]) -> ChildRef[A]:
        """A typed, restart-proof handle on one child of the tree."""
        ...

    def status(self) -> dict[str, Any]: ...

    def dispatch(self, call: ToolCall) -> concurrent.futures.Future[ToolOutcome]:
        """Hand one call to the dispatcher; the future never raises."""
        ...

    def input_schema(self, tool: str) -> dict[str, Any] | None:
        """A registered tool's input schema (async calls allowed); None: no such tool."""
        ...

    def request_stop(self) -> None: ...

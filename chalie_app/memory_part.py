"""The memory part of the tree: the abilities' memory, the MemoryKeeper's child spec, the commands.

:func:`memory_parts` builds what ``child_specs`` adds for memory: one child
spec and the control routes, over one book per daemon. The embedder is the
discovery's own instance (one model in memory), or the configured one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from chalie.discovery.embedder import Embedder, load_embedder
from chalie.memory.book import MemoryBook
from chalie.memory.commands import MemoryCommands
from chalie.memory.store import MemoryStore
from chalie.memory.turns import TurnMemory
from chalie.process.home import memory_index_dir
from chalie.process.routing import Route
from chalie.process.supervision import ChildSpec

if TYPE_CHECKING:
    from actors.host import Host as Runtime  # what the root's Runtime has


class _OnFirstUse:
    """The configured embedder, loaded on its first text (for backends that cannot be lazy)."""

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options
        self._loaded: Embedder | None = None

    def _get(self) -> Embedder:
        if self._loaded is None:
            self._loaded = load_embedder(self._options)
        return self._loaded

    @property
    def model_id(self) -> str:
        return self._get().model_id

    @property
    def dim(self) -> int:
        return self._get().dim

    def embed(self, texts: Any) -> Any:
        return self._get().embed(texts)


def memory_parts(rt: Runtime, embedder: Embedder | None) -> tuple[ChildSpec, list[Route[Any]]]:
    from actors.memory import MemoryKeeper

    cfg = rt.config
    # _OnFirstUse has the Embedder's members as read-only properties (loaded when read).
    used = embedder if embedder is not None else cast(Embedder, _OnFirstUse(cfg.embedder.options()))
    book = MemoryBook(MemoryStore(rt.db_path), used, memory_index_dir(cfg.home))
    # The abilities' way in, filled here once: the keeper only saves the book's index.
    rt.services.memory = TurnMemory(
        book, rt.db_path, owner_readers=cfg.memory.agents_may_recall, zone=cfg.accounts.zone
    )
    spec = ChildSpec(
        "memory",
        lambda: MemoryKeeper.start(book),
        shutdown=30.0,
    )
    return spec, MemoryCommands(book).routes()

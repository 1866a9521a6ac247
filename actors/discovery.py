"""DiscoveryActor: owns the tool and skill indexes, serves finds and applies updates.

Lifecycle:

1. ``DiscoveryActor.start(registry=..., home=...)`` returns at once; ``on_start``
   (in the actor's thread) loads the embedder, then opens the persisted tool
   and skill indexes under ``<home>/index/`` or rebuilds them when the
   catalogue, the model or the ceiling changed. Calls that arrive meanwhile wait
   in the mailbox, so nothing is served from a half-built index.
2. If loading fails, the actor stays up and every find raises
   :class:`IndexCorruptError` (find_tools turns it into discovery-index-error):
   a broken index is loud, never "nothing found". A find at least
   :data:`RETRY_AFTER` seconds after the failure tries loading again, and so
   does ``rebuild``.
3. ``add`` / ``remove`` / ``sync`` update the tool index incrementally (remote
   MCP tools arrive and leave this way).

Other threads use :class:`DiscoveryHandle`, which is what ``Services.discovery``
holds. Wiring in the daemon::

    ChildSpec("discovery", lambda: DiscoveryActor.start(
        registry=rt.registry, home=cfg.home, embedder_config=cfg.embedder))
    rt.services.discovery = DiscoveryHandle(rt.child("discovery", DiscoveryActor))
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import pykka

from actors.supervisor import ChildRef, ChildUnavailable, SupervisedActor
from chalie.discovery.cascade import DEFAULT_K, FindResult
from chalie.discovery.embedder import Embedder, load_embedder
from chalie.discovery.engine import DiscoveryEngine, Progress, registry_docs
from chalie.discovery.skills import Skill, SkillLibrary
from chalie.discovery.types import IndexCorruptError, ToolDoc

log = logging.getLogger("chalie.discovery")

# A find may wait behind a start-up build. Shorter than find_tools' own timeout,
# so the model hears "the index is still building" rather than a bare timeout.
DEFAULT_TIMEOUT: Final = 20.0
RETRY_AFTER: Final = 60.0


def index_dirs(home: Path) -> tuple[Path, Path]:
    """Where the tool and the skill indexes live in a data directory."""
    return home / "index" / "tools", home / "index" / "skills"


class DiscoveryActor(SupervisedActor):
    """The single owner of the discovery indexes."""

    def __init__(
        self,
        *,
        registry: Iterable[Any] | None = None,
        home: Path | None = None,
        embedder: Embedder | None = None,
        embedder_config: Mapping[str, Any] | None = None,
        docs: Sequence[ToolDoc] | None = None,
        skills: SkillLibrary | None = None,
        readonly: bool = False,
    ) -> None:
        super().__init__()
        # A reader beside a running daemon (the CLI) must not replace the
        # daemon's index: it serves a current one and builds a stale one in memory.
        self._readonly = readonly
        self._registry = registry
        self._home = home
        self._embedder = embedder
        self._embedder_config = dict(embedder_config or {})
        self._fixed_docs = list(docs) if docs is not None else None
        self._library = skills
        self._tools: DiscoveryEngine | None = None
        self._skills: DiscoveryEngine | None = None
        self._error: str | None = None
        self._failed_at = 0.0

    # -- lifecycle --------------------------------------------------------
    def on_start(self) -> None:
        self._load(rebuild=False, progress=None)

    def _catalogue(self) -> list[ToolDoc]:
        if self._fixed_docs is not None:
            return list(self._fixed_docs)
        return registry_docs(self._registry or ())

    def _load(self, *, rebuild: bool, progress: Progress | None) -> None:
        try:
            if self._embedder is None:
                self._embedder = load_embedder(self._embedder_config)
            embedder = self._embedder
            if self._library is None:
                self._library = SkillLibrary.standard(self._home)
            tool_docs, skill_docs = self._catalogue(), self._library.docs()
            if self._home is None:
                self._tools = DiscoveryEngine.build(tool_docs, embedder, progress=progress)
                self._skills = DiscoveryEngine.build(skill_docs, embedder)
            elif self._readonly:
                tools_dir, skills_dir = index_dirs(self._home)
                self._tools = self._open_current(tools_dir, tool_docs, embedder)
                self._skills = self._open_current(skills_dir, skill_docs, embedder)
            else:
                tools_dir, skills_dir = index_dirs(self._home)
                if rebuild:
                    self._tools = DiscoveryEngine.build(
                        tool_docs, embedder, directory=tools_dir, progress=progress
                    )
                    self._skills = DiscoveryEngine.build(skill_docs, embedder, directory=skills_dir)
                else:
                    self._tools = DiscoveryEngine.open_or_build(
                        tools_dir, tool_docs, embedder, progress=progress
                    )
                    self._skills = DiscoveryEngine.open_or_build(skills_dir, skill_docs, embedder)
            self._error = None
            log.info("discovery ready: %d tools, %d skills", len(self._tools), len(self._skills))
        except Exception as exc:
            # Stay up and answer every find with the error rather than "nothing found".
            log.exception("the discovery index could not be loaded")
            self._tools = self._skills = None
            self._error = f"{type(exc).__name__}: {exc}"
            self._failed_at = time.monotonic()

    @staticmethod
    def _open_current(
        directory: Path, docs: Sequence[ToolDoc], embedder: Embedder
    ) -> DiscoveryEngine:
        reason = DiscoveryEngine.stale_reason(directory, docs, embedder)
        if reason is None:
            return DiscoveryEngine.open(directory, embedder)
        log.warning(
            "not using the index in %s (%s); searching a fresh in-memory one", directory, reason
        )
        return DiscoveryEngine.build(docs, embedder)

    def _engine(self, which: str) -> DiscoveryEngine:
        if self._tools is None and time.monotonic() - self._failed_at > RETRY_AFTER:
            # a load that failed (a full disk, say) is tried again, at most this often
            self._load(rebuild=False, progress=None)
        engine = self._tools if which == "tools" else self._skills
        if engine is None:
            raise IndexCorruptError(
                f"the discovery index is unavailable: {self._error or 'not loaded'}"
            )
        return engine

    # -- serving ----------------------------------------------------------
    def find(self, queries: Sequence[str], k: int = DEFAULT_K) -> FindResult:
        return self._engine("tools").find(queries, k=k)

    def find_skills(
        self, queries: Sequence[str], k: int = DEFAULT_K
    ) -> tuple[FindResult, list[Skill]]:
        result = self._engine("skills").find(queries, k=k)
        library = self._library or SkillLibrary()
        found = [s for s in (library.get(d.name) for d in result.injected) if s is not None]
        return result, found

    def status(self) -> dict[str, Any]:
        return {
            "ready": self._tools is not None,
            "error": self._error,
            "tools": len(self._tools) if self._tools else 0,
            "skills": len(self._skills) if self._skills else 0,
            "model_id": self._embedder.model_id if self._embedder else None,
            "ceiling": self._tools.ceiling if self._tools else None,
        }

    # -- updates ----------------------------------------------------------
    def add(self, docs: Sequence[ToolDoc]) -> None:
        self._engine("tools").add(docs)

    def remove(self, names: Iterable[str]) -> None:
        self._engine("tools").remove(list(names))

    def sync(self) -> dict[str, int]:
        """Bring the tool index in line with the registry: add, replace and drop the difference."""
        engine = self._engine("tools")
        wanted = {d.name: d for d in self._catalogue()}
        held = engine.docs
        changed = [d for name, d in wanted.items() if held.get(name) != d]
        gone = [name for name in held if name not in wanted]
        if changed:
            engine.add(changed)
        if gone:
            engine.remove(gone)
        return {"added": len(changed), "removed": len(gone)}

    def rebuild(self) -> dict[str, Any]:
        """A full rebuild from the catalogue and the skill folders (re-read)."""
        self._library = None
        self._load(rebuild=True, progress=None)
        if self._error is not None:
            raise IndexCorruptError(f"the discovery index could not be rebuilt: {self._error}")
        return self.status()


Target = pykka.ActorRef[Any] | ChildRef[Any]


class DiscoveryHandle:
    """What abilities call (``Services.discovery``): the actor's methods, with a timeout.

    ``target`` is the actor's ref, a supervisor ChildRef, or a callable giving
    either (resolved on every call, so a restarted actor is found again). A
    dead, restarting or silent actor raises IndexCorruptError: to the model it
    is a discovery-index-error, never an empty result.
    """

    def __init__(
        self, target: Target | Callable[[], Target], *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self._target = target
        self._timeout = timeout

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            target = self._target
            if not isinstance(target, pykka.ActorRef | ChildRef):
                target = target()
            if isinstance(target, pykka.ActorRef):
                target = ChildRef.to(target, "discovery")
            return target.within(self._timeout).call(method, *args, **kwargs)
        except (pykka.ActorDeadError, ChildUnavailable) as exc:
            raise IndexCorruptError(f"tool discovery is not running ({exc})") from None
        except pykka.Timeout:
            raise IndexCorruptError(
                f"tool discovery did not answer within {self._timeout:g} s "
                "(is the index still building?)"
            ) from None

    def find(self, queries: Sequence[str], *, k: int = DEFAULT_K) -> FindResult:
        result: FindResult = self._call(DiscoveryActor.find, list(queries), k)
        return result

    def find_skills(
        self, queries: Sequence[str], *, k: int = DEFAULT_K
    ) -> tuple[FindResult, list[Skill]]:
        found: tuple[FindResult, list[Skill]] = self._call(
            DiscoveryActor.find_skills, list(queries), k
        )
        return found

    def add(self, docs: Sequence[ToolDoc]) -> None:
        self._call(DiscoveryActor.add, list(docs))

    def remove(self, names: Iterable[str]) -> None:
        self._call(DiscoveryActor.remove, list(names))

    def sync(self) -> dict[str, int]:
        counts: dict[str, int] = self._call(DiscoveryActor.sync)
        return counts

    def rebuild(self) -> dict[str, Any]:
        status: dict[str, Any] = self._call(DiscoveryActor.rebuild)
        return status

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self._call(DiscoveryActor.status)
        return status

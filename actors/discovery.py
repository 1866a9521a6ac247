"""DiscoveryActor: owns the tool and skill indexes, serves finds and applies updates.

Lifecycle:

1. ``DiscoveryActor.start(registry=..., home=...)`` returns at once; ``on_start``
   (in the actor's thread) loads the embedder, then opens the persisted tool
   and skill indexes under ``<home>/index/`` or rebuilds them when the
   catalogue, the model or the ceiling changed. Calls that arrive meanwhile wait
   in the mailbox, so nothing is served from a half-built index; a stop requested
   meanwhile (the supervisor's ``request_stop``) ends the build between batches,
   persisting nothing, so a daemon stopped during its first build stops at once.
2. If loading fails, the actor stays up and every find raises
   :class:`IndexCorruptError` (find_tools turns it into discovery-index-error):
   a broken index is loud, never "nothing found". A find at least
   :data:`RETRY_AFTER` seconds after the failure tries loading again, and so
   does ``rebuild``.
3. ``add`` / ``remove`` / ``sync`` update the tool index incrementally (remote
   MCP tools arrive and leave this way). Tools to add wait in ``_waiting``; one
   batch of :data:`INDEX_BATCH` at a time is embedded on the ``discovery-embed``
   thread and handed back as a message (``take_vectors``), which puts it into
   the index. So a server listing 5,000 tools never holds the mailbox for
   longer than one small batch: finds are served between batches, and the new
   tools become findable as their batches land. A tool removed (or changed)
   while it waits leaves the queue; a batch whose tool changed meanwhile
   drops that tool's vectors. The example writer is asked about a tool only
   once it is in the index, and forgets it when it leaves.

Other threads use :class:`DiscoveryHandle`, which is what ``Services.discovery``
holds. Wiring in the daemon::

    ChildSpec("discovery", lambda: DiscoveryActor.start(
        registry=rt.registry, home=cfg.home, embedder_config=cfg.embedder))
    rt.services.discovery = DiscoveryHandle(rt.child("discovery", DiscoveryActor))
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import pykka

from actors.actor import SupervisedActor
from actors.child_ref import ChildRef, ChildUnavailable
from actors.example_writer import Deliver, ExampleWriter
from chalie.discovery.cascade import DEFAULT_K, FindResult
from chalie.discovery.embedder import Embedder, load_embedder
from chalie.discovery.engine import MANIFEST, DiscoveryEngine, Progress, registry_docs
from chalie.discovery.learning import Example, LearnedExamples, Learner, LearnResult
from chalie.discovery.skills import Skill, SkillLibrary
from chalie.discovery.state import IndexState
from chalie.discovery.types import IndexBuilding, IndexCorruptError, ToolDoc
from chalie.discovery.written import WRITTEN_SOURCE, check_phrases
from chalie.process import heap
from chalie.process.config import DiscoveryConfig
from chalie.process.home import index_dirs as index_dirs  # the layout's rule, re-exported
from chalie.services import DiscoveryService
from chalie.store.store_place import Place

log = logging.getLogger("chalie.discovery")

# A find may wait behind a start-up build. Shorter than find_tools' own timeout,
# so the model hears "the index is still building" rather than a bare timeout.
DEFAULT_TIMEOUT: Final = 20.0
RETRY_AFTER: Final = 60.0
# Turns whose find_tools results are remembered for learn_turn, newest kept.
REMEMBERED_TURNS: Final = 1024
# Tools embedded per step off the mailbox (~2 texts each; ~0.2 s on a quiet core), so a
# find waits behind at most one step's insert, never behind a whole big server.
INDEX_BATCH: Final = 64
# An update this small, with nothing queued, goes in at once (the caller finds it on return).
INLINE_MAX: Final = 16


class _Stopping(Exception):
    """A build given up because the actor is being stopped."""


# Builds the writer of model-written examples, given where it delivers them.
WriterFactory = Callable[[Deliver], ExampleWriter]


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
        state: IndexState | None = None,
        db_path: Place | None = None,
        learning: DiscoveryConfig | None = None,
        writer: WriterFactory | None = None,
    ) -> None:
        super().__init__()
        # examples written by the model for tools that arrive without any (None: off)
        self._make_writer = writer
        self._writer: ExampleWriter | None = None
        # learned examples live in the daemon's database (None: no learning, e.g. the CLI)
        self._db_path = db_path
        self._learning = learning if learning is not None else DiscoveryConfig()
        self._store: LearnedExamples | None = None
        self._learner: Learner | None = None
        # what the index is doing, readable without asking this actor (status, rebuild polls)
        self._state = state if state is not None else IndexState()
        # A reader beside a running daemon (the CLI) must not replace the
        # daemon's index: it serves a current one and builds a stale one in memory.
        self._readonly = readonly
        self._registry = registry
        self._home = home
        self._embedder = embedder
        self._embedder_config = dict(embedder_config or {})
        self._fixed_docs = list(docs) if docs is not None else None
        self._library = skills
        # origin (an MCP server) -> the playbooks it serves (its prompts), kept across reloads
        self._served: dict[str, list[Skill]] = {}
        self._tools: DiscoveryEngine | None = None
        self._skills: DiscoveryEngine | None = None
        self._error: str | None = None
        self._failed_at = 0.0
        # a reader (the CLI) says what it fell back to in status(), not in the log
        self._notices: list[str] = []
        # tools waiting to be embedded and indexed, in arrival order (name -> doc)
        self._waiting: OrderedDict[str, ToolDoc] = OrderedDict()
        self._embedding = False  # a batch is on the embed thread
        self._embed_pool: ThreadPoolExecutor | None = None
        self._self: Any = None  # this actor's proxy, for the embed thread's tells

    # -- lifecycle --------------------------------------------------------
    def on_start(self) -> None:
        if self._make_writer is not None and not self._readonly:
            proxy = self.actor_ref.proxy()

            def deliver(doc: ToolDoc, phrases: list[str]) -> None:
                proxy.store_written.defer(doc, phrases)

            try:
                self._writer = self._make_writer(deliver)
            except Exception:
                log.exception("model-written examples unavailable")
        self._load(rebuild=False, progress=self._unless_stopping)

    def _unless_stopping(self, done: int, total: int) -> None:
        """The first build's progress: a stop requested meanwhile ends it between batches
        (nothing half-built is kept: an index is persisted whole or not at all)."""
        if self.stop_requested:
            raise _Stopping(f"stopping after {done} of {total} tools were embedded")

    def on_end(self) -> None:
        self._close_store()

    def _close_pool(self) -> None:
        pool, self._embed_pool = self._embed_pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _close_store(self) -> None:
        self._close_pool()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        if self._store is not None:
            self._store.close()
            self._store = None
            self._learner = None

    def _open_learning(self) -> None:
        """The learned-examples store and the path onto the tool index; a failure only logs."""
        if self._db_path is None or self._readonly or self._tools is None:
            return
        try:
            if self._store is None:
                self._store = LearnedExamples(
                    self._db_path, per_tool=self._learning.examples_per_tool
                )
            self._learner = Learner(
                self._store,
                self._tools,
                enabled=self._learning.learn,
                channels=self._learning.learn_channels,
            )
            counts = self._learner.sync()
            if any(counts.values()):
                log.info("learned examples brought into the index: %s", counts)
        except Exception:
            log.exception("learned examples unavailable; discovery runs without them")
            self._learner = None

    def _learned_phrases(self) -> dict[str, list[str]] | None:
        if self._db_path is None or self._readonly:
            return None
        try:
            if self._store is None:
                self._store = LearnedExamples(
                    self._db_path, per_tool=self._learning.examples_per_tool
                )
            return self._store.phrases()
        except Exception:
            log.exception("learned examples unreadable; rebuilding without them")
            return None

    def _catalogue(self) -> list[ToolDoc]:
        if self._fixed_docs is not None:
            return list(self._fixed_docs)
        return registry_docs(self._registry or ())

    def _load(self, *, rebuild: bool, progress: Progress | None, reuse: bool = True) -> None:
        self._state.loading()
        try:
            if self._embedder is None:
                self._embedder = load_embedder(self._embedder_config)
            embedder = self._embedder
            if self._library is None:
                self._library = SkillLibrary.standard(self._home)
            for served in self._served.values():
                for skill in served:
                    if self._library.get(skill.name) is None:
                        self._library.put(skill)
            tool_docs, skill_docs = self._catalogue(), self._library.docs()
            if self._home is None:
                self._tools = DiscoveryEngine.build(tool_docs, embedder, progress=progress)
                self._skills = DiscoveryEngine.build(skill_docs, embedder, kind="skills")
            elif self._readonly:
                tools_dir, skills_dir = index_dirs(self._home)
                self._tools = self._open_current(tools_dir, tool_docs, embedder)
                self._skills = self._open_current(skills_dir, skill_docs, embedder, "skills")
            else:
                tools_dir, skills_dir = index_dirs(self._home)
                if rebuild:
                    self._tools = DiscoveryEngine.build(
                        tool_docs,
                        embedder,
                        directory=tools_dir,
                        progress=progress,
                        reuse=reuse,
                        learned=self._learned_phrases(),
                    )
                    self._skills = DiscoveryEngine.build(
                        skill_docs, embedder, directory=skills_dir, reuse=reuse, kind="skills"
                    )
                else:
                    self._tools = DiscoveryEngine.open_or_build(
                        tools_dir, tool_docs, embedder, progress=progress
                    )
                    self._skills = DiscoveryEngine.open_or_build(
                        skills_dir, skill_docs, embedder, kind="skills"
                    )
            self._error = None
            self._open_learning()
            log.info("discovery ready: %d tools, %d skills", len(self._tools), len(self._skills))
            self._state.ready(
                tools=len(self._tools),
                skills=len(self._skills),
                model_id=embedder.model_id,
                ceiling=self._tools.ceiling,
            )
        except _Stopping as why:
            log.info("the discovery index build was given up: %s", why)
            self._tools = self._skills = None
            self._error = f"the index build was given up: {why}"
            self._state.failed(self._error)
        except Exception as exc:
            # Stay up and answer every find with the error rather than "nothing found".
            if isinstance(exc, IndexCorruptError):
                log.log(
                    logging.INFO if self._readonly else logging.ERROR,
                    "the discovery index could not be loaded: %s",
                    exc,
                )
            else:
                log.exception("the discovery index could not be loaded")
            self._tools = self._skills = None
            self._error = f"{type(exc).__name__}: {exc}"
            self._failed_at = time.monotonic()
            self._state.failed(self._error)

    def _open_current(
        self, directory: Path, docs: Sequence[ToolDoc], embedder: Embedder, kind: str = "tools"
    ) -> DiscoveryEngine:
        reason = DiscoveryEngine.stale_reason(directory, docs, embedder)
        if reason is None:
            return DiscoveryEngine.open(directory, embedder)
        notice = f"not using the index in {directory} ({reason}); searched a fresh in-memory one"
        if (directory / MANIFEST).exists():
            # an index that is there but unusable (corrupt, stale) is worth saying loudly
            self._notices.append(notice)
        log.info(notice)
        return DiscoveryEngine.build(docs, embedder, kind=kind)

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
    def find(
        self, queries: Sequence[str], k: int = DEFAULT_K, mentions: bool = False
    ) -> FindResult:
        return self._engine("tools").find(queries, k=k, mentions=mentions)

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
            "state": self._state.snapshot()["state"],
            "error": self._error,
            "tools": len(self._tools) if self._tools else 0,
            "skills": len(self._skills) if self._skills else 0,
            "model_id": self._embedder.model_id if self._embedder else None,
            "ceiling": self._tools.ceiling if self._tools else None,
            "notices": list(self._notices),
            "examples_to_write": self._writer.pending() if self._writer else 0,
            "tools_to_index": len(self._waiting),
        }

    # -- updates ----------------------------------------------------------
    def add(self, docs: Sequence[ToolDoc]) -> None:
        """Queue tools for the index (a new definition replaces a waiting one); returns at
        once, the tools land batch by batch (the module doc)."""
        engine = self._engine("tools")
        for doc in docs:
            if not isinstance(doc, ToolDoc) or not doc.name:
                raise ValueError(f"not a named ToolDoc: {doc!r}")
        held = engine.docs
        fresh = [d for d in {d.name: d for d in docs}.values() if held.get(d.name) != d]
        for doc in docs:
            if held.get(doc.name) == doc:
                self._waiting.pop(doc.name, None)  # an older definition waiting is stale
        if not fresh:
            return
        if not self._waiting and not self._embedding and len(fresh) <= INLINE_MAX:
            self._put(fresh, None)
            return
        for doc in fresh:
            self._waiting[doc.name] = doc
            self._waiting.move_to_end(doc.name)
        self._state.indexing(len(self._waiting))
        self._next_batch()

    def _next_batch(self) -> None:
        """Send the next batch of waiting tools to the embed thread, unless one is there."""
        if self._embedding or not self._waiting or self._tools is None:
            return
        engine = self._tools
        batch = [self._waiting[name] for name in list(self._waiting)[:INDEX_BATCH]]
        texts = engine.missing_texts(batch)
        if self._embed_pool is None:
            self._embed_pool = ThreadPoolExecutor(1, thread_name_prefix="discovery-embed")
        if self._self is None:
            self._self = self.actor_ref.proxy()
        reply, embedder = self._self, engine.embedder

        def embed() -> None:
            try:
                rows = embedder.embed(texts) if texts else None
                reply.take_vectors.defer(batch, texts, rows, None)
            except Exception as exc:  # handed back: the batch goes in, embedded in place
                reply.take_vectors.defer(batch, texts, None, f"{type(exc).__name__}: {exc}")

        self._embedding = True
        try:
            self._embed_pool.submit(embed)
        except RuntimeError:  # the pool was shut down (the actor stops)
            self._embedding = False

    def take_vectors(
        self, batch: list[ToolDoc], texts: list[str], rows: Any, error: str | None
    ) -> None:
        """A batch came back from the embed thread (a tell): index what still waits as it was."""
        self._embedding = False
        try:
            current = [d for d in batch if self._waiting.get(d.name) == d]
            for doc in current:
                del self._waiting[doc.name]
            if error is not None:
                log.warning("embedding a batch of tools failed (%s); embedding in place", error)
            embedded = dict(zip(texts, rows, strict=True)) if rows is not None else None
            if current:
                self._put(current, embedded)
        except Exception:  # a tell: a raise would fail the actor and drop the queue
            log.exception("a batch of %d tools could not be indexed", len(batch))
        finally:
            self._state.indexing(len(self._waiting))
            self._next_batch()
            if not self._waiting and not self._embedding:
                # a big update drained: its free memory goes back (chalie/process/heap.py)
                heap.trim()

    def _put(self, docs: list[ToolDoc], embedded: dict[str, Any] | None) -> None:
        engine = self._engine("tools")
        held = engine.docs
        changed = [d.name for d in docs if d.name in held and held[d.name] != d]
        engine.add(docs, embedded=embedded)
        if changed:
            if self._learner is not None:
                # examples learned for the old definition say nothing about the new one
                self._learner.tool_changed(changed)
            if self._writer is not None:
                self._writer.withdraw(changed)
        self._ask_for_examples(docs)

    def _ask_for_examples(self, docs: Sequence[ToolDoc]) -> None:
        """Tools without examples get some written by the model, later (never waited on)."""
        if self._writer is not None and self._learner is not None:
            self._writer.submit([d for d in docs if not d.examples])

    def store_written(self, doc: ToolDoc, phrases: list[str]) -> None:
        """Model-written phrases for ``doc`` (a tell from the writer): stored if it is unchanged."""
        try:
            engine = self._engine("tools")
            if self._learner is None or engine.get(doc.name) != doc:
                return  # the tool changed or left while the model wrote
            checked = check_phrases(list(phrases))  # whoever sent them, the same rules
            added = self._learner.write(doc.name, checked, source=WRITTEN_SOURCE)
            log.info("model-written examples for %s: %d new", doc.name, added)
        except Exception as exc:  # a tell: a raise would fail the actor
            log.info("model-written examples for %s not stored: %s", doc.name, exc)

    def serve_skills(self, origin: str, skills: Sequence[Skill]) -> dict[str, int]:
        """The playbooks ``origin`` (an MCP server) serves now, replacing its earlier ones;
        a playbook of the same name from elsewhere (shipped, the user's) is never replaced."""
        old = {s.name for s in self._served.get(origin, [])}
        library = self._library if self._library is not None else SkillLibrary()
        self._library = library
        theirs = {s.name for other, held in self._served.items() if other != origin for s in held}
        mine = [
            s
            for s in skills
            if s.name not in theirs and (s.name in old or library.get(s.name) is None)
        ]
        self._served[origin] = list(mine)
        if not mine:
            self._served.pop(origin, None)
        new = {s.name for s in mine}
        gone = sorted(old - new)
        library.drop(gone)
        for skill in mine:
            library.put(skill)
        engine = self._skills
        if engine is not None:
            if gone:
                engine.remove(gone)
            held = engine.docs
            docs = [s.doc() for s in mine if held.get(s.name) != s.doc()]
            if docs:
                engine.add(docs)
        return {"served": len(mine), "dropped": len(gone)}

    def remove(self, names: Iterable[str]) -> None:
        gone = list(names)
        engine = self._engine("tools")
        for name in gone:
            self._waiting.pop(name, None)
        self._state.indexing(len(self._waiting))
        engine.remove(gone)
        if self._learner is not None:
            self._learner.tool_changed(gone)
        if self._writer is not None:
            self._writer.withdraw(gone)  # never ask the model about a tool that left

    # -- learning from use (chalie/discovery/learning.py) -------------------
    def learn(
        self, entry: str, tool: str, channel: str, definition: str | None = None
    ) -> LearnResult:
        self._engine("tools")
        if self._learner is None:
            return LearnResult(False, "learning-off", message="no learned-examples store")
        return self._learner.learn(entry, tool, channel, definition=definition)

    def learn_quietly(
        self, entry: str, tool: str, channel: str, definition: str | None = None
    ) -> None:
        """``learn`` for a tell: never raises (a raise would fail the actor)."""
        try:
            result = self.learn(entry, tool, channel, definition)
            log.debug("learn %s: %s", tool, result.reason)
        except Exception as exc:
            log.info("not learned for %s: %s", tool, exc)

    def examples(self, tool: str | None = None) -> list[Example]:
        if self._store is None:
            raise IndexCorruptError("no learned-examples store")
        return self._store.examples(tool)

    def forget(self, target: str | int) -> int:
        self._engine("tools")
        if self._learner is None:
            raise IndexCorruptError("no learned-examples store")
        return self._learner.forget(target)

    def clear_examples(self) -> int:
        self._engine("tools")
        if self._learner is None:
            raise IndexCorruptError("no learned-examples store")
        return self._learner.clear()

    def sync(self) -> dict[str, int]:
        """Bring the tool index in line with the registry: add, replace and drop the difference
        (what to add is queued like :meth:`add`'s)."""
        engine = self._engine("tools")
        wanted = {d.name: d for d in self._catalogue()}
        held = engine.docs
        changed = [d for name, d in wanted.items() if held.get(name) != d]
        gone = [name for name in held if name not in wanted]
        gone += [name for name in self._waiting if name not in wanted and name not in held]
        if gone:
            self.remove(gone)
        if changed:
            self.add(changed)
        return {"added": len(changed), "removed": len(gone)}

    def rebuild(self) -> dict[str, Any]:
        """A full rebuild from the catalogue and the skill folders (re-read)."""
        self._library = None
        self._load(rebuild=True, progress=None)
        if self._error is not None:
            raise IndexCorruptError(f"the discovery index could not be rebuilt: {self._error}")
        return self.status()

    def rebuild_job(self, job_id: str, reuse: bool) -> None:
        """Run the rebuild ``IndexState.begin_rebuild`` registered, reporting progress there.

        Sent as a tell (``DiscoveryHandle.start_rebuild``), so it never raises:
        the outcome is the job's phase and error.
        """
        error: str | None = None
        try:
            self._library = None
            self._load(
                rebuild=True,
                reuse=reuse,
                progress=lambda done, total: self._state.progress(job_id, done, total),
            )
            error = self._error
        except Exception as exc:  # _load catches its own; this is the last line of defence
            error = f"{type(exc).__name__}: {exc}"
        self._state.end_rebuild(job_id, error=error)


Target = pykka.ActorRef[Any] | ChildRef[Any]


class DiscoveryHandle:
    """What abilities call (``Services.discovery``): the actor's methods, with a timeout.

    ``target`` is the actor's ref, a supervisor ChildRef, or a callable giving
    either (resolved on every call, so a restarted actor is found again). A
    dead, restarting or silent actor raises IndexCorruptError: to the model it
    is a discovery-index-error, never an empty result.
    """

    def __init__(
        self,
        target: Target | Callable[[], Target],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        state: IndexState | None = None,
    ) -> None:
        self._target = target
        self._timeout = timeout
        # turn id -> (entry, tool, definition) of what its find_tools calls found
        self._finds: OrderedDict[str, list[tuple[str, str, str]]] = OrderedDict()
        self._finds_lock = threading.Lock()
        # shared with the actor (pass it to DiscoveryActor.start) so status and
        # rebuild progress are read without waiting behind a build, and a find sent
        # while the index is built is answered at once (only with a shared state)
        self.state = state if state is not None else IndexState()
        self._shared = state is not None

    def _resolve(self) -> Target:
        target = self._target
        if not isinstance(target, pykka.ActorRef | ChildRef):
            target = target()
        return target

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            target = self._resolve()
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

    def _not_building(self) -> None:
        """IndexBuilding at once while the index is first built or loaded: the actor is
        busy building, and a find would wait behind it for the whole timeout."""
        building = self.state.building() if self._shared else None
        if building is not None:
            raise IndexBuilding(*building)

    def find(
        self, queries: Sequence[str], *, k: int = DEFAULT_K, mentions: bool = False
    ) -> FindResult:
        self._not_building()
        result: FindResult = self._call(DiscoveryActor.find, list(queries), k, mentions)
        return result

    def find_skills(
        self, queries: Sequence[str], *, k: int = DEFAULT_K
    ) -> tuple[FindResult, list[Skill]]:
        self._not_building()
        found: tuple[FindResult, list[Skill]] = self._call(
            DiscoveryActor.find_skills, list(queries), k
        )
        return found

    def add(self, docs: Sequence[ToolDoc]) -> None:
        self._call(DiscoveryActor.add, list(docs))

    def remove(self, names: Iterable[str]) -> None:
        self._call(DiscoveryActor.remove, list(names))

    def serve_skills(self, origin: str, skills: Sequence[Skill]) -> dict[str, int]:
        counts: dict[str, int] = self._call(DiscoveryActor.serve_skills, origin, list(skills))
        return counts

    def sync(self) -> dict[str, int]:
        counts: dict[str, int] = self._call(DiscoveryActor.sync)
        return counts

    def rebuild(self) -> dict[str, Any]:
        status: dict[str, Any] = self._call(DiscoveryActor.rebuild)
        return status

    def learn(
        self, entry: str, tool: str, channel: str, *, definition: str | None = None
    ) -> LearnResult:
        """Record that ``entry`` (a find_tools entry) led to a successful call of ``tool``.

        The conversations code calls this when a turn ends: for each entry of a
        find_tools call whose injected ``tool`` was then called with success and
        not denied, pass the entry, the tool, the turn's channel and
        ``FindResult.definitions[tool]``. The index has the phrase when this returns.
        """
        result: LearnResult = self._call(DiscoveryActor.learn, entry, tool, channel, definition)
        return result

    def remember(self, turn_id: str, result: FindResult) -> None:
        """Note which entry of a turn's find_tools found which tool (find_tools calls this).

        Only entries the vector rung answered are kept: an entry that was a tool's
        name teaches nothing about how people ask for it. Bounded: the oldest
        turns are dropped past REMEMBERED_TURNS, so a turn that never ends costs
        nothing for long.
        """
        found = [
            (outcome.query, name, result.definitions.get(name, ""))
            for outcome in result.entries
            if outcome.rung == "vector"
            for name in outcome.names
        ]
        if not found:
            return
        with self._finds_lock:
            self._finds.setdefault(turn_id, []).extend(found)
            self._finds.move_to_end(turn_id)
            while len(self._finds) > REMEMBERED_TURNS:
                self._finds.popitem(last=False)

    def learn_turn(self, turn_id: str, channel: str, used: Iterable[str]) -> list[LearnResult]:
        """At the end of a turn: learn each find_tools entry whose tool was then used.

        ``used`` names the tools the turn called with success and the user did not
        deny. What the turn's finds found is forgotten either way.
        """
        with self._finds_lock:
            found = self._finds.pop(turn_id, [])
        wanted = set(used)
        results: list[LearnResult] = []
        for entry, tool, definition in dict.fromkeys(found):
            if tool in wanted:
                results.append(self.learn(entry, tool, channel, definition=definition or None))
        return results

    def learn_turn_soon(self, turn_id: str, channel: str, used: Iterable[str]) -> int:
        """:meth:`learn_turn` without waiting: what the TurnActor calls when a turn ends.

        Each entry whose tool was used is sent as a tell (:meth:`learn_soon`), so
        the caller's mailbox never waits on the index; an empty ``used`` only
        drops the turn's finds (a turn that ended otherwise teaches nothing).
        Returns how many examples were sent.
        """
        with self._finds_lock:
            found = self._finds.pop(turn_id, [])
        wanted = set(used)
        sent = 0
        for entry, tool, definition in dict.fromkeys(found):
            if tool in wanted:
                self.learn_soon(entry, tool, channel, definition=definition or None)
                sent += 1
        return sent

    def learn_soon(
        self, entry: str, tool: str, channel: str, *, definition: str | None = None
    ) -> None:
        """As :meth:`learn`, without waiting (a tell); outcomes are only logged."""
        try:
            target = self._resolve()
            ref = target if isinstance(target, pykka.ActorRef) else target.current()
            ref.proxy().learn_quietly.defer(entry, tool, channel, definition)
        except (pykka.ActorDeadError, ChildUnavailable) as exc:
            log.info("not learned (%s): discovery is not running", exc)

    def examples(self, tool: str | None = None) -> list[Example]:
        found: list[Example] = self._call(DiscoveryActor.examples, tool)
        return found

    def forget(self, target: str | int) -> int:
        count: int = self._call(DiscoveryActor.forget, target)
        return count

    def clear_examples(self) -> int:
        count: int = self._call(DiscoveryActor.clear_examples)
        return count

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self._call(DiscoveryActor.status)
        return status

    def snapshot(self) -> dict[str, Any]:
        """The index state (chalie.discovery.state), without asking the actor."""
        return self.state.snapshot()

    def start_rebuild(self, reuse: bool = False) -> dict[str, Any]:
        """Start a rebuild in the actor unless one runs; the job's view plus ``started``.

        Returns at once: poll :meth:`snapshot` (its ``rebuild``) for progress.
        """
        job, new = self.state.begin_rebuild(reuse)
        if new:
            try:
                target = self._resolve()
                ref = target if isinstance(target, pykka.ActorRef) else target.current()
                ref.proxy().rebuild_job.defer(job.job_id, reuse)
            except (pykka.ActorDeadError, ChildUnavailable) as exc:
                self.state.end_rebuild(job.job_id, error=f"tool discovery is not running ({exc})")
        view = self.state.job() or job.view()
        return {**view, "started": new}


def example_view(example: Example) -> dict[str, Any]:
    return {
        "id": example.id,
        "tool": example.tool,
        "text": example.text,
        "channel": example.channel,
        "created": example.created,
    }


def examples_command(handle: DiscoveryService, args: Any) -> dict[str, Any]:
    """The ``discovery.examples`` control command (chalie.process.control.DiscoveryExamplesArgs)."""
    if args.action == "list":
        return {"examples": [example_view(e) for e in handle.examples(args.tool)]}
    if args.action == "forget":
        if (args.tool is None) == (args.id is None):
            raise ValueError("forget takes a tool or an id")
        return {"forgotten": handle.forget(args.tool if args.id is None else args.id)}
    return {"forgotten": handle.clear_examples()}

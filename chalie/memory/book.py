"""MemoryBook: store, recall, update, forget, list, export and import memories.

Every entry point uses it: the ``memory`` ability, ``chalie memory``, the
background passes. It owns the indexes of one data directory; the table in
chalie.db is the truth (:mod:`chalie.memory.store`).

Lifecycle, in order:

1. ``MemoryBook(store, embedder, directory)``: nothing is loaded yet.
2. The first call opens the saved index if it is current for the table's
   generation and the embedder's model, else rebuilds it from the stored
   vectors (re-embedding only rows of another model).
3. A write embeds outside the lock, then (under it) merges a near-duplicate
   or inserts, and updates both indexes before it returns: a stored memory
   is recallable as soon as ``store`` returns.
4. ``close()`` saves the graphs with the generation they reflect.

Several daemons on one store: :meth:`MemoryBook.follow` keeps the open index in step
with the other daemons' writes while this one runs (their notices name the memories
changed, :data:`chalie.memory.store.CHANGED`; each is read back from the table and
indexed again, or unindexed), so a memory stored on one daemon is recalled on every
other.

Recall is hybrid: the semantic neighbours (HNSW, cosine), the keyword hits
(Tantivy, BM25) and the rare-word hits of the query are fused and lifted
(:mod:`chalie.memory.fusion`), then the place, time, people and kind filters
are applied.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from chalie.discovery.embedder import Embedder
from chalie.memory import fusion, when
from chalie.memory.index import TWIN_EF, MemoryIndex
from chalie.memory.records import (
    KINDS,
    MAX_FIELD,
    MAX_LIST,
    MAX_TEXT,
    SOURCES,
    Draft,
    Kind,
    Memory,
    Provenance,
    Recalled,
)
from chalie.memory.store import CHANGED, MemoryStore
from chalie.memory.whose import OWNER, is_agent
from chalie.store.sql import Follower, follow

log = logging.getLogger("chalie.memory")

# A new memory this close to one of the same principal and kind, saying it in the same
# words (case, punctuation and order aside), is the same memory: merged. Close in meaning
# but in other words ("locker 212" and "locker 213") is another memory: both are kept.
NEAR_DUPLICATE: Final = 0.07
# A forgotten memory stays restorable this long, then is purged (no trace is left).
FORGET_GRACE: Final = 30 * 86400.0
CANDIDATES: Final = 50
# The fused head whose rows the lift reads (chalie.memory.fusion.lift).
HEAD: Final = 20
MAX_K: Final = 50
# Recent texts' vectors (a recall right after a store of the same words, a query asked
# again): ~1.5 KB each. The embedding is most of a recall's CPU.
VECTOR_CACHE: Final = 512
# Candidates fetched from chalie.db per round, as a multiple of k: most recalls need one.
FETCH_FACTOR: Final = 4
# Texts embedded together by a batch import.
IMPORT_BATCH: Final = 256
_WORDS: Final = re.compile(r"[a-z0-9]+")


class MemoryRequestError(ValueError):
    """A bad request to the book; ``code`` is a stable kebab-case error code."""

    def __init__(self, code: str, message: str, hint: str = "", param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.hint = hint
        self.param = param


def _clean(value: str | None, name: str, limit: int = MAX_FIELD) -> str | None:
    if value is None:
        return None
    value = " ".join(str(value).split())
    if not value:
        return None
    if len(value) > limit:
        raise MemoryRequestError(
            "invalid-param", f"{name} is longer than {limit} characters.", param=name
        )
    return value


def _names(values: Iterable[str], name: str) -> tuple[str, ...]:
    out: list[str] = []
    for v in values:
        c = _clean(v, name)
        if c and c.casefold() not in (o.casefold() for o in out):
            out.append(c)
    if len(out) > MAX_LIST:
        raise MemoryRequestError(
            "invalid-param", f"{name} has more than {MAX_LIST} entries.", param=name
        )
    return tuple(out)


def check_time(value: str | None, name: str = "time") -> str | None:
    """An ISO 8601 date or date-time, or a month (2026-11) or a year (2026), normalised;
    anything else is an invalid-param naming ``name``."""
    value = _clean(value, name, 64)
    if value is None:
        return None
    found = when.iso(value)
    if found is None:
        raise MemoryRequestError(
            "invalid-param",
            f"{name} {value[:40]!r} is not an ISO 8601 date, month or year.",
            hint=f"pass {name} like 2026-05-01, 2026-05-01T18:30, 2026-05 or 2026.",
            param=name,
        )
    return found


def check_draft(draft: Draft) -> Draft:
    text = _clean(draft.text, "text", MAX_TEXT)
    if text is None:
        raise MemoryRequestError("invalid-param", "text is empty.", param="text")
    if draft.kind not in KINDS:
        raise MemoryRequestError("invalid-param", f"kind {draft.kind!r} is unknown.", param="kind")
    return Draft(
        text=text,
        kind=draft.kind,
        place=_clean(draft.place, "place"),
        time=check_time(draft.time),
        people=_names(draft.people, "people"),
        tags=_names(draft.tags, "tags"),
        skill=_clean(draft.skill, "skill", 64),
    )


def _offset(tz: dt.tzinfo, now: float) -> int:
    """The zone's offset from UTC at ``now``, in seconds."""
    delta = dt.datetime.fromtimestamp(now, tz).utcoffset()
    return int(delta.total_seconds()) if delta is not None else 0


def _imported(row: Any) -> tuple[Draft, Provenance]:
    """An exported row as a checked draft and its provenance (a bad row raises)."""
    if not isinstance(row, Mapping):
        raise MemoryRequestError("invalid-param", "a row is not an object")
    if not isinstance(row.get("text"), str):
        raise MemoryRequestError("invalid-param", "a row's text is not a string")
    draft = check_draft(
        Draft(
            text=str(row.get("text", "")),
            kind=row.get("kind", "fact") if row.get("kind") in KINDS else "fact",
            place=row.get("place") if isinstance(row.get("place"), str) else None,
            time=row.get("time") if isinstance(row.get("time"), str) else None,
            people=tuple(str(p) for p in row.get("people") or () if isinstance(p, str)),
            tags=tuple(str(t) for t in row.get("tags") or () if isinstance(t, str)),
            skill=row.get("skill") if isinstance(row.get("skill"), str) else None,
        )
    )
    principal = row.get("principal", OWNER)
    if not isinstance(principal, str) or not (principal == OWNER or is_agent(principal)):
        principal = OWNER
    untrusted = tuple(str(u) for u in row.get("untrusted") or () if isinstance(u, str))
    return draft, Provenance(principal=principal, source="import", untrusted=untrusted)


def _check_source(who: Provenance) -> None:
    if who.source not in SOURCES:
        raise MemoryRequestError("invalid-param", f"unknown source {who.source!r}")


def _same_words(a: str, b: str) -> bool:
    """The same words, case, punctuation and order aside (a negation is a word too)."""
    return frozenset(_WORDS.findall(a.lower())) == frozenset(_WORDS.findall(b.lower()))


def _when(memory: Memory, tz: dt.tzinfo = dt.UTC) -> str:
    """When it happened: its ``time``, else when it was stored (in the person's zone)."""
    if memory.time:
        return memory.time
    return dt.datetime.fromtimestamp(memory.created, tz).isoformat(timespec="minutes")


def _matches(
    memory: Memory,
    *,
    place: str | None,
    people: Sequence[str],
    since: str | None,
    until: str | None,
    kind: str | None,
    tags: Sequence[str],
    tz: dt.tzinfo = dt.UTC,
) -> bool:
    if place and (not memory.place or place.casefold() not in memory.place.casefold()):
        # a place also matches when the text names it ("dinner in Lisbon")
        if place.casefold() not in memory.text.casefold():
            return False
    if people:
        have = {p.casefold() for p in memory.people}
        text = memory.text.casefold()
        if not any(p.casefold() in have or p.casefold() in text for p in people):
            return False
    if kind and memory.kind != kind:
        return False
    if tags and not {t.casefold() for t in tags} & {t.casefold() for t in memory.tags}:
        return False
    at = _when(memory, tz)
    if since and at[: len(since)] < since[: len(at)]:
        return False
    return not (until and at[: len(until)] > until)


class MemoryBook:
    """See the module docstring. Thread-safe: any thread may call any method."""

    def __init__(
        self,
        store: MemoryStore,
        embedder: Embedder,
        directory: Path | None,
        *,
        owner_readers: Collection[str] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.directory = directory
        self.owner_readers = frozenset(owner_readers)
        self._clock = clock
        self._lock = threading.RLock()
        self._index: MemoryIndex | None = None
        self._vectors: OrderedDict[str, Any] = OrderedDict()
        self._vectors_lock = threading.Lock()
        self.rebuilt = 0  # how many times the index was rebuilt from the table (observable)

    # -- lifecycle ----------------------------------------------------------------------
    def index(self) -> MemoryIndex:
        with self._lock:
            if self._index is None:
                self._index = self._open()
                # The store's commits leave the WAL to the committer (chalie.memory.store).
                self._index.after_commit = self.store.checkpoint
            return self._index

    def _open(self) -> MemoryIndex:
        self.purge()  # what was forgotten long enough ago goes before anything is read
        gen = self.store.generation()
        dim, model_id = self.embedder.dim, self.embedder.model_id
        if self.directory is not None:
            found = MemoryIndex.open(self.directory, dim=dim, model_id=model_id, generation=gen)
            if found is not None:
                return found
        began = time.monotonic()
        index = MemoryIndex.empty(self.directory, dim=dim, model_id=model_id)
        count = index.bulk(self._stored_vectors())
        self.rebuilt += 1
        log.info(
            "memory index rebuilt from chalie.db",
            extra={"memories": count, "seconds": round(time.monotonic() - began, 2)},
        )
        index.save(gen)
        return index

    def _stored_vectors(self) -> Iterator[tuple[Memory, Any]]:
        stale: list[Memory] = []
        for memory, vector in self.store.vectors(self.embedder.model_id, self.embedder.dim):
            if vector is None:
                stale.append(memory)
                if len(stale) >= 64:
                    yield from self._reembed(stale)
                    stale = []
                continue
            yield memory, vector
        if stale:
            yield from self._reembed(stale)

    def _reembed(self, memories: list[Memory]) -> Iterator[tuple[Memory, Any]]:
        rows = self.embedder.embed([m.text for m in memories])
        for memory, vector in zip(memories, rows, strict=True):
            self.store.replace(memory, self.embedder.model_id, vector)
            yield memory, vector

    def follow(self) -> Follower:
        """Follow the other daemons' changes of the shared table (nothing to follow on
        SQLite); ``close()`` the follower before the book."""
        return follow(self.store.place, CHANGED, self._changed_elsewhere)

    def _changed_elsewhere(self, payload: str) -> None:
        """A notice (on the follower's thread): the memories it names are indexed as the
        table has them now; all of them on a lost connection's resync ("") or "*"."""
        writer, _, named = payload.partition(":")
        if writer == self.store.writer:
            return  # this book's own write: indexed as it was made
        with self._lock:
            index = self._index
            if index is None:
                return  # opened later, from the table as it is then
            if named in ("", "*"):
                self._index = None  # the next call rebuilds it from the table
                index.close()
                index.invalidate()
                return
            for memory_id in {int(i) for i in named.split(",") if i.isdigit()}:
                self._index_again(index, memory_id)

    def _index_again(self, index: MemoryIndex, memory_id: int) -> None:
        """Index one memory as the table has it (another daemon changed it)."""
        memory = self.store.get(memory_id)
        index.remove_id(memory_id)  # also from another principal's graph (a promotion)
        if memory is None or memory.forgotten is not None:
            return
        vector = self.store.vector(memory_id, self.embedder.model_id, self.embedder.dim)
        if vector is None:  # written with another embedding model
            vector = self._vector(memory.text)
        index.add([(memory, vector)])

    def close(self) -> None:
        """Save the index and let it go (the next call opens the saved one again)."""
        with self._lock:
            index, self._index = self._index, None
            if index is not None:
                index.close()
                index.save(self.store.generation())

    # -- writes -------------------------------------------------------------------------
    def _vector(self, text: str) -> Any:
        with self._vectors_lock:
            found = self._vectors.get(text)
            if found is not None:
                self._vectors.move_to_end(text)
                return found
        vector = self.embedder.embed([text])[0]
        vector.flags.writeable = False  # shared by every caller of the cache
        with self._vectors_lock:
            self._vectors[text] = vector
            while len(self._vectors) > VECTOR_CACHE:
                self._vectors.popitem(last=False)
        return vector

    def store_memory(
        self, draft: Draft, who: Provenance, *, supersedes: int | None = None
    ) -> tuple[Memory, bool]:
        """Store a memory, or merge it into a near-duplicate; (the memory, merged?).
        ``supersedes``: a memory of the same principal this one replaces (it becomes past)."""
        draft = check_draft(draft)
        _check_source(who)
        vector = self._vector(draft.text)
        with self._lock:
            old = None if supersedes is None else self._owned((who.principal,), supersedes)
            memory, merged = self._put(self.index(), draft, who, vector, self._clock())
            if old is not None and old.id != memory.id:
                self.store.supersede(old.id, memory.id)
            return memory, merged

    def store_many(
        self, drafts: Sequence[Draft], who: Provenance, vectors: Any = None
    ) -> list[tuple[Memory, bool]]:
        """A batch import: the texts embedded together (or ``vectors``, one unit row a draft),
        then each stored or merged in order, as :meth:`store_memory` would."""
        checked = [check_draft(d) for d in drafts]
        _check_source(who)
        if vectors is None:
            rows = [
                self.embedder.embed([d.text for d in checked[i : i + IMPORT_BATCH]])
                for i in range(0, len(checked), IMPORT_BATCH)
            ]
            vectors = [v for chunk in rows for v in chunk]
        if len(vectors) != len(checked):
            raise MemoryRequestError("invalid-param", "one vector a memory is needed.")
        out: list[tuple[Memory, bool]] = []
        with self._lock:
            index = self.index()
            for draft, vector in zip(checked, vectors, strict=True):
                out.append(self._put(index, draft, who, vector, self._clock()))
        return out

    def _put(
        self, index: MemoryIndex, draft: Draft, who: Provenance, vector: Any, now: float
    ) -> tuple[Memory, bool]:
        """Merge into a near-duplicate or insert (the caller holds the lock)."""
        twin = self._near_duplicate(index, who.principal, draft, vector)
        if twin is not None:
            merged = msgspec.structs.replace(
                twin,
                text=draft.text,
                place=draft.place or twin.place,
                time=draft.time or twin.time,
                people=_names((*twin.people, *draft.people), "people")[:MAX_LIST],
                tags=_names((*twin.tags, *draft.tags), "tags")[:MAX_LIST],
                skill=draft.skill or twin.skill,
                untrusted=tuple(dict.fromkeys((*twin.untrusted, *who.untrusted))),
                conversation_id=who.conversation_id or twin.conversation_id,
                updated=now,
                merged=twin.merged + 1,
            )
            self.store.replace(merged, self.embedder.model_id, vector)
            index.add([(merged, vector)])
            return merged, True
        memory = Memory(
            id=0,
            principal=who.principal,
            kind=draft.kind,
            text=draft.text,
            place=draft.place,
            time=draft.time,
            people=draft.people,
            tags=draft.tags,
            skill=draft.skill,
            source=who.source,
            untrusted=who.untrusted,
            conversation_id=who.conversation_id,
            created=now,
            updated=now,
        )
        new_id = self.store.insert(memory, self.embedder.model_id, vector)
        memory = msgspec.structs.replace(memory, id=new_id)
        index.add([(memory, vector)])
        return memory, False

    def _near_duplicate(
        self, index: MemoryIndex, principal: str, draft: Draft, vector: Any
    ) -> Memory | None:
        close = index.semantic((principal,), vector, 3, ef=TWIN_EF)
        near = [i for i, d in close if d <= NEAR_DUPLICATE]
        if not near:
            return None
        found = self.store.many(near)
        for mid in near:
            twin = found.get(mid)
            if (
                twin is not None
                and twin.kind == draft.kind
                and twin.forgotten is None
                and _same_words(twin.text, draft.text)
            ):
                return twin
        return None

    def _owned(self, principals: Sequence[str], memory_id: int) -> Memory:
        memory = self.store.get(memory_id)
        if memory is None or memory.principal not in principals or memory.forgotten is not None:
            raise MemoryRequestError(
                "memory-not-found",
                f"no memory {memory_id} is yours to change.",
                hint="recall or list memories to find the id.",
                param="id",
            )
        return memory

    def update(
        self, principals: Sequence[str], memory_id: int, changes: Mapping[str, Any]
    ) -> Memory:
        """Change a memory's fields; a new text is embedded and indexed again."""
        with self._lock:
            memory = self._owned(principals, memory_id)
            draft = check_draft(
                Draft(
                    text=changes.get("text") or memory.text,
                    kind=changes.get("kind") or memory.kind,
                    place=changes["place"] if "place" in changes else memory.place,
                    time=changes["time"] if "time" in changes else memory.time,
                    people=tuple(changes.get("people") or memory.people),
                    tags=tuple(changes.get("tags") or memory.tags),
                    skill=changes["skill"] if "skill" in changes else memory.skill,
                )
            )
            updated = msgspec.structs.replace(
                memory,
                text=draft.text,
                kind=draft.kind,
                place=draft.place,
                time=draft.time,
                people=draft.people,
                tags=draft.tags,
                skill=draft.skill,
                updated=self._clock(),
            )
            vector = self._vector(updated.text)
            self.store.replace(updated, self.embedder.model_id, vector)
            self.index().add([(updated, vector)])
            return updated

    def forget(
        self, principals: Sequence[str], memory_id: int, *, after: Sequence[str] = ()
    ) -> Memory:
        """Set a memory apart: recalled no more, restorable for :data:`FORGET_GRACE`, then
        purged. Its id is never given to another memory. ``after``: the untrusted sources
        the forgetting conversation had read (kept with it, shown in the Brain)."""
        with self._lock:
            memory = self._owned(principals, memory_id)
            now = self._clock()
            self.store.forget(memory_id, now, after)
            self.index().remove(memory)
            self.purge()
            return msgspec.structs.replace(memory, forgotten=now, forgotten_after=tuple(after))

    def restore(self, principals: Sequence[str] | None, memory_id: int) -> Memory:
        """Bring a forgotten memory back (recallable again, with its id), unless its grace
        has passed (then it is purged, now if not before)."""
        with self._lock:
            self.purge()
            memory = self.store.get(memory_id)
            if (
                memory is None
                or memory.forgotten is None
                or (principals is not None and memory.principal not in principals)
            ):
                raise MemoryRequestError(
                    "memory-not-found",
                    f"no forgotten memory {memory_id} to restore.",
                    hint="list the forgotten memories to find the id.",
                    param="id",
                )
            self.store.restore(memory_id)
            restored = msgspec.structs.replace(memory, forgotten=None, forgotten_after=())
            vector = self.store.vector(memory_id, self.embedder.model_id, self.embedder.dim)
            if vector is None:
                vector = self._vector(memory.text)
                self.store.replace(restored, self.embedder.model_id, vector)
            self.index().add([(restored, vector)])
            return restored

    def forgotten(self, principals: Sequence[str] | None, limit: int = 50) -> list[Memory]:
        """The forgotten memories still restorable, the latest forgotten first."""
        self.purge()
        return self.store.forgotten(principals, max(1, min(limit, 1000)))

    def purge(self) -> list[int]:
        """Remove for good what was forgotten more than :data:`FORGET_GRACE` ago."""
        return self.store.purge(self._clock() - FORGET_GRACE)

    def promote(self, memory_id: int) -> Memory:
        """Make an agent's memory the owner's (the owner's decision, from the CLI)."""
        with self._lock:
            memory = self.store.get(memory_id)
            if memory is None:
                raise MemoryRequestError("memory-not-found", f"no memory {memory_id}.", param="id")
            if not is_agent(memory.principal):
                return memory
            index = self.index()
            index.remove(memory)
            promoted = msgspec.structs.replace(memory, principal=OWNER, updated=self._clock())
            vector = self._vector(promoted.text)
            self.store.replace(promoted, self.embedder.model_id, vector)
            index.add([(promoted, vector)])
            return promoted

    # -- reads --------------------------------------------------------------------------
    def recall(
        self,
        principals: Sequence[str],
        *,
        query: str | None = None,
        location: str | None = None,
        people: Sequence[str] = (),
        since: str | None = None,
        until: str | None = None,
        kind: Kind | None = None,
        tags: Sequence[str] = (),
        k: int = 5,
        tz: dt.tzinfo = dt.UTC,
    ) -> list[Recalled]:
        """The k memories that best answer ``query``, among those matching the filters.

        ``since``/``until``: inclusive ISO prefixes of when the memory happened (its
        ``time``, else when it was stored, in ``tz``). Without a query, the memories of
        the place or the period, the latest first."""
        query = _clean(query, "query", MAX_TEXT)
        location = _clean(location, "location")
        since, until = check_time(since, "since"), check_time(until, "until")
        if query is None and location is None and since is None and until is None:
            raise MemoryRequestError(
                "no-query-or-location",
                # the seed's envelope, byte for byte (a time alone also recalls)
                "recall requires either a query or a location.",
                hint="pass query= to search by topic, or location= to filter by place.",
            )
        k = max(1, min(int(k), MAX_K))
        people = _names(people, "people")
        keep = functools.partial(
            _matches, people=people, since=since, until=until, kind=kind, tags=tags, tz=tz
        )
        if query is None:
            rows = self.store.recent(
                principals,
                10 * k + 100,
                place=location,
                since=since,
                until=until,
                offset=_offset(tz, self._clock()),
            )
            hits = [m for m in rows if keep(m, place=None)]
            hits.sort(key=lambda m: _when(m, tz), reverse=True)
            return [Recalled(memory=m, score=1.0) for m in hits[:k]]
        vector = self._vector(query)
        index = self.index()
        n = max(CANDIDATES, 10 * k)
        fused = fusion.fuse(
            index.semantic(principals, vector, n),
            index.keyword(principals, query, n),
            index.rare(principals, query),
        )
        step = FETCH_FACTOR * k
        head = sorted(fused, key=lambda m: -fused[m])[: max(HEAD, step)]
        found = self.store.many([*head, *fusion.neighbours(head)])
        scores = fusion.lift(fused, head, found, query)
        ranked = sorted(scores.items(), key=lambda kv: -kv[1])
        out: list[Recalled] = []
        # Rows are read in rank order, a few more than k at a time: filters that drop many
        # read further, an unfiltered recall reads what the head read.
        for pos, (mid, score) in enumerate(ranked):
            if mid not in found:
                found.update(self.store.many(m for m, _ in ranked[pos : pos + step]))
            memory = found.get(mid)
            if memory is None or memory.principal not in principals or memory.forgotten:
                continue
            if not keep(memory, place=location):
                continue
            out.append(Recalled(memory=memory, score=round(min(1.0, score / fusion.BEST), 4)))
            if len(out) >= k:
                break
        return out

    def recent(self, principals: Sequence[str] | None, limit: int = 20) -> list[Memory]:
        return self.store.recent(principals, max(1, min(limit, 1000)))

    def get(self, memory_id: int) -> Memory | None:
        return self.store.get(memory_id)

    def rules(self, principals: Sequence[str], skills: Iterable[str]) -> dict[str, list[str]]:
        """The personalisation rules linked to each skill: the memories that name it."""
        out: dict[str, list[str]] = {}
        for skill in dict.fromkeys(skills):
            rows = self.store.recent(principals, 50, skill=skill)
            if rows:
                out[skill] = [m.text for m in rows]
        return out

    def all_rules(self, principals: Sequence[str] | None) -> list[Memory]:
        return self.store.recent(principals, 1000, linked=True)

    # -- export / import ----------------------------------------------------------------
    def export(self, principals: Sequence[str] | None = None) -> Iterator[dict[str, Any]]:
        for memory, _ in self.store.vectors(self.embedder.model_id, self.embedder.dim):
            if principals is None or memory.principal in principals:
                yield msgspec.to_builtins(memory)

    def import_rows(self, rows: Iterable[Any]) -> dict[str, int]:
        """Store exported rows (new ids; near-duplicates merge), embedded in batches; bad
        rows are counted, not fatal."""
        stored = merged = bad = 0
        batch: list[tuple[Draft, Provenance]] = []

        def flush() -> None:
            nonlocal stored, merged
            for who, group in itertools.groupby(batch, key=lambda it: it[1]):
                for _, was_merged in self.store_many([d for d, _ in group], who):
                    merged += was_merged
                    stored += not was_merged
            batch.clear()

        for row in rows:
            try:
                batch.append(_imported(row))
            except (MemoryRequestError, TypeError, ValueError):
                bad += 1
            if len(batch) >= IMPORT_BATCH:
                flush()
        flush()
        return {"stored": stored, "merged": merged, "rejected": bad}

    def status(self) -> dict[str, Any]:
        with self._lock:
            index = self._index
            return {
                "memories": self.store.count(),
                "index": index.stats() if index is not None else None,
            }

"""The memory indexes, apart from the tool index: HNSW over vectors, Tantivy over the words.

Vectors live in one usearch HNSW graph per principal (int8 scalar
quantisation, cosine): an agent's memories never share a graph with the
owner's, and 100,000 memories of 384 dimensions take ~40 MB instead of the
~150 MB of float32 rows. The words (text, place, people, tags) live in one
Tantivy index with the principal as a raw field every query filters on.

Neither index is the truth: ``chalie.db`` is. A saved index records the
table's generation; an index whose generation differs (a crash between a
write and a save) is rebuilt from the stored vectors, without embedding.

A Tantivy commit syncs its files (tens of milliseconds, more on a busy disk),
so a write does not commit: the memory joins a small in-memory tail that
keyword searches scan beside the committed index, and a committer thread
moves the tail into Tantivy within :data:`COMMIT_AFTER` seconds (or at
:data:`COMMIT_BATCH` memories, or at close). A stored memory is recallable,
by meaning and by words, the moment ``add`` returns.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import numpy as np

# onnxruntime (the embedder's engine) must be loaded before usearch: the other
# order crashes the process in onnxruntime's import (usearch 2.26, onnxruntime 1.32).
import onnxruntime  # noqa: F401  # isort: skip
import tantivy
from usearch.index import Index as Hnsw

from chalie.memory.records import Memory

log = logging.getLogger("chalie.memory")

CONNECTIVITY: Final = 12
EXPANSION_ADD: Final = 96
# The recall's graph search breadth. At 100,000 memories (bench_memory's composed vectors,
# 200 queries, search of 50): ef 64 0.37 ms and 0.866 of the exact top 10, 96 0.64 ms and
# 0.878, 128 0.88 ms and 0.885: kept at 96 (a recall's semantic side is worth 0.3 ms).
EXPANSION_SEARCH: Final = 96
# A store's near-twin check (chalie.memory.book, a cosine distance <= 0.07) needs far less:
# 1,000 stored vectors (a little noise added) searched among 100,000: ef 16 and 32 find
# every one (ef 8: 997), 0.14 / 0.20 ms a search against 0.49 at 96.
TWIN_EF: Final = 32
_WRITER_HEAP: Final = 15_000_000
MANIFEST: Final = "manifest.json"
WORD: Final = re.compile(r"\w+", re.UNICODE)
MAX_QUERY_WORDS: Final = 32
# English function words: what a question is made of, not what it is about (content_words).
FUNCTION_WORDS: Final = frozenset(
    """a an the and or but if of at by for with about to from in on into over under what when
    where who whom whose which why how did do does done is was are were be been being am has
    have had having i you he she it we they me him her us them my your his its our their mine
    yours this that these those there here so than then too very can could would should will
    shall may might must not no nor just also only any some all each both more most such own
    same other s t don""".split()
)
COMMIT_AFTER: Final = 1.0
COMMIT_BATCH: Final = 2000
# The newest vectors of each principal, also searched exactly: HNSW is approximate, and a
# new memory among many near-identical ones can get no links back to it and be missed by
# every search that does not start from its own words.
FRESH: Final = 1024
# A query word in at most this many memories is rare (a name, a code, a reference): the
# memories that hold it are a list of their own in the fusion (chalie.memory.book).
RARE_DOCS: Final = 3
# ... and in at most this share of them: in a small index every word is rare, and none is.
RARE_SHARE: Final = 0.01


class MemoryIndexError(RuntimeError):
    """The memory index is unreadable or a write to it failed."""


def _schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("mid", stored=True, tokenizer_name="raw")
    sb.add_text_field("principal", stored=False, tokenizer_name="raw")
    sb.add_text_field("text", stored=False, tokenizer_name="en_stem")
    return sb.build()


def words_of(memory: Memory) -> str:
    """What the keyword index reads of a memory."""
    return " ".join((memory.text, memory.place or "", *memory.people, *memory.tags, memory.kind))


def query_words(text: str) -> list[str]:
    """The words of a query, lowercased: no query syntax survives (AND, quotes, fields)."""
    return [w.lower() for w in WORD.findall(text)][:MAX_QUERY_WORDS]


def content_words(text: str) -> list[str]:
    """The query's words the keyword ranking weighs: its English function words dropped
    (all of them kept when nothing else is left). A question's "what did ... do" otherwise
    matched every short remark that asks one ("Wow! What did you get?"), which BM25's
    length norm puts first; and a function word is never the rare word a memory is found
    by (a possessive's "s" could be). LoCoMo-tune any@10 0.809 -> 0.826, all@10 0.694 ->
    0.710 (any@5 0.736 -> 0.726, won back with :data:`chalie.memory.fusion.ASKS`)."""
    words = query_words(text)
    return [w for w in words if w not in FUNCTION_WORDS] or words


def _terms(text: str) -> frozenset[str]:
    """Words for the tail's exact match: lowercased, a plural's s dropped."""
    out = set()
    for w in WORD.findall(text.lower()):
        out.add(w[:-1] if len(w) > 3 and w.endswith("s") else w)
    return frozenset(out)


# Tantivy's en_stem, token for token: the tail's words are the words the index will hold.
_STEMS: Final = (
    tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
    .filter(tantivy.Filter.remove_long(40))
    .filter(tantivy.Filter.lowercase())
    .filter(tantivy.Filter.stemmer("english"))
    .build()
)
# Tantivy's BM25 constants.
K1: Final = 1.2
B: Final = 0.75


class Fresh:
    """A principal's newest FRESH vectors in one preallocated matrix (a ring: the oldest
    slot is reused), searched exactly: no per-search stacking of rows."""

    def __init__(self, dim: int) -> None:
        self.rows = np.zeros((FRESH, dim), dtype=np.float32)
        self.keys = np.full(FRESH, -1, dtype=np.int64)
        self.slot: dict[int, int] = {}
        self.next = 0

    def put(self, key: int, row: Any) -> None:
        """``key``'s vector, as the newest (a key already here moves to the newest slot)."""
        self.drop(key)
        at = self.next
        self.next = (at + 1) % FRESH
        old = int(self.keys[at])
        if old >= 0:
            self.slot.pop(old, None)
        self.keys[at] = key
        self.rows[at] = row
        self.slot[key] = at

    def drop(self, key: int) -> None:
        at = self.slot.pop(key, None)
        if at is not None:
            self.keys[at] = -1
            self.rows[at] = 0.0

    def nearest(self, query: Any, n: int) -> list[tuple[int, float]]:
        """(key, cosine distance) of the n nearest, nearest first."""
        if not self.slot:
            return []
        near = 1.0 - self.rows @ query
        near[self.keys < 0] = np.inf
        # stable: equal distances (the same words stored twice) keep the oldest first
        best = np.argsort(near, kind="stable")[: min(n, len(self.slot))]
        return [(int(self.keys[i]), float(near[i])) for i in best.tolist()]


class Tail(NamedTuple):
    """A memory written but not yet in Tantivy: its principal, its words for the rare-word
    match, and its stems (with counts) and length for BM25."""

    principal: str
    terms: frozenset[str]
    stems: Counter[str]
    length: int

    @classmethod
    def of(cls, memory: Memory) -> Tail:
        words = words_of(memory)
        stems = _STEMS.analyze(words)
        return cls(memory.principal, _terms(words), Counter(stems), len(stems))


def _file_for(principal: str) -> str:
    return hashlib.sha256(principal.encode()).hexdigest()[:20] + ".usearch"


def _new_graph(dim: int) -> Hnsw:
    return Hnsw(
        ndim=dim,
        metric="cos",
        dtype="i8",
        connectivity=CONNECTIVITY,
        expansion_add=EXPANSION_ADD,
        expansion_search=EXPANSION_SEARCH,
    )


class MemoryIndex:
    """Both indexes of one data directory (or in RAM: ``directory`` None)."""

    def __init__(self, directory: Path | None, *, dim: int, model_id: str) -> None:
        self.directory = directory
        self.dim = dim
        self.model_id = model_id
        self._graphs: dict[str, Hnsw] = {}
        self._fresh: dict[str, Fresh] = {}
        self._lock = threading.RLock()
        self._text: tantivy.Index
        self._schema = _schema()
        # Not yet in Tantivy: id -> (principal, its words), and ids to delete there.
        self._tail: dict[int, Tail] = {}
        # The keyword field's tokens written to Tantivy (by this index and the saved ones it
        # opened; None: unknown, an index saved before they were counted): the tail's BM25
        # needs the average length.
        self._tokens: int | None = 0
        self._gone: set[int] = set()
        self._text_lock = threading.Lock()  # the Tantivy writer: the committer and bulk
        self._dirty = threading.Event()
        self._closing = threading.Event()
        self._committer: threading.Thread | None = None
        self._pending_text: dict[int, Memory] = {}
        # Called after each commit of the committer (the book checkpoints chalie.db's WAL).
        self.after_commit: Callable[[], None] | None = None
        # One writer for the index's life (under _text_lock): a commit does not wait for
        # merges, which go on in Tantivy's own threads; close waits for them.
        self._writer: Any = None

    # -- lifecycle --------------------------------------------------------------------
    @classmethod
    def empty(cls, directory: Path | None, *, dim: int, model_id: str) -> MemoryIndex:
        """A new index; a directory's old contents are removed first."""
        index = cls(directory, dim=dim, model_id=model_id)
        if directory is None:
            index._text = tantivy.Index(index._schema)
        else:
            if directory.exists():
                shutil.rmtree(directory)
            (directory / "text").mkdir(parents=True, mode=0o700)
            (directory / "vectors").mkdir(mode=0o700)
            index._text = tantivy.Index(index._schema, path=str(directory / "text"))
        index._text.config_reader(reload_policy="Manual")
        return index

    @classmethod
    def open(
        cls, directory: Path, *, dim: int, model_id: str, generation: int
    ) -> MemoryIndex | None:
        """The saved index if it is current for ``generation`` and the model, else None."""
        try:
            manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if (
            not isinstance(manifest, dict)
            or manifest.get("generation") != generation
            or manifest.get("model_id") != model_id
            or manifest.get("dim") != dim
            or not isinstance(manifest.get("principals"), dict)
        ):
            return None
        index = cls(directory, dim=dim, model_id=model_id)
        tokens = manifest.get("tokens")
        index._tokens = tokens if isinstance(tokens, int) and tokens >= 0 else None
        try:
            index._text = tantivy.Index.open(str(directory / "text"))
            index._text.config_reader(reload_policy="Manual")
            index._text.reload()
            for principal, name in manifest["principals"].items():
                if not isinstance(name, str) or name != _file_for(str(principal)):
                    return None
                graph = Hnsw.restore(str(directory / "vectors" / name), view=False)
                if graph is None or graph.ndim != dim:
                    return None
                graph.expansion_search = EXPANSION_SEARCH  # type: ignore[misc]  # usearch types it read-only; it has a setter
                index._graphs[str(principal)] = graph
        except (OSError, ValueError, RuntimeError) as exc:
            log.warning("memory index unreadable; it will be rebuilt: %s", exc)
            return None
        return index

    def save(self, generation: int) -> None:
        """Write the graphs and a manifest naming ``generation`` (the text index is committed)."""
        self.flush()
        if self.directory is None:
            return
        with self._lock:
            vectors = self.directory / "vectors"
            names = {}
            for principal, graph in self._graphs.items():
                name = _file_for(principal)
                tmp = vectors / (name + ".tmp")
                graph.save(str(tmp))
                tmp.replace(vectors / name)
                names[principal] = name
            for stale in vectors.glob("*.usearch"):
                if stale.name not in names.values():
                    stale.unlink()
            manifest = {
                "generation": generation,
                "model_id": self.model_id,
                "dim": self.dim,
                "principals": names,
                "tokens": self._tokens,
            }
            tmp = self.directory / (MANIFEST + ".tmp")
            tmp.write_text(json.dumps(manifest), encoding="utf-8")
            tmp.replace(self.directory / MANIFEST)

    def invalidate(self) -> None:
        """Mark the saved copy stale (before the first write after a save)."""
        if self.directory is not None:
            (self.directory / MANIFEST).unlink(missing_ok=True)

    # -- writes -------------------------------------------------------------------------
    def _graph(self, principal: str) -> Hnsw:
        graph = self._graphs.get(principal)
        if graph is None:
            graph = self._graphs[principal] = _new_graph(self.dim)
        return graph

    def add(self, items: Sequence[tuple[Memory, Any]]) -> None:
        """Index memories (replacing any with the same id) with their unit vectors."""
        if not items:
            return
        with self._lock:
            by_principal: dict[str, list[tuple[int, Any]]] = {}
            for memory, vector in items:
                by_principal.setdefault(memory.principal, []).append((memory.id, vector))
            for principal, rows in by_principal.items():
                graph = self._graph(principal)
                keys = np.array([k for k, _ in rows], dtype=np.uint64)
                present = [int(k) for k in keys if graph.contains(int(k))]
                if present:
                    graph.remove(present)
                matrix = np.vstack([np.asarray(v, dtype=np.float32) for _, v in rows])
                graph.add(keys, matrix, threads=2 if len(rows) > 256 else 1)
                fresh = self._fresh.get(principal)
                if fresh is None:
                    fresh = self._fresh[principal] = Fresh(self.dim)
                for key, row in zip(keys, matrix, strict=True):
                    fresh.put(int(key), row)
            for memory, _ in items:
                self._tail[memory.id] = Tail.of(memory)
                self._gone.add(memory.id)  # its older words, if any, leave Tantivy
                self._pending_text[memory.id] = memory
        self._wake_committer()

    def _wake_committer(self) -> None:
        self._dirty.set()
        if self._committer is None and not self._closing.is_set():
            self._committer = threading.Thread(
                target=self._commit_loop, name="memory-index-commit", daemon=True
            )
            self._committer.start()

    def _commit_loop(self) -> None:
        while not self._closing.is_set():
            self._dirty.wait()
            if self._closing.is_set():
                return
            # gather for a moment: a burst of stores is one commit
            self._closing.wait(COMMIT_AFTER)
            self._dirty.clear()
            try:
                self.flush()
            except MemoryIndexError:
                log.exception("memory keyword index commit failed; retrying")
                self._dirty.set()
            after = self.after_commit
            if after is not None:
                try:
                    after()
                except Exception:
                    log.exception("the memory committer's after-commit step failed")

    def flush(self) -> None:
        """Move the tail into Tantivy and commit (the committer's work; also at save)."""
        with self._text_lock:
            with self._lock:
                adds = dict(self._pending_text)
                gone = set(self._gone)
                self._pending_text.clear()
            if not adds and not gone:
                return
            try:
                writer = self._text_writer()
                for mid in gone:
                    writer.delete_documents_by_term("mid", str(mid))
                for memory in adds.values():
                    writer.add_document(
                        tantivy.Document(
                            mid=str(memory.id), principal=memory.principal, text=words_of(memory)
                        )
                    )
                writer.commit()
                self._text.reload()
            except ValueError as exc:
                self._drop_writer()
                with self._lock:  # try again later: nothing is lost
                    for mid, memory in adds.items():
                        self._pending_text.setdefault(mid, memory)
                raise MemoryIndexError(f"memory keyword index write failed: {exc}") from exc
            with self._lock:
                for mid in gone:
                    if mid not in self._pending_text:
                        self._gone.discard(mid)
                for mid in adds:
                    if mid not in self._pending_text:
                        t = self._tail.pop(mid, None)
                        if t is not None and self._tokens is not None:
                            self._tokens += t.length

    def _text_writer(self) -> Any:
        """The index's writer (the caller holds _text_lock)."""
        if self._writer is None:
            self._writer = self._text.writer(heap_size=_WRITER_HEAP, num_threads=1)
        return self._writer

    def _drop_writer(self) -> None:
        """Let the writer go after its merges (the caller holds _text_lock)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.wait_merging_threads()
            except ValueError as exc:
                log.warning("memory keyword index merge failed: %s", exc)

    def close(self) -> None:
        """Stop the committer (after a last flush) and release the writer."""
        self._closing.set()
        self._dirty.set()
        committer, self._committer = self._committer, None
        if committer is not None:
            committer.join(30)
        self.flush()
        with self._text_lock:
            self._drop_writer()

    def _write_text(self, items: Iterable[tuple[Memory, Any]], *, fresh: bool) -> None:
        """A bulk write straight into Tantivy, committed (a rebuild)."""
        with self._text_lock:
            try:
                writer = self._text_writer()
                for memory, _ in items:
                    mid = str(memory.id)
                    if not fresh:
                        writer.delete_documents_by_term("mid", mid)
                    words = words_of(memory)
                    if self._tokens is not None:
                        self._tokens += len(_STEMS.analyze(words))
                    writer.add_document(
                        tantivy.Document(mid=mid, principal=memory.principal, text=words)
                    )
                writer.commit()
                self._text.reload()
            except ValueError as exc:
                self._drop_writer()
                raise MemoryIndexError(f"memory keyword index write failed: {exc}") from exc

    def bulk(self, items: Iterable[tuple[Memory, Any]], batch: int = 5000) -> int:
        """Fill a new, empty index (a rebuild); returns how many were indexed."""
        done = 0
        chunk: list[tuple[Memory, Any]] = []
        with self._lock:
            for item in items:
                chunk.append(item)
                if len(chunk) >= batch:
                    done += self._bulk_chunk(chunk)
                    chunk = []
            if chunk:
                done += self._bulk_chunk(chunk)
        return done

    def _bulk_chunk(self, chunk: list[tuple[Memory, Any]]) -> int:
        by_principal: dict[str, list[tuple[int, Any]]] = {}
        for memory, vector in chunk:
            by_principal.setdefault(memory.principal, []).append((memory.id, vector))
        for principal, rows in by_principal.items():
            keys = np.array([k for k, _ in rows], dtype=np.uint64)
            self._graph(principal).add(keys, np.vstack([v for _, v in rows]), threads=2)
        self._write_text(chunk, fresh=True)
        return len(chunk)

    def remove_id(self, memory_id: int) -> None:
        """Unindex a memory by its id alone, from whichever principal's graph holds it (one
        gone from the table, or moved to another principal)."""
        with self._lock:
            for graph in self._graphs.values():
                if graph.contains(memory_id):
                    graph.remove(memory_id)
            for fresh in self._fresh.values():
                fresh.drop(memory_id)
            self._tail.pop(memory_id, None)
            self._pending_text.pop(memory_id, None)
            self._gone.add(memory_id)
        self._wake_committer()

    def remove(self, memory: Memory) -> None:
        with self._lock:
            graph = self._graphs.get(memory.principal)
            if graph is not None and graph.contains(memory.id):
                graph.remove(memory.id)
            fresh = self._fresh.get(memory.principal)
            if fresh is not None:
                fresh.drop(memory.id)
            self._tail.pop(memory.id, None)
            self._pending_text.pop(memory.id, None)
            self._gone.add(memory.id)
        self._wake_committer()

    # -- reads --------------------------------------------------------------------------
    def semantic(
        self, principals: Sequence[str], vector: Any, n: int, *, ef: int = EXPANSION_SEARCH
    ) -> list[tuple[int, float]]:
        """(memory id, cosine distance), nearest first, over the principals' graphs; ``ef``:
        the graph search's breadth (a near twin needs less: :data:`TWIN_EF`)."""
        best: dict[int, float] = {}
        query = np.asarray(vector, dtype=np.float32)
        with self._lock:
            for principal in principals:
                graph = self._graphs.get(principal)
                if graph is None or len(graph) == 0:
                    continue
                if graph.expansion_search != ef:
                    # usearch defines the setter after another property's: mypy misses it
                    graph.expansion_search = ef  # type: ignore[misc]
                found = graph.search(query, min(n, len(graph)))
                for k, d in zip(found.keys.tolist(), found.distances.tolist(), strict=True):
                    best[k] = d
                fresh = self._fresh.get(principal)
                if fresh is not None:
                    for k, d in fresh.nearest(query, n):
                        if d < best.get(k, 2.0):
                            best[k] = d
        return sorted(best.items(), key=lambda kd: kd[1])[:n]

    def keyword(self, principals: Sequence[str], text: str, n: int) -> list[tuple[int, float]]:
        """(memory id, BM25 score), best first, among the principals' memories (the query's
        content words: :func:`content_words`)."""
        words = content_words(text)
        if not words or not principals:
            return []
        with self._lock:
            gone = set(self._gone)
            # Only when another principal has memories here does the query need the
            # principal clause: without it Tantivy's top-k pruning (block-WAND) skips most
            # of the postings, with it every matching memory is scored.
            others = self._others(principals)
            stems = list(dict.fromkeys(_STEMS.analyze(" ".join(words))))
            tail = [(mid, t) for mid, t in self._tail.items() if t.principal in principals]
            everyone = len(self._tail)
            tail_tokens = sum(t.length for t in self._tail.values())
            known = self._tokens
        try:
            query = self._text.parse_query(" ".join(words), ["text"])
            if others:
                query = self._theirs(query, principals)
            searcher = self._text.searcher()
            hits = searcher.search(query, n + len(gone), count=False).hits
            found = [(int(searcher.doc(addr)["mid"][0]), float(score)) for score, addr in hits]
            if known is not None:
                avgdl = (known + tail_tokens) / max(1, int(searcher.num_docs) + everyone)
            else:  # an index saved before lengths were kept: the tail's own average
                avgdl = tail_tokens / max(1, everyone)
            fresh = self._tail_scores(searcher, stems, tail, everyone, max(1.0, avgdl))
        except ValueError as exc:
            raise MemoryIndexError(f"memory keyword search failed: {exc}") from exc
        # One ranking for both: the tail is scored by BM25 with the index's statistics (its
        # own words counted in), as Tantivy will score it once committed.
        out = fresh + [(mid, sc) for mid, sc in found if mid not in gone]
        out.sort(key=lambda kv: -kv[1])
        return out[:n]

    def _tail_scores(
        self,
        searcher: tantivy.Searcher,
        stems: Sequence[str],
        tail: Sequence[tuple[int, Tail]],
        everyone: int,
        avgdl: float,
    ) -> list[tuple[int, float]]:
        """BM25 of the tail's memories for the query's stems (Tantivy's formula, with the
        index's statistics and the tail's own words counted in)."""
        matching = [(mid, t) for mid, t in tail if any(s in t.stems for s in stems)]
        if not matching:
            return []
        docs = int(searcher.num_docs) + everyone
        out = []
        with self._lock:
            tail_df = {s: sum(1 for t in self._tail.values() if s in t.stems) for s in stems}
        for mid, t in matching:
            score = 0.0
            for stem in stems:
                tf = t.stems.get(stem, 0)
                if not tf:
                    continue
                df = int(searcher.doc_freq("text", stem)) + tail_df[stem]
                idf = math.log(1.0 + (docs - df + 0.5) / (df + 0.5))
                norm = tf + K1 * (1.0 - B + B * t.length / avgdl)
                score += (K1 + 1.0) * idf * tf / norm
            out.append((mid, score))
        return out

    def _others(self, principals: Sequence[str]) -> bool:
        """Whether another principal has memories here (the caller holds _lock)."""
        return any(p not in principals and len(g) for p, g in self._graphs.items())

    def _theirs(self, query: tantivy.Query, principals: Sequence[str]) -> tantivy.Query:
        """``query`` among the principals' memories only."""
        who = tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "principal", p))
                for p in principals
            ]
        )
        return tantivy.Query.boolean_query([(tantivy.Occur.Must, query), (tantivy.Occur.Must, who)])

    def rare(self, principals: Sequence[str], text: str) -> list[int]:
        """The memories holding a rare word of the query (one in at most RARE_DOCS memories
        and RARE_SHARE of them all), the not yet committed ones first. A word Tantivy
        indexes under another form (a stem) has no postings of its own and counts as none."""
        words = list(dict.fromkeys(content_words(text)))
        if not words or not principals:
            return []
        with self._lock:
            gone = set(self._gone)
            others = self._others(principals)
            most = min(RARE_DOCS, int(RARE_SHARE * sum(len(g) for g in self._graphs.values())))
            tail = [(mid, t.terms) for mid, t in self._tail.items() if t.principal in principals]
        out: list[int] = []
        if most < 1:
            return out
        try:
            searcher = self._text.searcher()
            for word in words:
                (key,) = _terms(word) or {word}
                fresh = [mid for mid, terms in tail if key in terms]
                indexed = int(searcher.doc_freq("text", word))
                if not 0 < indexed + len(fresh) <= most:
                    continue
                out += fresh
                if indexed:
                    query = tantivy.Query.term_query(self._schema, "text", word)
                    if others:
                        query = self._theirs(query, principals)
                    hits = searcher.search(query, RARE_DOCS + len(gone), count=False).hits
                    found = (int(searcher.doc(addr)["mid"][0]) for _, addr in hits)
                    out += [mid for mid in found if mid not in gone]  # gone: old words
        except ValueError as exc:
            raise MemoryIndexError(f"memory keyword search failed: {exc}") from exc
        return list(dict.fromkeys(out))

    def __len__(self) -> int:
        with self._lock:
            return sum(len(g) for g in self._graphs.values())

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "vectors": len(self),
                "principals": len(self._graphs),
                "vector_bytes": sum(int(g.memory_usage) for g in self._graphs.values()),
                "text_docs": int(self._text.searcher().num_docs),
                "text_tail": len(self._tail),
                "model_id": self.model_id,
            }

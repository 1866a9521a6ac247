"""The name side of discovery: name segments, the exact-name rung and the gated trigram rung.

A Tantivy index holds tool names only (never prose). Two rungs read it:

1. exact: the normalised entry equals a tool's normalised name, or the bare
   name of a namespaced tool (``_mcp_<server>_<tool>`` → ``<tool>``). A bare
   name owned by more than one source is refused with its candidates.
2. keyword: the entry's trigrams, OR-ed, fetch candidate names; the
   name-segment gate then keeps a candidate only when *every* segment of the
   entry lines up with a whole segment of the name. ``search`` passes for
   ``web_search``; ``all`` inside ``review_tool_calls`` does not, and neither
   does a described action such as "find all the calls I missed", whose
   incidental words would otherwise hide better vector hits.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import tantivy

from chalie.discovery.types import IndexCorruptError, ToolDoc
from chalie.wire.mcp_names import server_prefix

TRI_TOKENIZER: Final = "chalie_tri"
# Trigram hits are only candidates; the gate runs on this many of them.
CANDIDATE_POOL: Final = 64
_WRITER_HEAP: Final = 15_000_000
_WORD: Final = re.compile(r"[^\W_]+")
_CAMEL: Final = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_ASCII_ALNUM: Final = re.compile(r"^[A-Za-z0-9]+$")


def segments(text: str) -> tuple[str, ...]:
    """Lower-case name segments: split on non-alphanumerics, underscores and camelCase."""
    out: list[str] = []
    for word in _WORD.findall(text):
        if _ASCII_ALNUM.match(word):
            out.extend(part.lower() for part in _CAMEL.findall(word))
        else:
            out.append(word.lower())
    return tuple(out)


def normalise(text: str) -> str:
    """The form the exact rung compares: ``Web Search``, ``webSearch`` → ``web_search``."""
    return "_".join(segments(text))


def bare_name(doc: ToolDoc) -> str:
    """A namespaced tool's own name: ``_mcp_github_search`` from ``mcp:github`` → ``search``."""
    if doc.source.startswith("mcp:"):
        prefix = server_prefix(doc.source[4:])
        if doc.name.startswith(prefix) and len(doc.name) > len(prefix):
            return doc.name[len(prefix) :]
    return doc.name


def _within_one_edit(a: str, b: str) -> bool:
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    if len(a) == len(b):
        # one substitution, or one swap of neighbours (a common typo)
        rest_a, rest_b = a[i + 1 :], b[i + 1 :]
        if rest_a == rest_b:
            return True
        return a[i + 2 :] == b[i + 2 :] and a[i : i + 2] == b[i : i + 2][::-1]
    return a[i:] == b[i + 1 :]


def _segment_aligns(q: str, s: str) -> bool:
    """Does one entry segment stand for one whole name segment?"""
    if q == s:
        return True
    # an abbreviation that starts the segment: calc → calculator
    if len(q) >= 4 and s.startswith(q):
        return True
    # an inflection of the segment: events → event, searching → search
    if len(s) >= 3 and q.startswith(s) and len(q) - len(s) <= 3:
        return True
    # a typo in a long enough segment: revew → review
    return len(q) >= 5 and len(s) >= 5 and _within_one_edit(q, s)


def gate(entry_segments: Sequence[str], name_segments: Sequence[str]) -> float | None:
    """Name-segment alignment: the share of the name covered, or None when the gate rejects.

    Every entry segment must line up with a distinct whole name segment (or a
    run of consecutive segments written as one word: ``websearch``). Entry
    segments that do not align make the whole entry fail: a sentence whose
    incidental words happen to touch a name is not a name.
    """
    if not entry_segments or not name_segments:
        return None
    used = [False] * len(name_segments)
    for q in entry_segments:
        hit = False
        for i, s in enumerate(name_segments):
            if not used[i] and _segment_aligns(q, s):
                used[i] = hit = True
                break
        if hit:
            continue
        for i in range(len(name_segments)):
            joined = ""
            for j in range(i, len(name_segments)):
                if used[j]:
                    break
                joined += name_segments[j]
                if j > i and joined == q:
                    for m in range(i, j + 1):
                        used[m] = True
                    hit = True
                    break
                if len(joined) >= len(q):
                    break
            if hit:
                break
        if not hit:
            return None
    return sum(used) / len(name_segments)


@dataclass(frozen=True)
class ExactMatch:
    """The exact rung's verdict: pinned names, or an ambiguous bare name with its candidates."""

    names: tuple[str, ...] = ()
    candidates: tuple[str, ...] = ()

    @property
    def ambiguous(self) -> bool:
        return bool(self.candidates)


def _schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("name", stored=True, tokenizer_name="raw")
    sb.add_text_field("norm", stored=False, tokenizer_name="raw")
    sb.add_text_field("bare", stored=False, tokenizer_name="raw")
    sb.add_text_field("source", stored=True, tokenizer_name="raw")
    sb.add_text_field("name_tri", stored=False, tokenizer_name=TRI_TOKENIZER)
    return sb.build()


def _trigrams() -> Any:
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.ngram(3, 3, False))
        .filter(tantivy.Filter.lowercase())
        .build()
    )


class NameIndex:
    """Tantivy over tool names: exact lookups, trigram candidates and the segment gate.

    Writes are serialised by a lock (Tantivy allows one writer); searches take a
    fresh searcher after every commit, so a reader never sees a half-applied change.
    """

    def __init__(self, index: tantivy.Index, directory: Path | None) -> None:
        self._index = index
        self._analyzer = _trigrams()
        self._index.register_tokenizer(TRI_TOKENIZER, self._analyzer)
        self.directory = directory
        self._lock = threading.Lock()
        self._searcher = self._fresh_searcher()
        # Name → segments: the gate runs on every candidate of every find.
        self._segments: dict[str, tuple[str, ...]] = {}
        # An entry with more segments than any name cannot pass the gate, so a
        # described action (a sentence) skips the trigram search altogether.
        self._max_segments = max((len(self._segments_of(n)) for n in self.all_names()), default=0)

    # -- lifecycle --------------------------------------------------------
    @classmethod
    def create(cls, directory: Path | None = None) -> NameIndex:
        """A new, empty index: in RAM, or on disk in an empty ``directory``."""
        if directory is None:
            return cls(tantivy.Index(_schema()), None)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        return cls(tantivy.Index(_schema(), path=str(directory)), directory)

    @classmethod
    def open(cls, directory: Path) -> NameIndex:
        """Open a persisted index; anything wrong with it is an IndexCorruptError."""
        if not (directory / "meta.json").is_file():
            raise IndexCorruptError(f"name index missing in {directory}")
        try:
            index = tantivy.Index.open(str(directory))
            names = cls(index, directory)
            names._check_schema()
        except (ValueError, OSError, KeyError) as exc:
            raise IndexCorruptError(f"name index in {directory} is unreadable: {exc}") from exc
        return names

    def _check_schema(self) -> None:
        schema = self._index.schema
        for field in ("name", "norm", "bare", "source", "name_tri"):
            tantivy.Query.term_query(schema, field, "x")  # ValueError for a foreign schema
        # touch the data so a truncated segment fails here, not in a find
        self._searcher.search(tantivy.Query.all_query(), 1)

    def _segments_of(self, name: str) -> tuple[str, ...]:
        segs = self._segments.get(name)
        if segs is None:
            if len(self._segments) > 200_000:
                self._segments.clear()
            segs = self._segments[name] = segments(name)
        return segs

    def _fresh_searcher(self) -> tantivy.Searcher:
        self._index.reload()
        return self._index.searcher()

    # -- writes -----------------------------------------------------------
    def upsert(self, docs: Iterable[ToolDoc], *, fresh: bool = False) -> None:
        """Add tools, replacing any with the same name, in one commit.

        ``fresh`` says the index is new and the names unique, so nothing needs deleting.
        """
        batch = list(docs)
        if not batch:
            return
        with self._lock:
            try:
                writer = self._index.writer(heap_size=_WRITER_HEAP, num_threads=1)
                for doc in batch:
                    if not fresh:
                        writer.delete_documents_by_term("name", doc.name)
                    writer.add_document(
                        tantivy.Document.from_dict(
                            {
                                "name": doc.name,
                                "norm": normalise(doc.name),
                                "bare": normalise(bare_name(doc)),
                                "source": doc.source,
                                "name_tri": normalise(doc.name),
                            },
                            self._index.schema,
                        )
                    )
                self._commit(writer)
            except ValueError as exc:
                raise IndexCorruptError(f"name index write failed: {exc}") from exc
            widest = max(len(self._segments_of(d.name)) for d in batch)
            self._max_segments = max(self._max_segments, widest)

    def remove(self, names: Iterable[str]) -> None:
        gone = list(names)
        if not gone:
            return
        with self._lock:
            try:
                writer = self._index.writer(heap_size=_WRITER_HEAP, num_threads=1)
                for name in gone:
                    writer.delete_documents_by_term("name", name)
                self._commit(writer)
                for name in gone:
                    self._segments.pop(name, None)
            except ValueError as exc:
                raise IndexCorruptError(f"name index write failed: {exc}") from exc

    def _commit(self, writer: tantivy.IndexWriter) -> None:
        # Waiting for the merges means no Tantivy thread writes into the
        # directory after a write returns: a build renames it right away.
        writer.commit()
        writer.wait_merging_threads()
        self._searcher = self._fresh_searcher()

    # -- reads ------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._searcher.num_docs)

    def all_names(self) -> list[str]:
        searcher = self._searcher
        total = int(searcher.num_docs)
        if total == 0:
            return []
        hits = searcher.search(tantivy.Query.all_query(), total).hits
        return sorted(str(searcher.doc(addr)["name"][0]) for _, addr in hits)

    def _terms(self, field: str, value: str, limit: int = 16) -> list[tuple[str, str]]:
        searcher = self._searcher
        query = tantivy.Query.term_query(self._index.schema, field, value)
        try:
            hits = searcher.search(query, limit).hits
            out = []
            for _, addr in hits:
                doc = searcher.doc(addr)
                out.append((str(doc["name"][0]), str(doc["source"][0])))
        except ValueError as exc:
            raise IndexCorruptError(f"name index unreadable: {exc}") from exc
        return sorted(out)

    def exact(self, entry: str) -> ExactMatch:
        """The exact-name rung: a full name wins; a bare name must have one owner."""
        norm = normalise(entry)
        if not norm:
            return ExactMatch()
        full = self._terms("norm", norm)
        if len(full) == 1:
            return ExactMatch(names=(full[0][0],))
        if len(full) > 1:
            # two spellings that normalise alike (WebSearch, web_search) are as ambiguous
            return ExactMatch(candidates=tuple(name for name, _ in full))
        bare = self._terms("bare", norm)
        if len(bare) == 1:
            return ExactMatch(names=(bare[0][0],))
        if len(bare) > 1:
            return ExactMatch(candidates=tuple(name for name, _ in bare))
        return ExactMatch()

    def keyword(self, entry: str, k: int = 5) -> list[str]:
        """The name-keyword rung: trigram candidates that pass the segment gate, best first."""
        entry_segs = segments(entry)
        norm = "_".join(entry_segs)
        if not entry_segs or k <= 0 or len(entry_segs) > self._max_segments:
            return []
        grams = list(dict.fromkeys(self._analyzer.analyze(norm)))
        if not grams:
            return []
        schema = self._index.schema
        query = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "name_tri", g)) for g in grams]
        )
        searcher = self._searcher
        try:
            hits = searcher.search(query, CANDIDATE_POOL).hits
            scored: list[tuple[float, float, str]] = []
            for score, addr in hits:
                name = str(searcher.doc(addr)["name"][0])
                coverage = gate(entry_segs, self._segments_of(name))
                if coverage is not None:
                    scored.append((coverage, float(score), name))
        except ValueError as exc:
            raise IndexCorruptError(f"name index unreadable: {exc}") from exc
        scored.sort(key=lambda t: (-t[0], -t[1], t[2]))
        return [name for _, _, name in scored[:k]]

"""The vector rung: HNSW over each tool's prose, a lexical assist, and a distance ceiling.

Each tool gets at most two vectors: its *card* (split name and summary) and, when
it has examples, its *examples* (the example phrases joined). A query is embedded
once; HNSW proposes candidates, a tool scores the best cosine similarity of its
vectors plus a small BM25 bonus over the same prose (queries often reuse a
description's rare words, which a 6-layer model underweights), and a tool is
kept only when its score distance ``1 - score`` is at or under the ceiling.

Ceilings are model specific (e5 squeezes all distances into 0.06-0.22), so the
ceiling is calibrated per model id and stored with the index.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hnswlib
import numpy as np
import numpy.typing as npt

from chalie.discovery.embedder import MINILM_MODEL_ID, Embedder, Matrix
from chalie.discovery.types import IndexCorruptError, ToolDoc

log = logging.getLogger(__name__)

FORMAT = 1
# Calibrated on assistant-40 (no-tool queries) and MetaTool dev through the real
# cascade; see tools/bench/bench_discovery_quality.py. Any other model falls back
# to DEFAULT_CEILING (keep the top k, filter nothing) until someone calibrates it.
CEILINGS: dict[str, float] = {MINILM_MODEL_ID: 0.62}
DEFAULT_CEILING = 1.0
LEXICAL_WEIGHT = 0.25
BM25_K1 = 1.2
BM25_B = 0.75
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 200
HNSW_EF = 100
# Candidates HNSW proposes per requested hit: tools have up to two vectors and
# the lexical bonus may reorder the dense list.
CANDIDATES_PER_HIT = 8
MIN_CANDIDATES = 40
MAX_K = 100
MAX_QUERY_CHARS = 2000

_FILES = ("vectors.hnsw", "vectors.npy", "vectors.json")

_WORD = re.compile(r"[a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_STOP = frozenset(
    """a an and are as at be but by can could do does for from get give have how i
    if in into is it its me my need of on or our please should show so some tell
    that the their them then there these this to up us use want was we what when
    where which who why will with would you your""".split()
)


def split_name(name: str) -> str:
    """``get_weather`` → ``get weather``; ``ResearchHelper`` → ``Research Helper``."""
    spaced = _CAMEL.sub(" ", name)
    return re.sub(r"[\W_]+", " ", spaced).strip()


def _stem(word: str) -> str:
    # A light suffix strip: enough to meet "booking"/"book", "recipes"/"recipe".
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def terms(text: str) -> list[str]:
    """Lexical terms: lower-cased words, stop words dropped, lightly stemmed."""
    return [_stem(w) for w in _WORD.findall(split_name(text).lower()) if w not in _STOP]


def card_text(doc: ToolDoc) -> str:
    name = split_name(doc.name)
    summary = doc.summary.strip()
    return f"{name}: {summary}" if summary else name


def examples_text(doc: ToolDoc) -> str:
    return "; ".join(e.strip() for e in doc.examples if e.strip())


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


@dataclass
class _Entry:
    doc: ToolDoc
    slots: list[int]
    tf: Counter[str]
    length: int


class VectorIndex:
    """HNSW (cosine) over tool prose; incremental upsert/remove; saved as three files."""

    def __init__(self, embedder: Embedder, *, ceiling: float | None = None) -> None:
        self.embedder = embedder
        self.model_id = embedder.model_id
        self.dim = int(embedder.dim)
        if ceiling is None:
            ceiling = CEILINGS.get(self.model_id)
            if ceiling is None:
                log.warning("no calibrated ceiling for %s; keeping every top-k hit", self.model_id)
                ceiling = DEFAULT_CEILING
        if not (0.0 <= float(ceiling) <= 2.0):
            raise ValueError(f"ceiling must be within [0, 2], got {ceiling}")
        self.ceiling = float(ceiling)
        self._entries: dict[str, _Entry] = {}
        self._slot_owner: list[str | None] = []
        self._free: list[int] = []
        self._vectors: Matrix = np.zeros((0, self.dim), dtype=np.float32)
        self._digests: list[str] = []
        self._df: Counter[str] = Counter()
        self._total_len = 0
        self._hnsw = self._new_hnsw(64)

    # -- building ---------------------------------------------------------

    def _new_hnsw(self, capacity: int) -> hnswlib.Index:
        ix = hnswlib.Index(space="cosine", dim=self.dim)
        ix.init_index(
            max_elements=max(capacity, 16), ef_construction=HNSW_EF_CONSTRUCTION, M=HNSW_M
        )
        ix.set_ef(HNSW_EF)
        return ix

    def _alloc(self, n: int) -> list[int]:
        slots: list[int] = []
        while self._free and len(slots) < n:
            slots.append(self._free.pop())
        extra = n - len(slots)
        if extra:
            start = len(self._slot_owner)
            self._slot_owner.extend([None] * extra)
            self._digests.extend([""] * extra)
            self._vectors = np.vstack(
                [self._vectors, np.zeros((extra, self.dim), dtype=np.float32)]
            )
            slots.extend(range(start, start + extra))
        need = len(self._slot_owner)
        if need > self._hnsw.get_max_elements():
            self._hnsw.resize_index(max(need, 2 * self._hnsw.get_max_elements()))
        return slots

    def _forget(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        for slot in entry.slots:
            self._hnsw.mark_deleted(slot)
            self._slot_owner[slot] = None
            self._free.append(slot)
        for term in entry.tf:
            self._df[term] -= 1
            if self._df[term] <= 0:
                del self._df[term]
        self._total_len -= entry.length

    def upsert(self, docs: Sequence[ToolDoc]) -> None:
        """Add or replace tools; text whose vector is already held is not embedded again."""
        latest: dict[str, ToolDoc] = {}
        for doc in docs:
            if not isinstance(doc, ToolDoc) or not doc.name:
                raise ValueError(f"not a named ToolDoc: {doc!r}")
            latest[doc.name] = doc
        if not latest:
            return
        known: dict[str, Matrix] = {}
        for name in latest:
            old = self._entries.get(name)
            if old is not None:
                for slot in old.slots:
                    known[self._digests[slot]] = self._vectors[slot].copy()
        plan: list[tuple[str, list[str]]] = []
        for name, doc in latest.items():
            texts = [card_text(doc)]
            if examples_text(doc):
                texts.append(examples_text(doc))
            plan.append((name, texts))
        todo = sorted({t for _, texts in plan for t in texts if _digest(t) not in known})
        if todo:
            fresh = self.embedder.embed(todo)
            if fresh.shape != (len(todo), self.dim):
                raise ValueError(
                    f"embedder returned {fresh.shape}, expected {(len(todo), self.dim)}"
                )
            for text, row in zip(todo, fresh, strict=True):
                known[_digest(text)] = row
        for name, _ in plan:
            self._forget(name)
        slots = self._alloc(sum(len(texts) for _, texts in plan))
        rows = np.empty((len(slots), self.dim), dtype=np.float32)
        cursor = 0
        for name, texts in plan:
            doc = latest[name]
            mine = slots[cursor : cursor + len(texts)]
            for slot, text, i in zip(mine, texts, range(cursor, cursor + len(texts)), strict=True):
                digest = _digest(text)
                rows[i] = known[digest]
                self._vectors[slot] = known[digest]
                self._digests[slot] = digest
                self._slot_owner[slot] = name
            cursor += len(texts)
            tf = Counter(terms(" ".join([doc.name, doc.summary, *doc.examples])))
            self._entries[name] = _Entry(doc=doc, slots=mine, tf=tf, length=sum(tf.values()))
            self._df.update(tf.keys())
            self._total_len += sum(tf.values())
        self._hnsw.add_items(rows, np.asarray(slots, dtype=np.int64))

    def remove(self, names: Iterable[str]) -> None:
        for name in names:
            self._forget(name)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return list(self._entries)

    def doc(self, name: str) -> ToolDoc:
        return self._entries[name].doc

    # -- searching --------------------------------------------------------

    def _lexical(self, query_terms: list[str], names: Iterable[str]) -> dict[str, float]:
        """BM25 over each candidate's prose, divided by the best score the query could reach."""
        n = len(self._entries)
        if not query_terms or not n:
            return {}
        avg = self._total_len / n if n else 1.0
        qtf = Counter(query_terms)
        idf = {
            t: math.log(1 + (n - self._df.get(t, 0) + 0.5) / (self._df.get(t, 0) + 0.5))
            for t in qtf
        }
        ceiling = sum(idf[t] * (BM25_K1 + 1) for t in qtf) or 1.0
        out: dict[str, float] = {}
        for name in names:
            entry = self._entries[name]
            score = 0.0
            for term in qtf:
                f = entry.tf.get(term, 0)
                if f:
                    norm = BM25_K1 * (1 - BM25_B + BM25_B * entry.length / avg)
                    score += idf[term] * f * (BM25_K1 + 1) / (f + norm)
            out[name] = score / ceiling
        return out

    def search(self, query: str, k: int = 5) -> list[tuple[str, float]]:
        """The best ``k`` tools for a described action, best first, with their distance."""
        text = _check_query(query)
        return self.search_vector(self.embedder.embed([text])[0], k, text=text)

    def search_vector(
        self, vec: npt.NDArray[Any], k: int = 5, *, text: str | None = None
    ) -> list[tuple[str, float]]:
        """As ``search`` for a query embedded already; pass ``text`` to add the lexical assist."""
        if not isinstance(k, int) or isinstance(k, bool) or not (1 <= k <= MAX_K):
            raise ValueError(f"k must be an integer in 1..{MAX_K}")
        q = np.asarray(vec, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim or not np.all(np.isfinite(q)):
            raise ValueError(f"query vector must be {self.dim} finite floats")
        scored = self.score(q, text, k)
        return [(name, dist) for name, dist in scored if dist <= self.ceiling][:k]

    def score(self, q: Matrix, text: str | None, k: int) -> list[tuple[str, float]]:
        """Candidates with their fused distance, best first, before the ceiling is applied."""
        live = len(self._slot_owner) - len(self._free)
        if not live:
            return []
        want = min(live, max(MIN_CANDIDATES, CANDIDATES_PER_HIT * k))
        labels, _ = self._hnsw.knn_query(q, k=want)
        cands: set[str] = set()
        for slot in labels[0]:
            owner = self._slot_owner[int(slot)]
            if owner is not None:
                cands.add(owner)
        lex = self._lexical(terms(text), cands) if text else {}
        out: list[tuple[str, float]] = []
        for name in cands:
            slots = self._entries[name].slots
            dense = float(np.max(self._vectors[slots] @ q))
            sim = dense + LEXICAL_WEIGHT * lex.get(name, 0.0)
            out.append((name, max(0.0, 1.0 - sim)))
        out.sort(key=lambda pair: (pair[1], pair[0]))
        return out

    # -- persistence ------------------------------------------------------

    def save(self, directory: Path) -> None:
        """Write vectors.hnsw, vectors.npy, then vectors.json (with checksums) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        hnsw_path = directory / "vectors.hnsw"
        npy_path = directory / "vectors.npy"
        self._hnsw.save_index(str(hnsw_path))
        with open(npy_path, "wb") as fh:
            np.save(fh, self._vectors, allow_pickle=False)
        meta = {
            "format": FORMAT,
            "model_id": self.model_id,
            "dim": self.dim,
            "ceiling": self.ceiling,
            "slots": len(self._slot_owner),
            "capacity": self._hnsw.get_max_elements(),
            "digests": self._digests,
            "docs": [
                {
                    "name": e.doc.name,
                    "summary": e.doc.summary,
                    "examples": list(e.doc.examples),
                    "tooltip": e.doc.tooltip,
                    "source": e.doc.source,
                    "slots": e.slots,
                }
                for e in self._entries.values()
            ],
            "sha256": {p.name: _file_sha(p) for p in (hnsw_path, npy_path)},
        }
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".vectors.", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(meta, fh, ensure_ascii=False)
        os.replace(tmp, directory / "vectors.json")

    @classmethod
    def load(cls, directory: Path, embedder: Embedder) -> VectorIndex:
        """Reopen a saved index; IndexCorruptError if missing, altered or built for another model."""
        directory = Path(directory)
        try:
            meta = json.loads((directory / "vectors.json").read_text(encoding="utf-8"))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise IndexCorruptError(f"{directory}: unknown vector index format")
            if meta["model_id"] != embedder.model_id or int(meta["dim"]) != int(embedder.dim):
                raise IndexCorruptError(
                    f"{directory}: index built with {meta['model_id']}, "
                    f"embedder is {embedder.model_id}"
                )
            for fname, want in meta["sha256"].items():
                if fname not in _FILES or _file_sha(directory / fname) != want:
                    raise IndexCorruptError(f"{directory}/{fname}: checksum mismatch")
            with open(directory / "vectors.npy", "rb") as fh:
                vectors = np.load(fh, allow_pickle=False)
            slots = int(meta["slots"])
            if vectors.dtype != np.float32 or vectors.shape != (slots, int(meta["dim"])):
                raise IndexCorruptError(
                    f"{directory}/vectors.npy: shape {vectors.shape} does not fit"
                )
            self = cls(embedder, ceiling=float(meta["ceiling"]))
            hnsw = hnswlib.Index(space="cosine", dim=self.dim)
            hnsw.load_index(str(directory / "vectors.hnsw"), max_elements=int(meta["capacity"]))
            hnsw.set_ef(HNSW_EF)
            self._hnsw = hnsw
            self._vectors = np.ascontiguousarray(vectors)
            self._digests = [str(d) for d in meta["digests"]]
            self._slot_owner = [None] * slots
            if len(self._digests) != slots:
                raise IndexCorruptError(f"{directory}/vectors.json: digest count does not fit")
            for raw in meta["docs"]:
                doc = ToolDoc(
                    name=str(raw["name"]),
                    summary=str(raw["summary"]),
                    examples=tuple(str(x) for x in raw["examples"]),
                    tooltip=str(raw.get("tooltip", "")),
                    source=str(raw.get("source", "")),
                )
                mine = [int(s) for s in raw["slots"]]
                for slot in mine:
                    if not (0 <= slot < slots) or self._slot_owner[slot] is not None:
                        raise IndexCorruptError(f"{directory}/vectors.json: bad slot {slot}")
                    self._slot_owner[slot] = doc.name
                tf = Counter(terms(" ".join([doc.name, doc.summary, *doc.examples])))
                self._entries[doc.name] = _Entry(
                    doc=doc, slots=mine, tf=tf, length=sum(tf.values())
                )
                self._df.update(tf.keys())
                self._total_len += sum(tf.values())
            self._free = [i for i, owner in enumerate(self._slot_owner) if owner is None]
            if hnsw.get_current_count() != slots:
                raise IndexCorruptError(
                    f"{directory}/vectors.hnsw: holds {hnsw.get_current_count()} of {slots}"
                )
            return self
        except IndexCorruptError:
            raise
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, EOFError) as exc:
            raise IndexCorruptError(f"{directory}: vector index unreadable: {exc}") from None


def _check_query(query: object) -> str:
    if not isinstance(query, str):
        raise ValueError("query must be a string")
    text = query.strip()
    if not text:
        raise ValueError("query is empty")
    return text[:MAX_QUERY_CHARS]


def _file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

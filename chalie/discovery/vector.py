"""The vector rung: HNSW over each tool's prose, a lexical assist, and a distance ceiling.

Each tool is embedded as up to three texts: its *card* (name and summary), its
*examples* (the example phrases joined; a tool without examples gets its card
with the whole name instead, generic words kept) and its bare *name*. HNSW over cards and
examples proposes candidates; a candidate scores

    dense = (max(cos(q, card), cos(q, examples)) + NAME_WEIGHT * cos(q, name)) / (1 + NAME_WEIGHT)
    score = dense + LEXICAL_WEIGHT * bm25_coverage(q, prose)

and is kept only when its distance ``1 - score`` is at or under the ceiling
(and the entry's best hit under the ceiling less a calibrated margin, the
request gate of chalie/discovery/intent.py admits the entry, and the entry
has words at all: chalie/discovery/lexicon.py).
Below the best hit, the hits are ordered by the query moved toward the centroid of
its best tools' cards (pseudo-relevance feedback, ``VectorIndex._feedback``).
The BM25 coverage (0..1: the share of the query's attainable BM25 weight the
tool's prose reaches) lifts tools that share a query's rare words, which a
6-layer model underweights. Generic name words ("Tool", "API", "plugin") are
dropped from the card and the name: they say nothing about what a tool does,
and neither does a remote tool's ``_mcp_<server>_`` prefix. Only the opening of
long prose is embedded (see ``lead``), which keeps a 10k-tool build near 40 s;
the lexical side sees all of it. Measured on MetaTool dev through the real
cascade, each of the name vector, the generic-word stripping and the lexical
assist adds about a point of R@5.

Ceilings are model specific (e5 squeezes every distance into 0.06-0.22), so
the ceiling is calibrated per model id and stored with the index.

Learned phrases (chalie/discovery/learning.py: requests that led to a tool's
successful use) are each one more vector of their tool, counted only at
PHRASE_MIN_SIMILARITY or closer, and train the learned head of
chalie/discovery/head.py, whose view of a tool (projected query against the
centroid of its phrases, fused with the name the same way) is taken when it is
better. The head ranks; the best-hit cut reads the score without it.
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hnswlib
import numpy as np
import numpy.typing as npt

from chalie.discovery.embedder import E5_MODEL_ID, MINILM_MODEL_ID, Embedder, Matrix
from chalie.discovery.head import LinearHead
from chalie.discovery.intent import RequestGate, request_gate
from chalie.discovery.lexicon import WORD_CHECK, has_words
from chalie.discovery.names import bare_name
from chalie.discovery.types import IndexCorruptError, ToolDoc

log = logging.getLogger(__name__)

FORMAT = 6
# Calibrated through the real cascade (tools/bench/bench_discovery_quality.py).
# Every hit must be at or under the ceiling, and an entry is answered at all only
# when its best hit is at or under ``ceiling - best margin`` (a vague best hit
# yields nothing, a confident one lets its close runners-up through) and the
# request gate admits it (chalie/discovery/intent.py: does the entry read as a
# request for an action, or is some tool's prose close to it?). MiniLM: 0.84 /
# 0.06 (best hit at 0.78, as 0.90 / 0.12 before) plus the gate keeps MetaTool
# dev R@5 >= 80 and assistant-40 R@3 >= 95 while answering 80% of assistant-40's
# no-tool queries with nothing (35% without the gate, 10% with a single 0.82
# ceiling). Runners-up between 0.84 and 0.90 (a search tool beside a weather
# query) added no R@5 on either set. Another model falls back
# to DEFAULT_CEILING with no margin and no gate (keep the top k) until someone
# calibrates it.
# multilingual e5 (the optional backend): every cosine sits in about 0.75-0.95,
# so its ceiling is 0.22 (a junk filter: it cut no assistant-40 or MetaTool
# hit) and it has no best-hit margin.
CEILINGS: dict[str, float] = {MINILM_MODEL_ID: 0.84, E5_MODEL_ID: 0.22}
BEST_HIT_MARGINS: dict[str, float] = {MINILM_MODEL_ID: 0.06, E5_MODEL_ID: 0.0}
DEFAULT_CEILING = 1.0
NAME_WEIGHT = 0.3
LEXICAL_WEIGHT = 1.0
# The lexical assist is added to a cosine, so it is scaled to the model's
# spread of cosines: e5 squeezes them about five times tighter than MiniLM
# (assistant-40 R@3 73.8 at 1.0, 92.5 at 0.1).
LEXICAL_WEIGHTS: dict[str, float] = {E5_MODEL_ID: 0.1}
BM25_K1 = 0.6
BM25_B = 0.5
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 200
HNSW_EF = 100
# Slots HNSW proposes per requested hit (a tool has up to two HNSW vectors and
# the fusion reorders the dense list).
CANDIDATES_PER_HIT = 12
MIN_CANDIDATES = 64
# Lexical candidates: the tools holding the query's LEXICAL_TERMS rarest words,
# for words held by at most LEXICAL_MAX_DF tools (a common word adds nothing).
LEXICAL_TERMS = 3
LEXICAL_MAX_DF = 64
MAX_K = 100
MAX_QUERY_CHARS = 2000
# Learned phrases are each their own vector: a tool scores by its best-matching
# phrase (MetaTool dev, 5-fold, ~17 learned requests a tool: separate R@5 91.4,
# joined into the examples text 81.5). A tool's authored examples stay joined:
# separate, assistant-40 R@1 rose 68.8 -> 71.2 but its no-tool queries answered
# with nothing fell 80% -> 50% (single short phrases sit close to small talk,
# and the ceiling and the request gate are calibrated on the joined text).
SEPARATE_EXAMPLES = False
# Tools the learned head proposes beyond HNSW's and the lexical candidates.
# Learned phrases do not join the lexical assist: their incidental words ("tonight",
# "for me") matched other tools' requests (assistant-40, 5-fold: R@3 86.2 with, 91.2 without).
LEXICAL_LEARNED = False
# A learned phrase counts only at this cosine or closer (MetaTool dev 5-fold: R@5
# 92.8 at 0, 92.9 at 0.6, 92.8 at 0.7; it keeps loose resemblances from admitting small talk).
PHRASE_MIN_SIMILARITY = 0.6
# Learned tools pull queries meant for tools nobody used yet (MetaTool's queries
# share one machine-written style, so any learned phrase resembles them). Measured
# through the real cascade by learning the queries of half the tools and scoring
# the other half (bench_discovery_quality.py --folds 5), catalogue-only R@1 58.1
# / R@5 79.5 on those queries:
#   gate off (default):      unlearned half 37.6 / 62.8;  MetaTool 5-fold 71.2 / 90.7
#   gate 0.45, offset 0.05:  unlearned half 45.3 / 75.3;  MetaTool 5-fold 69.4 / 87.6
# (centring the phrase vectors, or a higher PHRASE_MIN_SIMILARITY, trade along the
# same line in a numpy study). Off by default: the discovery targets are the 5-fold
# figures. The lasting remedy is phrases for every tool (model-written examples
# for tools that arrive without any: chalie.discovery.written), not a weaker head.
HEAD_PHRASE_GATE: float | None = None
HEAD_OFFSET = 0.0
HEAD_CANDIDATES = 32
# Pseudo-relevance feedback (see VectorIndex._feedback): the query moved toward its best
# tools' cards orders the hits below the first. Measured through the real cascade
# (2026-12-01, MiniLM): MetaTool dev + the ten built-ins R@5 79.37 -> 80.06 (R@1
# unchanged, R@3 74.08 -> 74.18), assistant-40 R@3 96.2 -> 97.5 with its no-tool
# queries answered with nothing unchanged at 80% (admission is the original query's);
# the centroid of 5 tools, or a weight of 0.5, gained less.
FEEDBACK_TOOLS = 3
FEEDBACK_WEIGHT = 0.3
# Learned phrases kept per tool in the index (the store bounds them first).
MAX_PHRASES = 64

_FILES = ("vectors.hnsw", "vectors.npy", "names.npy", "vectors.json")
_GATE_FILE = "gate.npy"
_HEAD_FILE = "head.npy"

_WORD = re.compile(r"[a-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SENTENCE = re.compile(r"(?<=[.!?;])\s+")
# Words of prose embedded per vector, see ``lead``: a summary's opening (about
# 24 word pieces) and whole example phrases (about 32). A 10k-tool build embeds
# roughly 27 word pieces a remote tool; 16/24 cost nothing measurable in recall.
EMBED_WORDS = 16
EXAMPLE_WORDS = 24
_GENERIC = frozenset({"tool", "tools", "api", "plugin"})
_STOP = _GENERIC | frozenset(
    """a an and are as at be but by can could do does for from get give have how i
    if in into is it its me my need of on or our please should show so some tell
    that the their them then there these this to up us use want was we what when
    where which who why will with would you your""".split()
)


def cut_settings(model_id: str, ceiling: float | None = None) -> tuple[float, float]:
    """(ceiling, best-hit margin): an explicit ceiling is one plain cut for every hit."""
    margin = 0.0
    if ceiling is None:
        ceiling = CEILINGS.get(model_id)
        margin = BEST_HIT_MARGINS.get(model_id, 0.0)
        if ceiling is None:
            log.warning("no calibrated ceiling for %s; keeping every top-k hit", model_id)
            ceiling = DEFAULT_CEILING
    if isinstance(ceiling, bool) or not (0.0 <= float(ceiling) <= 2.0):
        raise ValueError(f"ceiling must be within [0, 2], got {ceiling}")
    return float(ceiling), margin


def split_name(name: str) -> str:
    """``get_weather`` → ``get weather``; ``ResearchHelper`` → ``Research Helper``."""
    spaced = _CAMEL.sub(" ", name)
    return re.sub(r"[\W_]+", " ", spaced).strip()


def name_text(name: str) -> str:
    """The split name without generic words: ``FinanceTool`` → ``Finance``."""
    words = split_name(name).split()
    kept = [w for w in words if w.lower() not in _GENERIC]
    return " ".join(kept or words)


def _stem(word: str) -> str:
    """A light suffix strip so that inflections meet: book/booking/booked, recipe/recipes."""
    if len(word) <= 3 or word.isdigit():
        return word
    if word.endswith("ing") and len(word) >= 6:
        word = word[:-3]
    elif word.endswith("ed") and not word.endswith("eed") and len(word) >= 5:
        word = word[:-2]
    elif word.endswith(("sses", "xes", "zes", "ches", "shes")):
        word = word[:-2]
    elif word.endswith("ies") and len(word) >= 5:
        word = word[:-3] + "y"
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    # a final e comes and goes with the suffix (share/shared/sharing)
    if word.endswith("e") and len(word) >= 4:
        word = word[:-1]
    return word


def terms(text: str) -> list[str]:
    """Lexical terms: lower-cased words, stop words dropped, lightly stemmed."""
    return [_stem(w) for w in _WORD.findall(split_name(text).lower()) if w not in _STOP]


def lead(text: str, words: int | None = None) -> str:
    """The opening sentences of ``text``, up to about ``words`` words.

    Embedding cost grows with every token, and later sentences of a tool
    description mostly list parameters; the lexical side still sees all of it.
    """
    words = EMBED_WORDS if words is None else words
    out: list[str] = []
    count = 0
    for sentence in _SENTENCE.split(text.strip()):
        n = len(sentence.split())
        if out and count + n > words:
            break
        out.append(sentence)
        count += n
    joined = " ".join(out)
    cut = joined.split()
    return " ".join(cut[:words]) if len(cut) > words else joined


def card_text(doc: ToolDoc) -> str:
    summary = lead(doc.summary)
    name = name_text(bare_name(doc))
    return f"{name}: {summary}" if summary else name


def full_card_text(doc: ToolDoc) -> str:
    """The card with the whole split name: a tool without examples gets it as its second vector."""
    summary = lead(doc.summary)
    name = split_name(bare_name(doc))
    return f"{name}: {summary}" if summary else name


def examples_text(doc: ToolDoc) -> str:
    """Whole example phrases, joined, up to about EXAMPLE_WORDS words."""
    out: list[str] = []
    count = 0
    for example in (e.strip() for e in doc.examples):
        n = len(example.split())
        if not example or (out and count + n > EXAMPLE_WORDS):
            continue
        out.append(example)
        count += n
    return "; ".join(out)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


@dataclass
class _Entry:
    doc: ToolDoc
    slots: list[int]  # HNSW labels: the card, its second text, then one per phrase
    name_digest: str
    name_row: int  # row of the name vector in VectorIndex._name_vecs
    tf: Counter[str]
    length: int
    catalogue_slots: int = 2  # slots before the phrases
    learned: tuple[str, ...] = ()  # learned phrases (authored ones are in doc.examples)


def _tf(doc: ToolDoc, learned: Sequence[str] = ()) -> Counter[str]:
    return Counter(terms(" ".join([doc.name, doc.summary, *doc.examples, *learned])))


def prose_texts(
    doc: ToolDoc, learned: Sequence[str] = (), *, separate: bool = SEPARATE_EXAMPLES
) -> tuple[list[str], int]:
    """The texts embedded for a tool, and how many of them are catalogue texts (not phrases).

    Catalogue texts: the card, then the joined examples (``separate=False``)
    or the card with the whole name. Phrases: each authored example (when
    ``separate``) and each learned phrase, once.
    """
    prose = [card_text(doc)]
    second = ("" if separate else examples_text(doc)) or full_card_text(doc)
    if second not in prose:
        prose.append(second)
    catalogue = len(prose)
    authored = [lead(e, EXAMPLE_WORDS) for e in doc.examples if e.strip()] if separate else []
    for phrase in (*authored, *(lead(p, EXAMPLE_WORDS) for p in learned)):
        if phrase and phrase not in prose:
            prose.append(phrase)
    return prose, catalogue


class VectorIndex:
    """HNSW (cosine) over tool prose; incremental upsert/remove; saved as four files.

    Not thread-safe on its own: the engine serialises writes against searches.
    """

    def __init__(self, embedder: Embedder, *, ceiling: float | None = None) -> None:
        self.embedder = embedder
        self.model_id = embedder.model_id
        self.dim = int(embedder.dim)
        self.gate: RequestGate | None = None
        # keyboard mash gets no vector hits (chalie/discovery/lexicon.py)
        self.word_check = self.model_id in WORD_CHECK
        self.lexical_weight = LEXICAL_WEIGHTS.get(self.model_id, LEXICAL_WEIGHT)
        self.calibrate(ceiling)
        self._entries: dict[str, _Entry] = {}
        self._slot_owner: list[str | None] = []
        self._free: list[int] = []
        self._vectors: Matrix = np.zeros((0, self.dim), dtype=np.float32)
        self._digests: list[str] = []
        self._postings: dict[str, set[str]] = {}
        self._name_vecs: Matrix = np.zeros((0, self.dim), dtype=np.float32)
        self._name_free: list[int] = []
        self._total_len = 0
        self._hnsw = self._new_hnsw(64)
        # learned phrases by tool, kept for a tool that is not (yet) indexed too
        self._learned: dict[str, tuple[str, ...]] = {}
        self.head = LinearHead(self.dim)

    def calibrate(self, ceiling: float | None = None) -> None:
        """Set the cuts: the model's calibrated ceiling, margin and gate, or one explicit ceiling.

        A gate already held (read back with the index) is kept when it is still current.
        """
        self.ceiling, self.best_margin = cut_settings(self.model_id, ceiling)
        if ceiling is not None:
            self.gate = None
        else:
            self.gate = request_gate(self.embedder, saved=self.gate)

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
            grown = np.zeros((start + extra, self.dim), dtype=np.float32)
            grown[:start] = self._vectors
            self._vectors = grown
            self._slot_owner.extend([None] * extra)
            self._digests.extend([""] * extra)
            slots.extend(range(start, start + extra))
        need = len(self._slot_owner)
        if need > self._hnsw.get_max_elements():
            self._hnsw.resize_index(max(need, 2 * self._hnsw.get_max_elements()))
        return slots

    def _forget(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        phrase_slots = entry.slots[entry.catalogue_slots :]
        if phrase_slots:
            self.head.update(name, self._vectors[phrase_slots], None)
        self._name_free.append(entry.name_row)
        for slot in entry.slots:
            self._hnsw.mark_deleted(slot)
            self._slot_owner[slot] = None
            self._free.append(slot)
        for term in entry.tf:
            holders = self._postings[term]
            holders.discard(name)
            if not holders:
                del self._postings[term]
        self._total_len -= entry.length

    def _admit(
        self,
        doc: ToolDoc,
        slots: list[int],
        name_digest: str,
        name_vec: Matrix,
        catalogue_slots: int,
        learned: tuple[str, ...],
        *,
        train_head: bool = True,
    ) -> None:
        if not self._name_free:
            start = len(self._name_vecs)
            grown = np.zeros((max(16, 2 * start), self.dim), dtype=np.float32)
            grown[:start] = self._name_vecs
            self._name_vecs = grown
            self._name_free = list(range(len(grown) - 1, start - 1, -1))
        row = self._name_free.pop()
        self._name_vecs[row] = name_vec
        tf = _tf(doc, learned if LEXICAL_LEARNED else ())
        length = sum(tf.values())
        self._entries[doc.name] = _Entry(
            doc, slots, name_digest, row, tf, length, catalogue_slots, learned
        )
        phrase_slots = slots[catalogue_slots:]
        if phrase_slots and train_head:
            self.head.update(doc.name, None, self._vectors[phrase_slots])
        for term in tf:
            self._postings.setdefault(term, set()).add(doc.name)
        self._total_len += length

    def _plan(
        self, docs: Sequence[ToolDoc]
    ) -> tuple[list[tuple[ToolDoc, list[str], str, int, tuple[str, ...]]], dict[str, Matrix]]:
        """What upserting ``docs`` embeds (each tool's texts) and the vectors already held."""
        latest: dict[str, ToolDoc] = {}
        for doc in docs:
            if not isinstance(doc, ToolDoc) or not isinstance(doc.name, str) or not doc.name:
                raise ValueError(f"not a named ToolDoc: {doc!r}")
            latest[doc.name] = doc
        known: dict[str, Matrix] = {}
        for name in latest:
            old = self._entries.get(name)
            if old is not None:
                known[old.name_digest] = self._name_vecs[old.name_row].copy()
                for slot in old.slots:
                    known[self._digests[slot]] = self._vectors[slot].copy()
        plan: list[tuple[ToolDoc, list[str], str, int, tuple[str, ...]]] = []
        for doc in latest.values():
            learned = self._learned.get(doc.name, ())
            prose, catalogue = prose_texts(doc, learned)
            plan.append((doc, prose, name_text(bare_name(doc)), catalogue, learned))
        return plan, known

    def missing_texts(self, docs: Sequence[ToolDoc]) -> list[str]:
        """The texts :meth:`upsert` would embed for ``docs`` (embed them anywhere, pass the
        vectors back as ``embedded``: the slow part of an update, away from the index)."""
        plan, known = self._plan(docs)
        wanted = {t for _, prose, nm, _, _ in plan for t in (*prose, nm)}
        return sorted(t for t in wanted if _digest(t) not in known)

    def upsert(
        self, docs: Sequence[ToolDoc], *, embedded: Mapping[str, Matrix] | None = None
    ) -> None:
        """Add or replace tools; text whose vector is already held is not embedded again,
        nor text ``embedded`` (text -> its vector, from :meth:`missing_texts`) brings."""
        plan, known = self._plan(docs)
        if not plan:
            return
        for text, row in (embedded or {}).items():
            if np.shape(row) != (self.dim,):
                raise ValueError(f"an embedded row has shape {np.shape(row)}, not ({self.dim},)")
            known.setdefault(_digest(text), row)
        wanted = {t for _, prose, nm, _, _ in plan for t in (*prose, nm)}
        todo = sorted(t for t in wanted if _digest(t) not in known)
        if todo:
            fresh = self.embedder.embed(todo)
            if fresh.shape != (len(todo), self.dim):
                raise ValueError(f"embedder gave {fresh.shape}, expected {(len(todo), self.dim)}")
            for text, row in zip(todo, fresh, strict=True):
                known[_digest(text)] = row
        for doc, *_ in plan:
            self._forget(doc.name)
        slots = self._alloc(sum(len(prose) for _, prose, *_ in plan))
        rows = np.empty((len(slots), self.dim), dtype=np.float32)
        cursor = 0
        for doc, prose, nm, catalogue, learned in plan:
            mine = slots[cursor : cursor + len(prose)]
            for offset, (slot, text) in enumerate(zip(mine, prose, strict=True)):
                digest = _digest(text)
                rows[cursor + offset] = known[digest]
                self._vectors[slot] = known[digest]
                self._digests[slot] = digest
                self._slot_owner[slot] = doc.name
            cursor += len(prose)
            name_digest = _digest(nm)
            name_vec = np.array(known[name_digest], dtype=np.float32)
            self._admit(doc, mine, name_digest, name_vec, catalogue, learned)
        self._hnsw.add_items(rows, np.asarray(slots, dtype=np.int64))

    def set_learned(self, name: str, phrases: Sequence[str]) -> bool:
        """Replace tool ``name``'s learned phrases; True when the index changed.

        Only new phrase texts are embedded; a tool not indexed yet gets them
        when it arrives. At most MAX_PHRASES are kept (the last ones given).
        """
        if not isinstance(name, str) or not name:
            raise ValueError("a learned phrase needs a tool name")
        kept: list[str] = []
        for phrase in phrases:
            if not isinstance(phrase, str):
                raise ValueError("learned phrases must be strings")
            text = " ".join(phrase.split())[:MAX_QUERY_CHARS]
            if text and text not in kept:
                kept.append(text)
        fresh = tuple(kept[-MAX_PHRASES:])
        if self._learned.get(name, ()) == fresh:
            return False
        if fresh:
            self._learned[name] = fresh
        else:
            self._learned.pop(name, None)
        entry = self._entries.get(name)
        if entry is not None:
            if LEXICAL_LEARNED:
                self.upsert([entry.doc])
            else:
                self._replace_phrases(entry, fresh)
        return True

    def _replace_phrases(self, entry: _Entry, learned: tuple[str, ...]) -> None:
        """Swap a tool's phrase slots in place: drop the gone, embed and add only the new."""
        prose, catalogue = prose_texts(entry.doc, learned)
        if catalogue != entry.catalogue_slots:
            self.upsert([entry.doc])
            return
        wanted = prose[catalogue:]
        old_slots = entry.slots[catalogue:]
        old_rows = self._vectors[old_slots].copy() if old_slots else None
        by_digest = {self._digests[slot]: slot for slot in old_slots}
        keep: dict[str, int] = {}
        todo: list[str] = []
        for text in wanted:
            digest = _digest(text)
            if digest in by_digest and digest not in keep:
                keep[digest] = by_digest[digest]
            elif digest not in keep:
                todo.append(text)
        for slot in old_slots:
            if slot not in keep.values():
                self._hnsw.mark_deleted(slot)
                self._slot_owner[slot] = None
                self._free.append(slot)
        fresh_slots: dict[str, int] = {}
        if todo:
            rows = self.embedder.embed(todo)
            if rows.shape != (len(todo), self.dim):
                raise ValueError(f"embedder gave {rows.shape}, expected {(len(todo), self.dim)}")
            slots = self._alloc(len(todo))
            for slot, text, row in zip(slots, todo, rows, strict=True):
                self._vectors[slot] = row
                self._digests[slot] = _digest(text)
                self._slot_owner[slot] = entry.doc.name
                fresh_slots[_digest(text)] = slot
            self._hnsw.add_items(
                np.asarray(rows, dtype=np.float32), np.asarray(slots, dtype=np.int64)
            )
        placed = {**keep, **fresh_slots}
        phrase_slots = [placed[_digest(t)] for t in wanted if _digest(t) in placed]
        phrase_slots = list(dict.fromkeys(phrase_slots))
        entry.slots = entry.slots[:catalogue] + phrase_slots
        entry.learned = learned
        self.head.update(
            entry.doc.name, old_rows, self._vectors[phrase_slots] if phrase_slots else None
        )

    def learned(self) -> dict[str, tuple[str, ...]]:
        """Every tool's learned phrases (including tools not indexed now)."""
        return dict(self._learned)

    def preset_learned(self, learned: Mapping[str, Sequence[str]]) -> None:
        """Learned phrases for tools about to be upserted (a build embeds them in its batches)."""
        for name, phrases in learned.items():
            kept = tuple(dict.fromkeys(" ".join(p.split()) for p in phrases if p.strip()))
            if kept:
                self._learned[name] = kept[-MAX_PHRASES:]

    def remove(self, names: Iterable[str]) -> None:
        """Drop tools by name; unknown names are ignored."""
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
        """BM25 of each named tool's prose over the best BM25 the query could reach (0..1)."""
        n = len(self._entries)
        if not query_terms or not n:
            return {}
        avg = self._total_len / n or 1.0
        qtf = Counter(query_terms)
        idf = {}
        for t in qtf:
            df = len(self._postings.get(t, ()))
            idf[t] = math.log(1 + (n - df + 0.5) / (df + 0.5))
        attainable = sum(idf[t] * (BM25_K1 + 1) for t in qtf) or 1.0
        wanted = qtf.keys()
        out: dict[str, float] = {}
        for name in names:
            entry = self._entries[name]
            common = wanted & entry.tf.keys()
            if not common:
                continue
            norm = BM25_K1 * (1 - BM25_B + BM25_B * entry.length / avg)
            score = 0.0
            for term in common:
                f = entry.tf[term]
                score += idf[term] * f * (BM25_K1 + 1) / (f + norm)
            out[name] = score / attainable
        return out

    def _lexical_candidates(self, query_terms: list[str], have: set[str]) -> list[str]:
        """Tools holding the query's rarest words, which dense retrieval may rank too low."""
        ranked = sorted(
            (len(self._postings[t]), t) for t in set(query_terms) if t in self._postings
        )
        out: list[str] = []
        for df, term in ranked[:LEXICAL_TERMS]:
            if df > LEXICAL_MAX_DF:
                break
            for name in sorted(self._postings[term]):
                if name not in have:
                    have.add(name)
                    out.append(name)
        return out

    def search(self, query: str, k: int = 5) -> list[tuple[str, float]]:
        """The best ``k`` tools for a described action, best first, with their distance."""
        text = _check_query(query)
        return self.search_vector(self.embedder.embed([text])[0], k, text=text)

    def search_vector(
        self, vec: npt.NDArray[Any], k: int = 5, *, text: str | None = None
    ) -> list[tuple[str, float]]:
        """As ``search`` for a query embedded already; pass ``text`` for the lexical assist."""
        if isinstance(k, bool) or not isinstance(k, int) or not (1 <= k <= MAX_K):
            raise ValueError(f"k must be an integer in 1..{MAX_K}")
        q = np.asarray(vec, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim or not np.all(np.isfinite(q)):
            raise ValueError(f"query vector must be {self.dim} finite floats")
        if text is not None:
            text = _check_query(text)
            if not has_words(text, self._postings, _stem, english=self.word_check):
                return []
        scored, best_similarity, best_plain = self._ranked(q, text, k)
        # the confidence cut reads the plain score: the head ranks, it does not admit
        if not scored or best_plain > self.ceiling - self.best_margin:
            return []
        if self.gate is not None and not self.gate.admits(q, best_similarity):
            return []
        hits = [(n, d) for n, d in scored if d <= self.ceiling]
        return self._feedback(q, text, hits, k)[:k]

    def _feedback(
        self, q: Matrix, text: str | None, hits: list[tuple[str, float]], k: int
    ) -> list[tuple[str, float]]:
        """The hits after one round of pseudo-relevance feedback (Rocchio).

        The query moves toward the centroid of its FEEDBACK_TOOLS best tools' cards
        (FEEDBACK_WEIGHT of it) and the hits below the first are ordered by that
        query: a short request embedded by a small model is noisy, and the best
        tools' cards say what it asks in the catalogue's own words. The best hit stays
        first (feedback's known cost is precision at one); whether the entry is
        answered at all stays the original query's decision (the confidence cut and
        the request gate ran on it), a runner-up the moved query finds within the
        ceiling joins the hits, and every hit carries the original query's distance
        (what the small-catalogue runner-up margin of the cascade compares).
        """
        if FEEDBACK_WEIGHT <= 0 or len(hits) < 2:
            return hits
        top = [self._entries[n].slots[0] for n, _ in hits[:FEEDBACK_TOOLS]]
        moved = q + FEEDBACK_WEIGHT * self._vectors[top].mean(axis=0)
        moved = moved / (np.linalg.norm(moved) or 1.0)
        again = [n for n, d in self._ranked(moved, text, k)[0] if d <= self.ceiling]
        rank = {n: i for i, n in enumerate(again)}
        have = {n for n, _ in hits}
        new = [n for n in again[: max(k, len(hits))] if n not in have]
        if new:  # tools the moved query brings, with the original query's distance
            original = dict(self._ranked(q, text, k, only=new)[0])
            hits = hits + [(n, original[n]) for n in new if n in original]
        head, rest = hits[0], hits[1:]
        rest.sort(key=lambda hit: rank.get(hit[0], len(rank)))
        return [head, *rest]

    def score(self, q: Matrix, text: str | None, k: int) -> list[tuple[str, float]]:
        """Candidates with their fused distance, best first, before the ceiling and the gate."""
        return self._ranked(q, text, k)[0]

    def _ranked(
        self, q: Matrix, text: str | None, k: int, only: Sequence[str] | None = None
    ) -> tuple[list[tuple[str, float]], float, float]:
        """As ``score``, plus the best plain cosine of a candidate's prose (for the gate) and
        the best fused distance without the learned head (for the confidence cut).

        ``only``: score just these tools (no candidates proposed)."""
        live = len(self._slot_owner) - len(self._free)
        if not live:
            return [], 0.0, 1.0
        query_terms = terms(text) if text else []
        if only is not None:
            cands = [n for n in dict.fromkeys(only) if n in self._entries]
            if not cands:
                return [], 0.0, 1.0
        else:
            want = min(live, max(MIN_CANDIDATES, CANDIDATES_PER_HIT * k))
            self._hnsw.set_ef(max(HNSW_EF, want))
            try:
                labels, _ = self._hnsw.knn_query(q, k=want)
            except RuntimeError as exc:
                raise IndexCorruptError(f"vector index search failed: {exc}") from exc
            cands = list(
                dict.fromkeys(
                    o for o in (self._slot_owner[int(s)] for s in labels[0]) if o is not None
                )
            )
            cands.extend(self._lexical_candidates(query_terms, set(cands)))
        head: dict[str, float] = {}
        if self.head.active:
            head_names, head_sims = self.head.scores(q)
            if head_names and only is None:
                top = np.argsort(-head_sims, kind="stable")[:HEAD_CANDIDATES]
                have = set(cands)
                for i in top:
                    name = head_names[int(i)]
                    if name in self._entries and name not in have:
                        cands.append(name)
                        have.add(name)
            if head_names:
                head = dict(zip(head_names, (float(x) for x in head_sims), strict=True))
        lex = self._lexical(query_terms, cands) if query_terms else {}
        entries = [self._entries[n] for n in cands]
        widths = [len(e.slots) for e in entries]
        sims = self._vectors[[s for e in entries for s in e.slots]] @ q
        phrase_best: npt.NDArray[np.float32] | None = None
        if any(len(e.slots) > e.catalogue_slots for e in entries):
            # a learned phrase speaks only when it is close: a loose resemblance to
            # one past request is weaker evidence than the tool's own description
            phrase = np.concatenate([np.arange(len(e.slots)) >= e.catalogue_slots for e in entries])
            phrase_best = np.maximum.reduceat(
                np.where(phrase, sims, -1.0), np.cumsum([0, *widths[:-1]])
            )
            sims = np.where(phrase & (sims < PHRASE_MIN_SIMILARITY), -1.0, sims)
        prose = np.maximum.reduceat(sims, np.cumsum([0, *widths[:-1]]))
        named = NAME_WEIGHT * (self._name_vecs[[e.name_row for e in entries]] @ q)
        dense = (prose + named) / (1 + NAME_WEIGHT)
        best_plain = 1.0
        if len(dense):
            lexical = np.array([lex.get(n, 0.0) for n in cands], dtype=np.float32)
            best_plain = max(0.0, float(np.min(1.0 - dense - self.lexical_weight * lexical)))
        if head:
            # the learned head's view of a tool that holds phrases, fused the same way
            projected = np.array([head.get(n, -1.0) for n in cands], dtype=np.float32)
            projected -= HEAD_OFFSET
            if HEAD_PHRASE_GATE is not None and phrase_best is not None:
                projected = np.where(phrase_best >= HEAD_PHRASE_GATE, projected, -1.0)
            dense = np.maximum(dense, (projected + named) / (1 + NAME_WEIGHT))
        out = [
            (name, max(0.0, 1.0 - float(d) - self.lexical_weight * lex.get(name, 0.0)))
            for name, d in zip(cands, dense, strict=True)
        ]
        out.sort(key=lambda pair: (pair[1], pair[0]))
        return out, float(prose.max()), best_plain

    # -- persistence ------------------------------------------------------

    def save(self, directory: Path) -> None:
        """Write the HNSW graph, the vectors, then vectors.json (with checksums) into it."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._hnsw.save_index(str(directory / "vectors.hnsw"))
        entries = list(self._entries.values())
        names_matrix = (
            self._name_vecs[[e.name_row for e in entries]]
            if entries
            else np.zeros((0, self.dim), dtype=np.float32)
        )
        for fname, matrix in (("vectors.npy", self._vectors), ("names.npy", names_matrix)):
            with open(directory / fname, "wb") as fh:
                np.save(fh, np.ascontiguousarray(matrix, dtype=np.float32), allow_pickle=False)
        checked = list(_FILES[:3])
        if self.gate is not None:
            probe = np.append(self.gate.weights, self.gate.bias).astype(np.float64)
            with open(directory / _GATE_FILE, "wb") as fh:
                np.save(fh, probe, allow_pickle=False)
            checked.append(_GATE_FILE)
        else:
            (directory / _GATE_FILE).unlink(missing_ok=True)
        if self.head.active:
            with open(directory / _HEAD_FILE, "wb") as fh:
                np.save(fh, self.head.state(), allow_pickle=False)
            checked.append(_HEAD_FILE)
        else:
            (directory / _HEAD_FILE).unlink(missing_ok=True)
        meta = {
            "format": FORMAT,
            "model_id": self.model_id,
            "dim": self.dim,
            "ceiling": self.ceiling,
            "best_margin": self.best_margin,
            "gate": None if self.gate is None else {"digest": self.gate.digest},
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
                    "name_digest": e.name_digest,
                    "catalogue_slots": e.catalogue_slots,
                }
                for e in entries
            ],
            "learned": {name: list(p) for name, p in sorted(self._learned.items())},
            "head": self.head.active,
            "sha256": {f: _file_sha(directory / f) for f in checked},
        }
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".vectors.", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(meta, fh, ensure_ascii=False)
        os.replace(tmp, directory / "vectors.json")

    @classmethod
    def load(cls, directory: Path, embedder: Embedder) -> VectorIndex:
        """Reopen a saved index; IndexCorruptError if missing, altered or for another model."""
        directory = Path(directory)
        try:
            return cls._load(directory, embedder)
        except IndexCorruptError:
            raise
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, EOFError) as exc:
            raise IndexCorruptError(f"{directory}: vector index unreadable: {exc}") from None

    @classmethod
    def _load(cls, directory: Path, embedder: Embedder) -> VectorIndex:
        meta = json.loads((directory / "vectors.json").read_text(encoding="utf-8"))
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise IndexCorruptError(f"{directory}: not a vector index of format {FORMAT}")
        if meta["model_id"] != embedder.model_id or int(meta["dim"]) != int(embedder.dim):
            raise IndexCorruptError(
                f"{directory}: built with {meta['model_id']}, the embedder is {embedder.model_id}"
            )
        sums = meta["sha256"]
        saved_gate = meta["gate"]
        checked = list(_FILES[:3]) + ([] if saved_gate is None else [_GATE_FILE])
        if meta["head"] is True:
            checked.append(_HEAD_FILE)
        if not isinstance(sums, dict) or sorted(sums) != sorted(checked):
            raise IndexCorruptError(f"{directory}: checksums missing")
        for fname, want in sums.items():
            if _file_sha(directory / fname) != want:
                raise IndexCorruptError(f"{directory}/{fname}: checksum mismatch")
        slots, dim = int(meta["slots"]), int(meta["dim"])
        vectors = _load_matrix(directory / "vectors.npy", slots, dim)
        raw_docs = meta["docs"]
        if not isinstance(raw_docs, list):
            raise IndexCorruptError(f"{directory}/vectors.json: docs is not a list")
        name_vecs = _load_matrix(directory / "names.npy", len(raw_docs), dim)
        digests = meta["digests"]
        if not isinstance(digests, list) or len(digests) != slots:
            raise IndexCorruptError(f"{directory}/vectors.json: digest count does not fit")
        self = cls(embedder, ceiling=float(meta["ceiling"]))
        margin = float(meta["best_margin"])
        if not (0.0 <= margin <= self.ceiling):
            raise IndexCorruptError(f"{directory}/vectors.json: best_margin {margin} out of range")
        self.best_margin = margin
        self.gate = None if saved_gate is None else _load_gate(directory, saved_gate, embedder)
        hnsw = hnswlib.Index(space="cosine", dim=self.dim)
        hnsw.load_index(str(directory / "vectors.hnsw"), max_elements=int(meta["capacity"]))
        hnsw.set_ef(HNSW_EF)
        if hnsw.get_current_count() != slots:
            raise IndexCorruptError(
                f"{directory}/vectors.hnsw: holds {hnsw.get_current_count()} of {slots}"
            )
        self._hnsw = hnsw
        self._vectors = vectors
        self._digests = [str(d) for d in digests]
        self._slot_owner = [None] * slots
        learned = meta["learned"]
        if not isinstance(learned, dict):
            raise IndexCorruptError(f"{directory}/vectors.json: learned is not an object")
        self._learned = {
            str(name): tuple(str(p) for p in phrases) for name, phrases in learned.items()
        }
        for i, raw in enumerate(raw_docs):
            doc = ToolDoc(
                name=str(raw["name"]),
                summary=str(raw["summary"]),
                examples=tuple(str(x) for x in raw["examples"]),
                tooltip=str(raw.get("tooltip", "")),
                source=str(raw.get("source", "")),
            )
            mine = [int(s) for s in raw["slots"]]
            if not mine or doc.name in self._entries:
                raise IndexCorruptError(f"{directory}/vectors.json: bad entry for {doc.name!r}")
            for slot in mine:
                if not (0 <= slot < slots) or self._slot_owner[slot] is not None:
                    raise IndexCorruptError(f"{directory}/vectors.json: bad slot {slot}")
                self._slot_owner[slot] = doc.name
            catalogue = int(raw["catalogue_slots"])
            if not 1 <= catalogue <= len(mine):
                raise IndexCorruptError(f"{directory}/vectors.json: bad entry for {doc.name!r}")
            learned_here = self._learned.get(doc.name, ())
            self._admit(
                doc,
                mine,
                str(raw["name_digest"]),
                name_vecs[i],
                catalogue,
                learned_here,
                train_head=meta["head"] is not True,
            )
        self._free = [i for i, owner in enumerate(self._slot_owner) if owner is None]
        if meta["head"] is True:
            with open(directory / _HEAD_FILE, "rb") as fh:
                state = np.load(fh, allow_pickle=False)
            if state.dtype != np.float64:
                raise IndexCorruptError(f"{directory}/{_HEAD_FILE}: not float64")
            phrase_rows = {
                e.doc.name: self._vectors[e.slots[e.catalogue_slots :]]
                for e in self._entries.values()
                if len(e.slots) > e.catalogue_slots
            }
            self.head.restore(state, phrase_rows)
        return self


def _load_matrix(path: Path, rows: int, dim: int) -> Matrix:
    with open(path, "rb") as fh:
        matrix = np.load(fh, allow_pickle=False)
    if matrix.dtype != np.float32 or matrix.shape != (rows, dim):
        raise IndexCorruptError(f"{path}: shape {matrix.shape} does not fit ({rows}, {dim})")
    if not np.all(np.isfinite(matrix)):
        raise IndexCorruptError(f"{path}: holds non-finite values")
    return np.ascontiguousarray(matrix)


def _load_gate(directory: Path, meta: object, embedder: Embedder) -> RequestGate | None:
    """The saved request gate, or a freshly trained one if its phrase lists changed since."""
    if not isinstance(meta, dict) or not isinstance(meta.get("digest"), str):
        raise IndexCorruptError(f"{directory}/vectors.json: gate is not an object with a digest")
    with open(directory / _GATE_FILE, "rb") as fh:
        probe = np.load(fh, allow_pickle=False)
    if probe.dtype != np.float64 or probe.shape != (int(embedder.dim) + 1,):
        raise IndexCorruptError(f"{directory}/{_GATE_FILE}: shape {probe.shape} does not fit")
    saved = RequestGate(probe[:-1], float(probe[-1]), 0.0, 0.0, meta["digest"])
    return request_gate(embedder, saved=saved)


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

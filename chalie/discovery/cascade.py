"""The discovery cascade: each query entry climbs exact → name keyword → vector on its own.

The first rung that yields wins for that entry. The union over entries is
deduplicated in rank order (entry by entry) and never truncated across the
array: the point of the array is to fetch every tool a turn needs in one call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from chalie.discovery.names import NameIndex, segments
from chalie.discovery.types import ToolDoc

MAX_ENTRIES: Final = 20
MAX_ENTRY_CHARS: Final = 200
DEFAULT_K: Final = 5
MAX_K: Final = 50

Rung = Literal["exact", "keyword", "mention", "vector", "ambiguous", "none"]
# A catalogue this small cuts vector runners-up that are not nearly as close as the best.
SMALL_CATALOGUE: Final = 16
RUNNER_UP_MARGIN: Final = 0.15
MAX_KINDS: Final = 12
# Said plainly (the real-models issue): a small model told only "nothing matched" searched
# again or invented a tool named after its search.
NOT_FOUND_NOTE: Final = (
    "No tool exists for the entries in not_found. Do not search for them again: "
    "answer the user from what you know, or say that you cannot do it."
)
# What an entry that found nothing tells the model (small models otherwise invent a tool
# named after their search, or search again until a guard stops them).
NOT_FOUND_HINT: Final = (
    "describe the action in a few words (what you want done), not a tool name; "
    "if no tool fits, answer the user without one"
)


class QueryError(ValueError):
    """The query array itself is malformed: the caller's mistake, not the index's."""


class VectorSearch(Protocol):
    """What the cascade needs from the vector index (chalie.discovery.vector.VectorIndex)."""

    def search(self, query: str, k: int = 5) -> list[tuple[str, float]]: ...


class BatchedVectorSearch(VectorSearch, Protocol):
    """A vector index that also takes queries embedded already, in one batch for the array."""

    embedder: Any

    def search_vector(
        self, vec: Any, k: int = 5, *, text: str | None = None
    ) -> list[tuple[str, float]]: ...


@dataclass(frozen=True)
class EntryOutcome:
    """How one entry was answered: the rung that yielded and the names it gave, best first."""

    query: str
    rung: Rung
    names: tuple[str, ...] = ()
    candidates: tuple[str, ...] = ()
    distances: tuple[float, ...] = ()


@dataclass(frozen=True)
class FindResult:
    """The answer to one find: injected tools in rank order, and the entries that found nothing."""

    injected: list[ToolDoc] = field(default_factory=list)
    not_found: list[dict[str, Any]] = field(default_factory=list)
    entries: list[EntryOutcome] = field(default_factory=list)
    # What kinds of tools exist (tooltips), told to the model when an entry found nothing.
    kinds: list[str] = field(default_factory=list)
    # name -> definition digest of each injected tool, for learning from its use
    definitions: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        """The find_tools body: ``{"injected": [{name, summary}], "not_found": [...]}``."""
        body: dict[str, Any] = {
            "injected": [{"name": d.name, "summary": d.summary} for d in self.injected],
            "not_found": list(self.not_found),
        }
        if self.not_found:
            body["kinds"] = list(self.kinds)
            body["note"] = NOT_FOUND_NOTE
        return body

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.injected]


def check_queries(queries: object) -> list[str]:
    """The validated entries, stripped; QueryError naming the first problem otherwise."""
    if isinstance(queries, str | bytes) or not isinstance(queries, Sequence):
        raise QueryError(
            "query must be an array of strings, one tool name or described action each"
        )
    if not 1 <= len(queries) <= MAX_ENTRIES:
        raise QueryError(f"query must have 1 to {MAX_ENTRIES} entries, got {len(queries)}")
    out: list[str] = []
    for i, entry in enumerate(queries):
        if not isinstance(entry, str):
            raise QueryError(f"query[{i}] is {type(entry).__name__}, not a string")
        if len(entry) > MAX_ENTRY_CHARS:
            raise QueryError(f"query[{i}] is longer than {MAX_ENTRY_CHARS} characters")
        # control characters carry no meaning for search and must not reach the logs raw
        text = " ".join("".join(c if c.isprintable() else " " for c in entry).split())
        if not text:
            raise QueryError(f"query[{i}] is empty")
        out.append(text)
    return out


# A framework seed (find_tools on the person's whole message) offers a tool at step one
# only when it clearly fits: an exact or keyword hit, or a vector hit this close, and a
# runner-up only as close as the best. Set on the real-model benchmark's prompts: tool
# requests came at 0.0-0.5, chit-chat ("thanks, that's all", "how do you say...") at 0.6+.
SEED_CEILING: Final = 0.55
SEED_MARGIN: Final = 0.1
SEED_MAX: Final = 2
# A vector hit this close is a sure fit: a tool the message names in words is then left out
# ("What's Bob's email address?": contacts at 0.10, and email named). Past it the named tool
# comes first ("Send an email to maria@...": contacts at 0.50, email at 0.63 and named).
SEED_SURE: Final = 0.35


def confident(result: FindResult) -> list[str]:
    """The tools of ``result`` that a framework seed offers (best first, at most SEED_MAX).
    The tools the message names in words come first unless something else surely fits (an
    exact or keyword hit, or a vector hit within SEED_SURE): "What's Bob's email address?"
    names email, and the 1.5B model took it over the contacts that fit."""
    out: list[str] = []
    named: list[str] = []
    sure = False
    for entry in result.entries:
        if entry.rung == "mention":
            named.extend(n for n in entry.names[:SEED_MAX] if n not in named)
            continue
        if entry.rung in ("exact", "keyword"):
            picked = list(entry.names[:SEED_MAX])
            sure = sure or bool(picked)
        elif entry.rung == "vector" and entry.distances:
            best = entry.distances[0]
            sure = sure or best <= SEED_SURE
            picked = [
                n
                for n, d in zip(entry.names, entry.distances, strict=False)
                if d <= SEED_CEILING and d <= best + SEED_MARGIN
            ][:SEED_MAX]
        else:
            picked = []
        out.extend(n for n in picked if n not in out)
    if sure:
        return out
    return (named + [n for n in out if n not in named])[:SEED_MAX]


_WORDS: Final = re.compile(r"[a-z0-9]+")


def mentioned(text: str, known: Mapping[str, ToolDoc]) -> tuple[str, ...]:
    """The tools a sentence names in words: every segment of the name is a word of ``text``
    (a plural's s dropped), as "send an email" names email and "search the web" web_search.
    Longest names first; a name whose words are inside a longer one's is left out (search,
    beside web_search). A framework seed's rung: the person's message, not a model's query."""
    words = {_singular(w) for w in _WORDS.findall(text.lower())}
    found = [
        (segs, name)
        for name in known
        if (segs := frozenset(map(_singular, segments(name))))
        and segs <= words
        and not name.startswith("_")
    ]
    found.sort(key=lambda t: (-len(t[0]), t[1]))
    kept: list[tuple[frozenset[str], str]] = []
    for segs, name in found:
        if not any(segs < other for other, _ in kept):
            kept.append((segs, name))
    return tuple(name for _, name in kept)


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def check_k(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise QueryError(f"k must be an integer from 1 to {MAX_K}")
    return k


def name_rungs(
    entry: str, names: NameIndex, known: Mapping[str, ToolDoc], k: int
) -> EntryOutcome | None:
    """The exact and keyword rungs for one entry; None when neither yields."""
    exact = names.exact(entry)
    if exact.ambiguous:
        return EntryOutcome(entry, "ambiguous", candidates=exact.candidates)
    pinned = tuple(n for n in exact.names if n in known)
    if pinned:
        return EntryOutcome(entry, "exact", pinned)
    keyword = tuple(n for n in names.keyword(entry, k) if n in known)
    if keyword:
        return EntryOutcome(entry, "keyword", keyword)
    return None


def vector_rung(
    entry: str, hits: list[tuple[str, float]], known: Mapping[str, ToolDoc], k: int
) -> EntryOutcome:
    hits = [(n, d) for n, d in hits if n in known][:k]
    if hits and len(known) <= SMALL_CATALOGUE:
        # With a handful of tools every one is a near neighbour of something: a runner-up
        # is kept only when it is nearly as close as the best hit ("what time is it"
        # must not bring the calculator along because it is one of two).
        best = hits[0][1]
        hits = [(n, d) for n, d in hits if d <= best + RUNNER_UP_MARGIN]
    if hits:
        return EntryOutcome(
            entry, "vector", tuple(n for n, _ in hits), distances=tuple(float(d) for _, d in hits)
        )
    return EntryOutcome(entry, "none")


def run_cascade(
    queries: Sequence[str],
    names: NameIndex,
    vectors: VectorSearch,
    known: Mapping[str, ToolDoc],
    *,
    k: int = DEFAULT_K,
    mentions: bool = False,
) -> FindResult:
    """Every entry through the cascade, then the deduplicated, untruncated union; with
    ``mentions`` (a framework seed) the tools an entry names in words come first."""
    entries = check_queries(queries)
    k = check_k(k)
    named = [
        EntryOutcome(entry, "mention", named_here)
        for entry in (entries if mentions else ())
        if (named_here := mentioned(entry, known)[:k])
    ]
    found = [name_rungs(entry, names, known, k) for entry in entries]
    pending = [i for i, outcome in enumerate(found) if outcome is None]
    if len(pending) > 1 and hasattr(vectors, "search_vector") and hasattr(vectors, "embedder"):
        # one embedding batch for every entry that reaches the vector rung
        batched: BatchedVectorSearch = vectors  # type: ignore[assignment]
        rows = batched.embedder.embed([entries[i] for i in pending])
        for i, row in zip(pending, rows, strict=True):
            hits = batched.search_vector(row, k, text=entries[i])
            found[i] = vector_rung(entries[i], hits, known, k)
    else:
        for i in pending:
            found[i] = vector_rung(entries[i], vectors.search(entries[i], k), known, k)
    outcomes = named + [outcome for outcome in found if outcome is not None]
    injected: list[ToolDoc] = []
    seen: set[str] = set()
    not_found: list[dict[str, Any]] = []
    for outcome in outcomes:
        if outcome.rung == "ambiguous":
            not_found.append(
                {
                    "query": outcome.query,
                    "reason": "ambiguous",
                    "candidates": list(outcome.candidates),
                    "hint": "several sources own this name; ask again with one of the full names",
                }
            )
            continue
        if outcome.rung == "none":
            not_found.append({"query": outcome.query, "reason": "no-match", "hint": NOT_FOUND_HINT})
            continue
        for name in outcome.names:
            if name not in seen:
                seen.add(name)
                injected.append(known[name])
    kinds = kinds_of(known) if not_found else []
    return FindResult(injected=injected, not_found=not_found, entries=outcomes, kinds=kinds)


def kinds_of(known: Mapping[str, ToolDoc]) -> list[str]:
    """What kinds of tools the catalogue holds: a few tooltips, and how many more."""
    tips = sorted({d.tooltip or d.name for d in known.values()})
    shown = tips[:MAX_KINDS]
    if len(tips) > MAX_KINDS:
        shown.append(f"and {len(tips) - MAX_KINDS} more")
    return shown

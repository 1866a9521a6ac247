"""How a recall ranks: the semantic, keyword and rare-word lists fused, then lifted by what
the memories say about themselves. Pure functions over ids, scores and memories.

1. :func:`fuse`: weighted reciprocal-rank fusion of the three lists. The constant is small
   (:data:`RRF_K`) so the top of each list counts: a memory one side is sure of (its first
   or second) is not pushed out by the other side's middle; and the keyword side's first,
   when its score stands well above the second's, weighs more (:data:`CONFIDENT`).
2. :func:`lift`: over the fused head, a memory about a person the query names
   (``people``) weighs more (:data:`PERSON_LIFT`), and the memory said right after a
   strong hit in the same conversation (the answer to the question that matched, the
   second half of a thought) joins it, and so, less, do the ones around (:data:`SHARES`
   of the hit's score); a memory that ends on a question weighs less (:data:`ASKS`).
3. :func:`within_budget`: what a recall shows: at least the first ``least``, then more
   while the scores stay near the last shown (the top is flat: the answer may be any of
   them) and the texts fit a token budget.

Tuned on the tuning splits of tools/bench/memory_eval.py (our synthetic set's seeds 1-3,
LoCoMo's conversations 26, 30, 41, 42, 43), never on the held-out ones; what each step
bought is in the module's history and the memory hand-over note.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from chalie.memory.records import Memory, Recalled

# Reciprocal-rank fusion: score = sum of weight / (RRF_K + rank). K=10 with the keyword
# list at 0.5 (the earlier setting) gave LoCoMo-tune any@5 0.611; K=5 with 0.75: 0.639,
# our set unchanged (0.975 -> 0.975 any@5).
RRF_K: Final = 5
KEYWORD_WEIGHT: Final = 0.75
# The memories holding a rare word of the query (a name, a code: chalie.memory.index.rare)
# are a third list, weighing as much as the meaning.
RARE_WEIGHT: Final = 1.0
# A confident keyword side wins: the keyword list's first weighs more by CONFIDENT times how
# far its BM25 score stands above the second's (s1 / s2 - 1). LoCoMo-tune any@5 0.698 ->
# 0.714, any@10 0.780 -> 0.787; our set unchanged. (The same for the semantic side's first,
# by its distance gap, lost on LoCoMo-tune and is not done.)
CONFIDENT: Final = 2.0
# A semantic neighbour further than this (cosine distance) is noise, not a candidate.
SEMANTIC_CEILING: Final = 0.85
# A memory about a person the query names: its score times 1 + PERSON_LIFT.
PERSON_LIFT: Final = 0.5
# The first HEAD_SPREAD of the fused list lend a share of their score to the memories stored
# around them in the same conversation (by id offset: the next one most, the one after it,
# then the ones before). LoCoMo-tune, next 0.5 and previous 0.25 alone: any@5 0.639 ->
# 0.688 (with the other settings of the time); the two beyond (+2: 0.3, -2: 0.1): 0.714 ->
# 0.731, any@10 0.787 -> 0.810, all@10 0.667 -> 0.692; our set unchanged.
HEAD_SPREAD: Final = 10
SHARES: Final = {1: 0.5, -1: 0.25, 2: 0.3, -2: 0.1}
# A memory that ends on a question (quotes aside) leaves its point open: it asks, the
# answer is in another memory (which the spread above has already lifted from it): its
# score times 1 - ASKS, after the spread. LoCoMo-tune (with the keyword side's function
# words dropped, chalie.memory.index.content_words): any@5 0.726 -> 0.747, any@10 0.826 ->
# 0.837, all@10 0.710 -> 0.721; our set unchanged (0.958 any@5). (0.3-0.5 alike; applied
# before the spread, so that a question lent less to its answer, 0.739 any@5.)
ASKS: Final = 0.4
# within_budget: a memory past the first ``least`` is shown while its score is at least
# FLAT times the score of the ``least``-th, and the texts fit the budget.
FLAT: Final = 0.8
# Rough tokens of a text: a word piece is ~4 characters of English.
CHARS_PER_TOKEN: Final = 4
_WORDS: Final = re.compile(r"\w+", re.UNICODE)


def fuse(
    semantic: Iterable[tuple[int, float]],
    keyword: Iterable[tuple[int, float]],
    rare: Iterable[int],
) -> dict[int, float]:
    """Fused scores: ``semantic`` (id, cosine distance) nearest first, ``keyword`` (id, BM25)
    best first, ``rare`` ids."""
    fused: dict[int, float] = {}
    for rank, (mid, dist) in enumerate(semantic):
        if dist <= SEMANTIC_CEILING:
            fused[mid] = fused.get(mid, 0.0) + 1.0 / (RRF_K + rank + 1)
    words = list(keyword)
    for rank, (mid, _score) in enumerate(words):
        weight = KEYWORD_WEIGHT
        if rank == 0 and len(words) > 1 and words[1][1] > 0:
            weight += CONFIDENT * max(0.0, words[0][1] / words[1][1] - 1.0)
        fused[mid] = fused.get(mid, 0.0) + weight / (RRF_K + rank + 1)
    for rank, mid in enumerate(rare):
        fused[mid] = fused.get(mid, 0.0) + RARE_WEIGHT / (RRF_K + rank + 1)
    return fused


# 1.0: first in the meaning's and the words' lists.
BEST: Final = (1.0 + KEYWORD_WEIGHT) / (RRF_K + 1)


def neighbours(ranked: Sequence[int]) -> list[int]:
    """The ids that :func:`lift` may look at beside the head (its first HEAD_SPREAD's)."""
    return [mid + offset for mid in ranked[:HEAD_SPREAD] for offset in SHARES]


def lift(
    fused: Mapping[int, float], ranked: Sequence[int], rows: Mapping[int, Memory], query: str
) -> dict[int, float]:
    """The head's scores after the person lift and the conversation spread (see the module
    docstring); ``ranked``: the fused ids best first; ``rows``: the head's memories and their
    neighbours (:func:`neighbours`, when stored)."""
    named = {w.casefold() for w in _WORDS.findall(query)}
    scores = dict(fused)
    for mid in ranked:
        memory = rows.get(mid)
        if memory is not None and any(p.casefold() in named for p in memory.people):
            scores[mid] *= 1.0 + PERSON_LIFT
    spread: dict[int, float] = {}
    for mid in ranked[:HEAD_SPREAD]:
        memory = rows.get(mid)
        if memory is None or memory.conversation_id is None:
            continue
        for offset, share in SHARES.items():
            other = mid + offset
            near = rows.get(other)
            if (
                near is not None
                and near.conversation_id == memory.conversation_id
                and near.principal == memory.principal
            ):
                spread[other] = max(spread.get(other, 0.0), share * scores[mid])
    for mid, extra in spread.items():
        scores[mid] = scores.get(mid, 0.0) + extra
    for mid in scores:
        memory = rows.get(mid)
        if memory is not None and asks(memory.text):
            scores[mid] *= 1.0 - ASKS
    return scores


def asks(text: str) -> bool:
    """Whether a memory's text ends on a question (closing quotes aside)."""
    return text.rstrip(" \t\n\"'\u201d\u2019").endswith("?")


def tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


def within_budget(hits: Sequence[Recalled], least: int, budget: int) -> list[Recalled]:
    """The first ``least`` hits, then more while the top stays flat and the texts fit
    ``budget`` tokens (the first ``least`` are always shown)."""
    out = list(hits[:least])
    if len(hits) <= least or not out:
        return out
    floor = FLAT * out[-1].score
    used = sum(tokens(h.memory.text) for h in out)
    for hit in hits[least:]:
        used += tokens(hit.memory.text)
        if hit.score < floor or used > budget:
            break
        out.append(hit)
    return out

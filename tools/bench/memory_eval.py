"""Recall quality on two sets, hybrid beside BM25 alone and exact cosine alone, per question type.

The sets:

- ``own``: our SYNTHETIC set (tools/bench/memory_set.py), 5 seeds of ~40 questions;
  seeds 1-3 are the tuning split, 4-5 held out.
- ``locomo``: LoCoMo (Maharana et al., ACL 2024, github.com/snap-research/locomo,
  ``data/locomo10.zip``), 10 long conversations of two people, 5,882 turns, 1,540
  answerable questions each with the turns that answer it (category 5, the
  adversarial questions with no answer, is left out). It is NOT in the repository:
  fetch it and pass the directory holding the conversations' JSON files (``--locomo``;
  kept under ``~/.cache/chalie-eval/locomo``). Conversations 26, 30, 41, 42, 43 are the
  tuning split; 44, 47, 48, 49, 50 are held out and never tuned on.

Every turn is stored through the book's own batch import as
``<speaker> said on <date>: "<text>"`` (a shared photo's caption appended), with its
time and its speaker as a person, one book a conversation, each session stored as a
conversation of its own (its ``conversation_id``), as chat would. A question is answered at
``k`` when one of its answering turns is among the first ``k`` recalled (any-answer),
or all of them are (all-answer).

Measured: any@5, any@10, all@10 for ``hybrid`` (``MemoryBook.recall``), ``bm25``
(the Tantivy keyword index alone) and ``cosine`` (exact cosine over every stored
vector with our embedder).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import re
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from abilities.memory import DEFAULT_K as SHOWN_LEAST
from abilities.memory import RECALL_BUDGET as SHOWN_BUDGET
from chalie.discovery.embedder import Embedder
from chalie.memory.book import MemoryBook
from chalie.memory.briefing import TURN_BUDGET as BRIEF_BUDGET
from chalie.memory.briefing import brief
from chalie.memory.fusion import within_budget
from chalie.memory.records import Draft, Provenance, Recalled
from chalie.memory.store import MemoryStore
from chalie.memory.whose import OWNER
from tools.bench import memory_set

LOCOMO_TYPES: Final = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
LOCOMO_HELD_OUT: Final = frozenset({"44", "47", "48", "49", "50"})
OWN_HELD_OUT: Final = frozenset({4, 5})
METHODS: Final = ("hybrid", "bm25", "cosine")
CACHE: Final = Path.home() / ".cache" / "chalie-eval"


@dataclass(frozen=True)
class Turn:
    key: str
    text: str
    time: str | None = None
    people: tuple[str, ...] = ()
    session: str = ""  # stored with this conversation id


@dataclass(frozen=True)
class Question:
    text: str
    answers: tuple[str, ...]
    kind: str


@dataclass
class Conversation:
    name: str
    held_out: bool
    turns: list[Turn] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


_WHEN = re.compile(r"(\d{1,2}):(\d{2})\s*([ap]m) on (\d{1,2}) (\w+),? (\d{4})", re.I)


def _session_time(value: str) -> tuple[str, str]:
    """('1:56 pm on 8 May, 2023') -> ('2023-05-08T13:56', '8 May 2023')."""
    m = _WHEN.search(value)
    if m is None:
        raise ValueError(f"unreadable session time {value!r}")
    hour, minute, half, day, month, year = m.groups()
    h = int(hour) % 12 + (12 if half.lower() == "pm" else 0)
    when = dt.datetime.strptime(f"{day} {month} {year} {h}:{minute}", "%d %B %Y %H:%M")
    return when.isoformat(timespec="minutes"), f"{int(day)} {month} {year}"


def locomo(directory: Path) -> list[Conversation]:
    """The LoCoMo conversations under ``directory`` (its ``*.json``, one a conversation)."""
    files = sorted(directory.rglob("*.json"))
    if not files:
        raise SystemExit(f"no LoCoMo conversations (*.json) under {directory}")
    out = []
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        conv = data.get("conversation", data)  # the later layout nests the sessions
        qa = data["qa"]
        c = Conversation(path.stem, path.stem in LOCOMO_HELD_OUT)
        n = 1
        while f"session_{n}" in conv:
            iso, day = _session_time(conv[f"session_{n}_date_time"])
            for t in conv[f"session_{n}"]:
                text = t["text"]
                if t.get("blip_caption"):
                    text += f" (shares a photo: {t['blip_caption']})"
                c.turns.append(
                    Turn(
                        key=t["dia_id"],
                        text=f'{t["speaker"]} said on {day}: "{text}"',
                        time=iso,
                        people=(t["speaker"],),
                        session=f"{path.stem}-{n}",
                    )
                )
            n += 1
        keys = {t.key for t in c.turns}
        for q in qa:
            kind = LOCOMO_TYPES.get(int(q["category"]))
            answers = tuple(e for e in q.get("evidence", ()) if e in keys)
            if kind is None or not answers:
                continue
            c.questions.append(Question(q["question"], answers, kind))
        out.append(c)
    return out


def own() -> list[Conversation]:
    """Our synthetic set, one conversation a seed."""
    out = []
    for seed in range(1, 6):
        items, questions = memory_set.build(seed=seed)
        c = Conversation(f"own-{seed}", seed in OWN_HELD_OUT)
        c.turns = [
            Turn(key=str(i), text=m.text, session=f"{seed}-{m.session}")
            for i, m in enumerate(items)
        ]
        c.questions = [Question(q.text, (str(q.answer),), q.kind) for q in questions]
        out.append(c)
    return out


def vectors(embedder: Embedder, texts: Sequence[str], cache: Path | None) -> Any:
    """The texts' rows, remembered under ``cache`` by the model and the texts."""
    digest = hashlib.sha256("\n".join([embedder.model_id, *texts]).encode()).hexdigest()[:24]
    path = cache / f"vectors-{digest}.npy" if cache is not None else None
    if path is not None and path.exists():
        return np.load(path)
    matrix = np.vstack([embedder.embed(texts[i : i + 256]) for i in range(0, len(texts), 256)])
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, matrix)
    return matrix


@dataclass
class Tally:
    n: int = 0
    hits: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, method: str, ranked: Sequence[int], answers: set[int]) -> None:
        self.hits[f"{method} any@5"] += bool(answers & set(ranked[:5]))
        self.hits[f"{method} any@10"] += bool(answers & set(ranked[:10]))
        self.hits[f"{method} all@10"] += answers <= set(ranked[:10])

    def share(self, name: str) -> float:
        return self.hits[name] / max(1, self.n)


Recall = Callable[[MemoryBook, str], list[Recalled]]


def hybrid(book: MemoryBook, query: str) -> list[Recalled]:
    return book.recall([OWNER], query=query, k=10)


def run(
    conversations: Sequence[Conversation],
    embedder: Embedder,
    *,
    split: str,
    recall: Recall = hybrid,
    cache: Path | None = CACHE,
) -> dict[str, Tally]:
    """Per question type (and ``all``), the tallies of every method, over ``split``
    (``tune``, ``held-out`` or ``all``)."""
    tallies: dict[str, Tally] = defaultdict(Tally)
    for conv in conversations:
        if split != "all" and conv.held_out != (split == "held-out"):
            continue
        for kind, ranked, brief_tokens in _ranked(conv, embedder, recall, cache):
            for name in (kind, "all"):
                tally = tallies[name]
                tally.n += 1
                tally.hits["brief tokens"] += brief_tokens
                tally.hits["brief max"] = max(tally.hits["brief max"], brief_tokens)
                tally.hits["brief empty"] += brief_tokens == 0
                for method, (ids, answers) in ranked.items():
                    if method in ("shown", "brief"):
                        tally.hits[f"{method} any"] += bool(answers & set(ids))
                        tally.hits[f"{method} count"] += len(ids)
                    else:
                        tally.add(method, ids, answers)
    return dict(tallies)


def _ranked(
    conv: Conversation,
    embedder: Embedder,
    recall: Recall,
    cache: Path | None,
) -> Iterator[tuple[str, dict[str, tuple[list[int], set[int]]], int]]:
    matrix = vectors(embedder, [t.text for t in conv.turns], cache)
    with tempfile.TemporaryDirectory(prefix="memory-eval-") as tmp:
        store = MemoryStore(Path(tmp) / "chalie.db")
        book = MemoryBook(store, embedder, None)
        stored = []
        for session, rows in itertools.groupby(enumerate(conv.turns), lambda it: it[1].session):
            at = [i for i, _ in rows]
            stored += book.store_many(
                [
                    Draft(text=t.text, kind="event", time=t.time, people=t.people)
                    for t in (conv.turns[i] for i in at)
                ],
                Provenance(principal=OWNER, source="import", conversation_id=session),
                vectors=[matrix[i] for i in at],
            )
        ids = {t.key: m.id for t, (m, _) in zip(conv.turns, stored, strict=True)}
        row_ids = np.array([ids[t.key] for t in conv.turns])
        index = book.index()
        index.flush()  # the steady state: every memory in Tantivy, none in the tail
        for q in conv.questions:
            answers = {ids[a] for a in q.answers}
            qv = embedder.embed([q.text])[0]
            order = np.argsort(-(matrix @ qv))
            cosine = list(dict.fromkeys(int(i) for i in row_ids[order[:40]]))[:10]
            hits = recall(book, q.text)
            shown = within_budget(hits, SHOWN_LEAST, SHOWN_BUDGET)
            # as a turn carries it (chalie.memory.briefing.for_turn): its budget, and nothing
            # at all when no memory bears on the message
            put = brief(
                book, [OWNER], q.text, zone=dt.UTC, zone_name="UTC", now=0.0, budget=BRIEF_BUDGET
            )
            yield (
                q.kind,
                {
                    "hybrid": ([h.memory.id for h in hits], answers),
                    "shown": ([h.memory.id for h in shown], answers),
                    "brief": (list(put.ids), answers),
                    "bm25": ([i for i, _ in index.keyword([OWNER], q.text, 10)], answers),
                    "cosine": (cosine, answers),
                },
                put.tokens if put.ids else 0,
            )
        book.close()
        store.close()


COLUMNS: Final = ("any@5", "any@10", "all@10")


def report(title: str, tallies: dict[str, Tally]) -> None:
    print(title)
    head = " |".join(f"{m:^20}" for m in METHODS)
    print(f"   {'':<14}{'':>5} {head}")
    cols = " |".join("".join(f"{c:>7}" for c in COLUMNS)[1:] for _ in METHODS)
    print(f"   {'type':<14}{'n':>5} {cols}")
    for kind in sorted(tallies, key=lambda k: (k == "all", k)):
        t = tallies[kind]
        cells = " |".join(
            "".join(f"{t.share(f'{m} {c}'):>7.3f}" for c in COLUMNS)[1:] for m in METHODS
        )
        print(f"   {kind:<14}{t.n:>5} {cells}")
    t = tallies["all"]
    print(
        f"   shown as the memory ability shows a recall (at least {SHOWN_LEAST}, up to 10 "
        f"while the top is flat, {SHOWN_BUDGET} tokens): any-answer {t.share('shown any'):.3f}, "
        f"{t.hits['shown count'] / max(1, t.n):.2f} memories a recall"
    )
    print(
        f"   in the brief a turn would carry (chalie.memory.briefing.for_turn, {BRIEF_BUDGET} "
        f"rough tokens): any-answer {t.share('brief any'):.3f}, "
        f"{t.hits['brief count'] / max(1, t.n):.2f} memories, "
        f"{t.hits['brief tokens'] / max(1, t.n):.0f} tokens a turn on average (max "
        f"{t.hits['brief max']}; none for {t.share('brief empty'):.0%} of the messages)"
    )

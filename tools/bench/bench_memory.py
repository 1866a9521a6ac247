"""Memory and scheduler figures, each printed beside its floor and the ratio.

1. ``memory recall`` at 100,000 memories, the query's embedding included (the
   shipped MiniLM int8 embedder, HNSW int8 + Tantivy, fused): p50 and p99 over
   500 queries. Floors: p50 <= 10 ms, p99 <= 30 ms.
2. A stored memory recallable after ``store`` returns: the time from the start
   of ``store`` to a recall that finds it (both include an embedding), p50 and
   max over 100 stores into the 100,000. Floor: <= 100 ms.
3. The memory index's memory at 100,000: RSS growth of a fresh process opening
   the saved index and answering 200 queries (embedder loaded before the
   baseline). Floor: <= 60 MB.
4. Recall quality (tools/bench/memory_eval.py): any-answer recall at 5 and 10 and
   all-answer recall at 10, per question type, hybrid beside BM25 alone and exact
   cosine alone in the same run, on our SYNTHETIC set (tools/bench/memory_set.py) and,
   with ``--locomo DIR``, on LoCoMo (github.com/snap-research/locomo, fetched apart and
   kept out of the repository). ``--split`` picks the tuning split, the held-out one
   (the default; the floors apply to it: any@5 >= 70 %, any@10 >= 80 %, all@10 >= 65 %)
   or all.
5. A reminder fires within 1 s of its time: the Scheduler actor on the wall
   clock, 20 reminders 1-3 s ahead, lateness of each firing. Floor: max <= 1 s.
6. 10,000 pending reminders: the process's CPU over 10 s of idling with the
   Scheduler up, beside the same with none. Floor: no measurable difference
   (<= 1 % of a core).
7. A batch import (``chalie memory import``'s MemoryBook.import_rows, embedding
   included) of 2,000 memories into a home holding 10,000. Floor: >= 100 a second.

Run: ``python tools/bench/bench_memory.py [--memories 100000] [--cache DIR] [--short]``.
Embedding 100,000 texts takes a few minutes on a quiet machine (25 under load);
``--cache DIR`` keeps the vectors and the filled home (chalie.db and the saved
index), so a second run starts at once. ``--short`` (about two minutes) composes
the corpus vectors from the embeddings of its 62 phrases instead (same graph
size, dimension and quantisation, so a search costs the same; the queries are
embedded for real) and runs figures 1, 2, 3 and 5 with 200 queries and 50 stores.
Figure 1 asks distinct queries (a query asked again reuses its remembered
embedding: printed apart) and prints the CPU per recall (process time, all
threads), which the load does not inflate as it does the wall time. Figure 2's
recall is worded apart from the stored text (it embeds its own query) and quotes
the memory's reference, as a person would.

Measured 6 December 2026, second session (issue 32, branch memory), ``--short``:

- 1. recall at 100,000, embedding included, at load average 12-13: p50 8.55 ms (floor
  10, OK), p99 117.85 (OVER at that load); CPU per recall p50 8.03 ms. Before this
  session's changes, in a quiet minute (load 0.2-2.1): p50 8.62 ms, CPU p50 8.60. Where a
  recall's time goes (cProfile and timers, the embedding remembered): the embedding 3.5 ms
  wall on two threads (5.5 ms CPU; 4.6 on one: fp32 matrix products after onnxruntime
  folds the int8 weights, ~100 GFLOP/s a core, near that core's peak); the keyword search
  0.97 -> 0.41 ms (content words only); chalie.db's rows 1.0 -> 0.45 ms (this bench's home
  is now checkpointed, as a daemon keeps it); the graph search 0.3-0.6 ms at ef 96.
- 2. store -> recallable p50 31.4 ms (OK), max 511 (OVER at load 12).
- 3. +56.2 MB RSS (OK).
- 4. LoCoMo held-out: hybrid any@5 0.723, any@10 0.807, all@10 0.665 (floors 0.70 /
  0.80 / 0.65: OK), BM25 (the keyword side, content words) 0.624 / 0.701 / 0.570, cosine
  0.465 / 0.554 / 0.413; ours held-out 0.950 / 0.963 / 0.963.
- 7. batch import: 189.7 a second in the quiet minute (embedding alone 298 a second,
  the rest 522), 51.7 at load 12 (embedding alone 69).

Measured 6 December 2026 (issue 32, branch memory) on the shared 2-core machine, load
average 8-15 (five sessions and a model benchmark), ``--short`` for figures 1-3 (the
composed corpus vectors; the queries embedded for real):

- 1. recall at 100,000, embedding included: p50 21.57 ms, p99 41.40 (floors 10 / 30:
  OVER at that load); CPU per recall mean 10.13 ms, p50 9.91 (the embedding most of it);
  a query asked again p50 7.65 ms. Interleaved in the same minutes, the same saved home,
  200 queries with the embedding remembered, CPU per recall p50: main 3.31 / 3.51 ms,
  this branch 3.68 / 3.90 ms (the lift reads a head of 20 rows and their neighbours).
- 2. store -> recallable: p50 53.2 ms (floor 100, OK), max 162.1 (OVER at that load);
  50/50 found by a reworded recall.
- 3. index memory at 100,000: +56.2 MB RSS (floor 60, OK).
- 4. recall quality, held-out splits (LoCoMo: 772 questions; ours: 80): LoCoMo hybrid
  any@5 0.684, any@10 0.777, all@10 0.641 (floors 0.70 / 0.80 / 0.65: just under;
  main's recall 0.563 / 0.672 / 0.528), BM25 0.560 / 0.659 / 0.523, cosine 0.465 / 0.554
  / 0.413; what the ability shows (>= 5, <= 10, 400 tokens) holds an answer for 0.734 with
  7.16 memories a recall. Ours: hybrid 0.925 / 0.950 / 0.950, BM25 0.700 / 0.738, cosine
  0.950 / 0.963.
- 5. reminder lateness, 20 on the wall clock: max 69.99 ms (floor 1,000 ms, OK).
- 7. batch import of 2,000 into 10,000: 77.2 a second (floor 100: OVER); embedding the
  same texts alone runs at 95 a second at that load, the rest of the import at 418 a
  second: the embedding on a loaded CPU is the bound.

Measured 1 December 2026 (session 6) on the shared 2-core machine, load average
9-13 (CPU pressure "some" 90-97 %: a runnable thread waits for a core most of the
time, so wall times are several times the CPU they take), one full run with the
real vectors from ``--cache``:

- 1. recall at 100,000, embedding included: p50 12.62 ms (floor 10, OVER), p99
  135.37 ms (floor 30, OVER) at that load; CPU per recall mean 10.03 ms, p50 9.54,
  p99 13.73 (the embedding is ~7 of them at that load, ~3 quiet); a query asked
  again (embedding remembered) p50 2.56 ms. Same machine, same minutes,
  interleaved, 300 distinct queries: CPU per recall 11.6-12.0 ms before this
  session's changes, 9.7-10.2 after (the non-embedding part ~5 ms -> ~3).
- 2. store -> recallable: p50 48.1 ms (floor 100, OK), max 204.3 ms (OVER at that
  load; store alone p50 22.4, max 168.1); 100/100 found by a reworded recall
  quoting the memory's reference (92/100 before the rare-word list). The store's
  own SQLite commit, max 60-70 ms when it crossed the WAL checkpoint threshold, is
  now at most 7.6 ms (the committer checkpoints).
- 3. index memory at 100,000: +56.2 MB RSS (floor 60, ratio 0.94, OK).
- 4. recall@5 on the SYNTHETIC set (4,600 memories, 200 questions): hybrid 0.935,
  keyword baseline 0.645, semantic alone 0.930; hybrid / keyword 1.45 (OK).
- 5. reminder lateness, 20 on the wall clock: max 5.97 ms (floor 1,000 ms, OK).
- 6. idle CPU, 10,000 pending minus none: -0.01 % of a core (floor 1 %, OK).

The previous session's run (load 10-12): recall p50 9.10 ms, p99 57.71; store ->
recallable p50 29.3, max 145.7; the same RSS, quality and reminder figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chalie.discovery.embedder import load_embedder  # noqa: E402
from chalie.memory.book import MemoryBook  # noqa: E402
from chalie.memory.records import Draft, Memory, Provenance  # noqa: E402
from chalie.memory.store import MemoryStore  # noqa: E402
from chalie.memory.whose import OWNER  # noqa: E402
from tools.bench import memory_eval  # noqa: E402

FIRST = ["I", "My sister", "My brother", "Our neighbour", "My manager", "My friend", "We"]
VERBS = [
    "booked",
    "cancelled",
    "moved",
    "bought",
    "borrowed",
    "planned",
    "finished",
    "started",
    "visited",
    "repaired",
    "ordered",
    "returned",
    "painted",
    "sold",
    "signed up for",
]
THINGS = [
    "a table for four",
    "the blue bicycle",
    "a flight",
    "the garden shed",
    "a yoga class",
    "the old piano",
    "a dentist appointment",
    "tickets to the opera",
    "a new laptop",
    "the kitchen tiles",
    "a weekend cabin",
    "a pottery course",
    "the car insurance",
    "a bookshelf",
    "the passport renewal",
    "a birthday cake",
    "the wifi router",
]
WHERE = [
    "in Valletta",
    "in Lisbon",
    "near the harbour",
    "at the office",
    "in Sliema",
    "online",
    "in Mdina",
    "at the market",
    "in Rabat",
    "downtown",
    "at the library",
    "in Gozo",
]
WHEN = [
    "last Monday",
    "on Friday",
    "next week",
    "in March",
    "yesterday",
    "this morning",
    "two weeks ago",
    "in the summer",
    "on the 12th",
    "after work",
    "at the weekend",
]


PARTS = (FIRST, VERBS, THINGS, WHERE, WHEN)


def picks(n: int, seed: int = 1) -> list[tuple[int, ...]]:
    """Which phrase of each part every corpus text uses."""
    rng = random.Random(seed)
    return [tuple(rng.randrange(len(part)) for part in PARTS) for _ in range(n)]


def corpus(n: int, seed: int = 1) -> list[str]:
    return [
        " ".join(part[j] for part, j in zip(PARTS, pick, strict=True)) + f" (note {i})"
        for i, pick in enumerate(picks(n, seed))
    ]


def composed_vectors(n: int, seed: int = 1) -> np.ndarray[Any, Any]:
    """The short mode's corpus vectors: each text's vector is the normalised sum of its five
    phrases' embeddings plus a little noise (62 texts embedded instead of 100,000). The graph
    has the same size, dimension and quantisation, so a search costs what it does on real
    vectors; the neighbours are only approximately those of the real texts."""
    embedder = load_embedder()
    phrases = [embedder.embed(list(part)) for part in PARTS]
    rng = np.random.default_rng(seed)
    rows = np.zeros((n, embedder.dim), dtype=np.float32)
    for k, pick in enumerate(picks(n, seed)):
        rows[k] = sum(phrases[p][j] for p, j in enumerate(pick))
    rows += rng.normal(0.0, 0.08, rows.shape).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def line(name: str, value: float, unit: str, floor: str, ok: bool, ratio: float) -> None:
    print(
        f"{name:<46} {value:>9.2f} {unit:<4} floor {floor:<10} ratio {ratio:5.2f}  "
        f"{'OK' if ok else 'OVER'}"
    )


def vectors_for(texts: list[str], cache: Path | None) -> np.ndarray[Any, Any]:
    embedder = load_embedder()
    path = cache / f"corpus-{len(texts)}.npy" if cache else None
    if path is not None and path.exists():
        return np.load(path)
    began = time.perf_counter()
    rows = [embedder.embed(texts[i : i + 512]) for i in range(0, len(texts), 512)]
    matrix = np.vstack(rows).astype(np.float32)
    print(f"(embedded {len(texts)} texts in {time.perf_counter() - began:.0f} s)")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, matrix)
    return matrix


def fill(home: Path, texts: list[str], matrix: np.ndarray[Any, Any]) -> MemoryBook:
    embedder = load_embedder()
    store = MemoryStore(home / "chalie.db")
    now = time.time()
    for i, (text, vec) in enumerate(zip(texts, matrix, strict=True)):
        store.insert(
            Memory(
                id=0,
                principal=OWNER,
                kind="event",
                text=text,
                created=now + i * 1e-3,
                updated=now + i * 1e-3,
            ),
            embedder.model_id,
            vec,
        )
    book = MemoryBook(store, embedder, home / "index" / "memory")
    began = time.perf_counter()
    book.index()  # built from the stored vectors, then saved
    print(f"(built the index of {len(texts)} in {time.perf_counter() - began:.0f} s)")
    return book


def filled(home: Path, texts: list[str], vectors: Any, cache: Path | None, kind: str) -> MemoryBook:
    """The filled home: built in ``home``, or copied from the cache's saved copy (then saved);
    chalie.db's WAL copied into the file, as a daemon's committer keeps it (fill's 100,000
    one-row commits leave a WAL of ~1.5 GB, through which every read of a row went: +0.6 ms
    a recall that a running daemon does not pay)."""
    book = _filled(home, texts, vectors, cache, kind)
    book.store.checkpoint()
    return book


def _filled(
    home: Path, texts: list[str], vectors: Any, cache: Path | None, kind: str
) -> MemoryBook:
    saved = cache / f"home-{len(texts)}-{kind}" if cache is not None else None
    if saved is not None and (saved / "chalie.db").exists():
        shutil.copytree(saved, home, dirs_exist_ok=True)
        book = MemoryBook(
            MemoryStore(home / "chalie.db"), load_embedder(), home / "index" / "memory"
        )
        book.index()
        print(f"(the filled home from {saved}; rebuilt: {book.rebuilt})")
        return book
    book = fill(home, texts, vectors())
    if saved is not None:
        book.close()  # saved, so the copy opens without a rebuild
        shutil.copytree(home, saved)
        book.index()
    return book


def bench_recall(book: MemoryBook, queries: int) -> None:
    rng = random.Random(3)
    asks: list[str] = []
    while len(asks) < queries:  # distinct: no query's embedding comes from the cache
        q = f"when did {rng.choice(FIRST).lower()} {rng.choice(VERBS)} {rng.choice(THINGS)}"
        if q not in asks:
            asks.append(q)
    for i in range(20):
        book.recall([OWNER], query=f"a warm-up question {i}")
    times = []
    cpus = []
    gc.collect()
    for q in asks:
        c, t = time.process_time(), time.perf_counter()
        book.recall([OWNER], query=q, k=5)
        times.append((time.perf_counter() - t) * 1e3)
        cpus.append((time.process_time() - c) * 1e3)
    cpu = sum(cpus) / len(cpus)
    again = []
    for q in asks[:100]:  # asked before: the embedding is remembered
        t = time.perf_counter()
        book.recall([OWNER], query=q, k=5)
        again.append((time.perf_counter() - t) * 1e3)
    p50, p99 = pct(times, 50), pct(times, 99)
    print(
        f"   ({len(asks)} distinct queries; CPU per recall (process time, all threads) mean "
        f"{cpu:.2f} ms, p50 {pct(cpus, 50):.2f}, p99 {pct(cpus, 99):.2f}; a query asked again: "
        f"p50 {pct(again, 50):.2f} ms, p99 {pct(again, 99):.2f} ms)"
    )
    line("1. recall @100k p50 (embedding included)", p50, "ms", "<= 10 ms", p50 <= 10, p50 / 10)
    line("1. recall @100k p99 (embedding included)", p99, "ms", "<= 30 ms", p99 <= 30, p99 / 30)


def bench_store(book: MemoryBook, stores_n: int) -> None:
    rng = random.Random(5)
    times = []
    stores = []
    missed: list[str] = []
    for i in range(stores_n):
        unique = f"zq{i}x{rng.randrange(10**9)}"
        thing, where = rng.choice(THINGS), rng.choice(WHERE)
        text = (
            f"{rng.choice(FIRST)} {rng.choice(VERBS)} {thing} {where} "
            f"{rng.choice(WHEN)}, reference {unique}"
        )
        # Worded apart from the text, so the recall embeds its own query.
        query = f"what was {thing} {where} with reference {unique}?"
        t = time.perf_counter()
        memory, _ = book.store_memory(Draft(text=text), Provenance(principal=OWNER))
        stored = time.perf_counter()
        hits = book.recall([OWNER], query=query, k=5)
        done = time.perf_counter()
        if not any(h.memory.id == memory.id for h in hits):
            missed.append(text)
        times.append((done - t) * 1e3)
        stores.append((stored - t) * 1e3)
    p50, mx = pct(times, 50), max(times)
    print(
        f"   (store alone: p50 {pct(stores, 50):.1f} ms, max {max(stores):.1f} ms; "
        f"found by the recall right after: {stores_n - len(missed)}/{stores_n})"
    )
    for text in missed[:3]:
        print(f"   (not in the top 5: {text!r})")
    line("2. store -> recallable p50", p50, "ms", "<= 100 ms", p50 <= 100, p50 / 100)
    line("2. store -> recallable max", mx, "ms", "<= 100 ms", mx <= 100, mx / 100)


RSS_PROBE = """
import gc, json, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from chalie.discovery.embedder import load_embedder
from chalie.memory.index import MemoryIndex
from chalie.memory.store import MemoryStore

def rss():
    for l in open('/proc/self/status'):
        if l.startswith('VmRSS'):
            return int(l.split()[1]) / 1024
home = Path(sys.argv[2])
e = load_embedder()
# one text a call: the query session only (a big batch would build the bulk one)
qs = [e.embed([f"question number {i} about a flight or a dentist"])[0] for i in range(200)]
store = MemoryStore(home / "chalie.db"); gen = store.generation()
gc.collect()
before = rss()
index = MemoryIndex.open(home / "index" / "memory", dim=e.dim, model_id=e.model_id, generation=gen)
assert index is not None, "the saved index is not current"
for i, q in enumerate(qs):
    index.semantic(["owner"], q, 50)
    index.keyword(["owner"], f"question {i} flight dentist bicycle", 50)
gc.collect()
print(json.dumps({"grown": rss() - before, "vectors": len(index)}))
"""


def bench_rss(home: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, str(ROOT), str(home)],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    grown = float(data["grown"])
    line(
        f"3. index memory at {data['vectors']} (RSS growth)",
        grown,
        "MB",
        "<= 60 MB",
        grown <= 60,
        grown / 60,
    )


def bench_quality(locomo: Path | None, split: str) -> None:
    """Figure 4 (tools/bench/memory_eval.py): our set, and LoCoMo when its path is given."""
    embedder = load_embedder()
    sets = [("own SYNTHETIC set (tools/bench/memory_set.py)", memory_eval.own())]
    if locomo is not None:
        sets.append((f"LoCoMo ({locomo}, not in the repository)", memory_eval.locomo(locomo)))
    for title, conversations in sets:
        tallies = memory_eval.run(conversations, embedder, split=split)
        memory_eval.report(f"4. recall, {title}, {split} split:", tallies)
        if split == "held-out" and "LoCoMo" in title:
            t = tallies["all"]
            for name, floor in (("any@5", 0.70), ("any@10", 0.80), ("all@10", 0.65)):
                got = t.share(f"hybrid {name}")
                line(
                    f"4. LoCoMo held-out hybrid {name}",
                    got * 100,
                    "%",
                    f">= {floor:.0%}",
                    got >= floor,
                    got / floor,
                )


def bench_import(n: int) -> None:
    """Figure 7: ``chalie memory import``'s path (MemoryBook.import_rows: rows checked,
    embedded in batches, merged or inserted, indexed), into a home that already holds
    10,000 memories; memories a second, embedding included."""
    texts = corpus(10_000 + n, seed=9)
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        home = Path(tmp)
        embedder = load_embedder()
        store = MemoryStore(home / "chalie.db")
        book = MemoryBook(store, embedder, home / "index" / "memory")
        base = composed_vectors(10_000, seed=9)
        book.store_many(
            [Draft(text=t) for t in texts[:10_000]], Provenance(principal=OWNER), vectors=list(base)
        )
        book.index().flush()
        rows = [{"text": t, "kind": "event", "time": "2026-11-05"} for t in texts[10_000:]]
        began = time.perf_counter()
        result = book.import_rows(rows)
        took = time.perf_counter() - began
        book.close()
        store.close()
        began = time.perf_counter()
        for i in range(0, n, 256):  # the same texts again, embedding only
            embedder.embed([r["text"] for r in rows[i : i + 256]])
        embedding = time.perf_counter() - began
    rate = n / took
    print(
        f"   ({n} rows in {took:.1f} s: {result}; embedding the same texts alone takes "
        f"{embedding:.1f} s ({n / embedding:.0f}/s): the rest runs at "
        f"{n / max(1e-9, took - embedding):.0f}/s; load average {os.getloadavg()[0]:.1f})"
    )
    line("7. batch import, embedding included", rate, "/s", ">= 100/s", rate >= 100, 100 / rate)


class _InstantPort:
    """Stands in for the conversations: every reminder turn is answered at once."""

    def __init__(self) -> None:
        self.n = 0
        self.clients: dict[str, str] = {}

    async def send(self, msg: Any) -> Any:
        from chalie.wire.messages import Accepted

        self.n += 1
        self.clients[f"c{self.n}"] = msg.client_msg_id
        return Accepted(
            conversation_id=f"c{self.n}", turn_id=f"t{self.n}", queued=False, duplicate=False
        )

    async def events(self, cid: str, after_seq: int, limit: int) -> list[Any]:
        from chalie.wire.events import TurnFinished, TurnStarted

        turn = "t" + cid[1:]
        return [
            TurnStarted(
                conversation_id=cid,
                seq=1,
                ts=0.0,
                turn_id=turn,
                client_msg_id=self.clients[cid],
                text="",
            ),
            TurnFinished(
                conversation_id=cid, seq=2, ts=0.0, turn_id=turn, reason="final", text="ok"
            ),
        ]

    async def cancel(self, cid: str) -> bool:
        return False

    async def answer(self, request_id: str, answer: str) -> bool:
        return False

    def subscribe(self, cid: str, callback: Any) -> Any:
        class _Sub:
            def close(self) -> None:
                pass

        return _Sub()


def bench_reminders(idle: bool = True) -> None:
    from actors.loop import EventLoopThread
    from actors.scheduler import Scheduler
    from chalie.schedule.store import ReminderStore
    from chalie.wire.bus import EventBus

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "chalie.db"
        loop = EventLoopThread()
        loop.start()
        port = _InstantPort()
        ref = Scheduler.start(db, EventBus(), port, loop)
        sched = ref.proxy()
        now = time.time()
        ids = [
            sched.add(f"r{i}", "at", _iso(now + 1 + i * 0.1), "UTC", OWNER, None).get().id
            for i in range(20)
        ]
        store = ReminderStore(db)
        deadline = time.time() + 10
        while time.time() < deadline:
            rows = [store.get(i) for i in ids]
            if all(r is not None and r.fired for r in rows):
                break
            time.sleep(0.05)
        late = []
        for i in ids:
            r = store.get(i)
            assert r is not None and r.last_fired is not None, "a reminder did not fire"
            due = _due(r)
            late.append(r.last_fired - due)
        line(
            "5. reminder lateness max (20, wall clock)",
            max(late) * 1e3,
            "ms",
            "<= 1000 ms",
            max(late) <= 1.0,
            max(late),
        )
        ref.stop()
        if not idle:
            loop.stop()
            return
        # 6. idle CPU with 10,000 pending reminders, beside none
        db2 = Path(tmp) / "idle.db"
        store2 = ReminderStore(db2)
        far = time.time() + 30 * 86400
        store2.add_many(
            [(f"r{i}", "after", "30d", "UTC", OWNER, time.time(), far + i) for i in range(10_000)]
        )
        empty = Path(tmp) / "empty.db"
        ReminderStore(empty).close()
        used = {}
        for name, path in (("none", empty), ("10,000", db2)):
            ref = Scheduler.start(path, EventBus(), port, loop)
            ref.proxy().status().get()
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            time.sleep(10)
            used[name] = (time.process_time() - c0) / (time.perf_counter() - t0) * 100
            ref.stop()
        diff = used["10,000"] - used["none"]
        print(
            f"   (process CPU idling 10 s: none pending {used['none']:.3f} %, "
            f"10,000 pending {used['10,000']:.3f} %)"
        )
        line(
            "6. idle CPU, 10,000 pending minus none",
            diff,
            "%",
            "<= 1 %",
            diff <= 1.0,
            max(diff, 0.0) / 1.0,
        )
        loop.stop()


def _iso(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat()


def _due(r: Any) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(r.rule).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--stores", type=int, default=100)
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--only", default="1234567")
    parser.add_argument("--imports", type=int, default=2000)
    parser.add_argument(
        "--locomo",
        type=Path,
        default=None,
        help="LoCoMo's conversations (fetched apart, e.g. ~/.cache/chalie-eval/locomo)",
    )
    parser.add_argument("--split", choices=("tune", "held-out", "all"), default="held-out")
    parser.add_argument(
        "--short",
        action="store_true",
        help="composed corpus vectors (no 100,000 embeddings), 200 queries, 50 stores, "
        "figures 1-3 and 5 only",
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    if args.short:
        args.queries, args.stores = min(args.queries, 200), min(args.stores, 50)
        args.only = "".join(c for c in args.only if c in "12357")
    if {"1", "2", "3"} & set(args.only):
        texts = corpus(args.memories)
        kind = "composed" if args.short else "embedded"
        if args.short:
            print("(short mode: corpus vectors composed from phrase embeddings; queries real)")

        def vectors() -> np.ndarray[Any, Any]:
            if args.short:
                return composed_vectors(len(texts))
            return vectors_for(texts, args.cache)

        with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
            home = Path(tmp)
            book = filled(home, texts, vectors, args.cache, kind)
            gc.collect()
            if "1" in args.only:
                bench_recall(book, args.queries)
            if "3" in args.only:
                book.close()
                bench_rss(home)
            if "2" in args.only:
                bench_store(book, args.stores)
            book.close()
    if "4" in args.only:
        bench_quality(args.locomo, args.split)
    if {"5", "6"} & set(args.only):
        bench_reminders(idle="6" in args.only)
    if "7" in args.only:
        bench_import(args.imports)


if __name__ == "__main__":
    main()

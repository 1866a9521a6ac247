"""Discovery that learns, at scale: 10,000 tools with 20 learned phrases on 1,000 of them.

Usage: python tools/bench/bench_discovery_learning.py [--tools 10000] [--learned-tools 1000]
[--phrases 20] [--json]

The catalogue is bench_discovery.py's synthetic one in the mcp shape (remote
tools: a description, no examples). Learned phrases are user-style requests
made from each tool's (hidden) example phrases. Figures, beside the targets of
the discovery-that-learns issue:

* find_tools, one entry, query embedding included: p50 <= 8 ms, p99 <= 25 ms
* learning one example (the real path: store in SQLite, phrase embedded and
  indexed, journal, head updated) until find_tools returns it: <= 1 s
* retraining the head from every learned phrase (20,000 vectors): <= 10 s

Measured 2026-12-01 on the shared 2-core machine (the integrator re-runs it on
a quiet one), two runs:

    load  build   reopen  find p50/p99      embed p50  learn->found p50/max  head retrain  one tool
    ~6.5  136.7s  1.26s   12.66 / 32.86 ms  -          168 / 709 ms          4.57 s        5.9 ms
    ~5    81.8s   1.45s    6.55 / 29.16 ms  4.09 ms    140 / 289 ms          6.07 s        136 ms

The find p99 misses 25 ms under that load (p50 is 2.5 ms above the embedding
floor); bench_discovery.py measured 4.5 / 6.8 ms without learned phrases on a
quiet moment. The head is retrained here tool by tool through the incremental
path (one small product a tool); a bulk product would be faster still.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_discovery import FILLERS, as_mcp_tool, percentile, synthetic_catalogue

from chalie.discovery.embedder import load_embedder
from chalie.discovery.engine import DiscoveryEngine
from chalie.discovery.head import LinearHead
from chalie.discovery.learning import LearnedExamples, Learner
from chalie.discovery.types import ToolDoc

VERBS = ("could you", "please", "I want to", "help me", "can you", "I need to", "quickly")


def learned_phrases(docs: list[ToolDoc], per_tool: int, seed: int = 5) -> dict[str, list[str]]:
    rng = random.Random(seed)
    out: dict[str, list[str]] = {}
    for doc in docs:
        seen: dict[str, None] = {}
        while len(seen) < per_tool:
            verb, example = rng.choice(VERBS), rng.choice(doc.examples)
            seen[f"{verb} {example} for {rng.choice(FILLERS)} {len(seen)}"] = None
        out[doc.name] = list(seen)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=10_000)
    parser.add_argument("--learned-tools", type=int, default=1_000)
    parser.add_argument("--phrases", type=int, default=20)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    embedder = load_embedder()
    embedder.embed(["warm up the session"])
    phrased = synthetic_catalogue(args.tools)
    catalogue = [as_mcp_tool(d) for d in phrased]
    rng = random.Random(3)
    taught = rng.sample(phrased, args.learned_tools)
    learned = learned_phrases(taught, args.phrases)

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        directory = Path(tmp) / "index"
        t0 = time.perf_counter()
        engine = DiscoveryEngine.build(catalogue, embedder, directory=directory, learned=learned)
        build_s = time.perf_counter() - t0

        # queries: half like the learned requests (new wording), half like any tool
        queries: list[str] = []
        for i in range(args.queries):
            doc = rng.choice(taught if i % 2 == 0 else phrased)
            queries.append(f"{rng.choice(VERBS)} {rng.choice(doc.examples)}")
        for q in queries[:20]:
            engine.find([q])
        latencies: list[float] = []
        for q in queries:
            t0 = time.perf_counter()
            engine.find([q])
            latencies.append((time.perf_counter() - t0) * 1000)
        # the floor under each find: embedding the query alone, interleaved the same way
        embed_only: list[float] = []
        for q in queries:
            t0 = time.perf_counter()
            embedder.embed([q])
            embed_only.append((time.perf_counter() - t0) * 1000)

        # one example through the real learning path, until find_tools returns its tool
        store = LearnedExamples(Path(tmp) / "chalie.db")
        learner = Learner(store, engine)
        visible: list[float] = []
        for doc in rng.sample(phrased, 20):
            entry = f"zap the {doc.tooltip} thing over at {rng.choice(FILLERS)} now"
            t0 = time.perf_counter()
            result = learner.learn(entry, doc.name, "chat")
            found = engine.find([entry]).names
            visible.append((time.perf_counter() - t0) * 1000)
            if not result.learned or doc.name not in found:
                raise SystemExit(f"learned {entry!r} for {doc.name} but find gave {found[:3]}")
        store.close()

        # the head retrained from scratch over every learned phrase vector
        vectors = engine._vectors
        phrase_rows = {
            e.doc.name: vectors._vectors[e.slots[e.catalogue_slots :]]
            for e in vectors._entries.values()
            if len(e.slots) > e.catalogue_slots
        }
        t0 = time.perf_counter()
        head = LinearHead(vectors.dim)
        for name in sorted(phrase_rows):
            head.update(name, None, phrase_rows[name])
        head.scores(np.ones(vectors.dim, dtype=np.float32))  # solves
        retrain_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        head.update(taught[0].name, phrase_rows[taught[0].name], phrase_rows[taught[0].name][1:])
        head.scores(np.ones(vectors.dim, dtype=np.float32))
        incremental_ms = (time.perf_counter() - t0) * 1000

        t0 = time.perf_counter()
        DiscoveryEngine.open(directory, embedder)
        open_s = time.perf_counter() - t0

    figures = {
        "tools": len(catalogue),
        "learned_tools": len(learned),
        "learned_phrases": sum(len(p) for p in learned.values()),
        "build_s": round(build_s, 1),
        "open_s": round(open_s, 2),
        "find_p50_ms": round(statistics.median(latencies), 2),
        "find_p99_ms": round(percentile(latencies, 99), 2),
        "embed_query_p50_ms": round(statistics.median(embed_only), 2),
        "learn_visible_p50_ms": round(statistics.median(visible), 1),
        "learn_visible_max_ms": round(max(visible), 1),
        "head_retrain_s": round(retrain_s, 2),
        "head_incremental_ms": round(incremental_ms, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    if args.json:
        print(json.dumps(figures))
        return 0
    print(
        f"discovery learning benchmark: {figures['tools']} tools, "
        f"{figures['learned_phrases']} learned phrases on {figures['learned_tools']} of them"
    )
    print(f"  build with the phrases (persisted)  {figures['build_s']:7.1f} s")
    print(f"  reopen from disk                    {figures['open_s']:7.2f} s")
    print(
        f"  find_tools, 1 entry                 p50 {figures['find_p50_ms']:.2f} ms  "
        f"p99 {figures['find_p99_ms']:.2f} ms   (targets <= 8 / <= 25 ms)"
    )
    print(f"  query embedding alone (the floor)   p50 {figures['embed_query_p50_ms']:.2f} ms")
    print(
        f"  learn one example -> found          p50 {figures['learn_visible_p50_ms']:.1f} ms  "
        f"max {figures['learn_visible_max_ms']:.1f} ms   (target <= 1000 ms)"
    )
    print(
        f"  head retrained from scratch         {figures['head_retrain_s']:7.2f} s    "
        "(target <= 10 s)"
    )
    print(f"  head after one tool's phrases change {figures['head_incremental_ms']:6.1f} ms")
    print(f"  load average at the end             {figures['load_average']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The discovery evaluation harness: a catalogue and labelled queries in, recall and latency out.

It measures the real find_tools path: every query goes through
``DiscoveryEngine.find`` as a one-entry array (cascade, segment gate, ceiling)
with ``k=10``, and the rank order of ``injected`` is what gets scored. Queries
longer than find_tools accepts are cut at a word boundary, as a caller must, and
counted in the report.

Files are JSONL. Tools: ``{"name", "description"}`` or ``{"name", "summary",
"examples"}``; the description may be missing, null or empty (remote MCP tools
often have none: the name carries them), and prose past MAX_PROSE_CHARS is cut.
Queries: ``{"query", "gold": [names], "type"}`` where ``type`` is ``single``,
``multi`` or ``none`` (the right answer is nothing at all); a query of any
length is accepted and cut to find_tools' entry length when it is sent.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np

from chalie.discovery.cascade import MAX_ENTRY_CHARS, FindResult, QueryError
from chalie.discovery.embedder import Embedder, Matrix
from chalie.discovery.types import ToolDoc

EVAL_K: Final = 10
MAX_FILE_BYTES: Final = 64 * 1024 * 1024
MAX_NAME_CHARS: Final = 200
MAX_PROSE_CHARS: Final = 4000
MAX_EXAMPLES: Final = 32
QUERY_TYPES: Final = ("single", "multi", "none")


class EvalDataError(ValueError):
    """An evaluation file is missing, malformed or inconsistent; the message names the line."""


class Finder(Protocol):
    """What the harness drives: DiscoveryEngine.find."""

    def find(self, queries: Sequence[str], *, k: int = ...) -> FindResult: ...


@dataclass(frozen=True)
class EvalQuery:
    query: str
    gold: tuple[str, ...]
    type: str


@dataclass(frozen=True)
class QueryOutcome:
    """One query's answer: what came back, in order, and which rung gave it."""

    query: str
    gold: tuple[str, ...]
    type: str
    found: tuple[str, ...]
    rung: str
    seconds: float
    truncated: bool


@dataclass
class EvalReport:
    """The published figures (percentages, 0-100) and the per-query detail behind them."""

    tools: int
    queries: int
    tool_queries: int
    none_queries: int
    recall_at_1: float
    recall_at_3: float
    recall_at_5: float
    mrr_at_10: float
    none_empty: float
    latency_p50_ms: float
    latency_p99_ms: float
    truncated: int
    rungs: dict[str, int] = field(default_factory=dict)
    outcomes: list[QueryOutcome] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        """Everything but the per-query detail, for ``--json``."""
        out = asdict(self)
        out.pop("outcomes")
        return out

    def misses(self, k: int = 5) -> list[QueryOutcome]:
        """Tool queries whose gold tools are not all within the top ``k``."""
        return [
            o for o in self.outcomes if o.type != "none" and not set(o.gold) <= set(o.found[:k])
        ]


def _read_jsonl(path: Path, what: str) -> list[tuple[int, dict[str, Any]]]:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise EvalDataError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EvalDataError(f"{what} file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalDataError(f"{path}: unreadable: {exc}") from None
    rows: list[tuple[int, dict[str, Any]]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalDataError(f"{path}:{lineno}: not JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise EvalDataError(f"{path}:{lineno}: expected a JSON object")
        rows.append((lineno, row))
    if not rows:
        raise EvalDataError(f"{path}: no {what} in the file")
    return rows


def _text(
    row: dict[str, Any], key: str, where: str, limit: int, *, required: bool, cut: bool = False
) -> str:
    """The field's text, stripped; longer than ``limit``: cut when ``cut``, else refused."""
    value = row.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise EvalDataError(f"{where}: {key!r} must be a{' non-empty' * required} string")
    if len(value) > limit and not cut:
        raise EvalDataError(f"{where}: {key!r} is longer than {limit} characters")
    return value.strip()[:limit].strip()


def load_catalogue(path: Path) -> list[ToolDoc]:
    """The tools of a JSONL catalogue; EvalDataError on a malformed line or a duplicate name."""
    docs: list[ToolDoc] = []
    seen: set[str] = set()
    for lineno, row in _read_jsonl(Path(path), "tools"):
        where = f"{path}:{lineno}"
        name = _text(row, "name", where, MAX_NAME_CHARS, required=True)
        if name in seen:
            raise EvalDataError(f"{where}: tool {name!r} appears twice")
        seen.add(name)
        key = "summary" if row.get("summary") is not None else "description"
        summary = _text(row, key, where, MAX_PROSE_CHARS, required=False, cut=True)
        examples = row.get("examples", [])
        if not isinstance(examples, list) or len(examples) > MAX_EXAMPLES:
            raise EvalDataError(f"{where}: 'examples' must be a list of at most {MAX_EXAMPLES}")
        if not all(isinstance(e, str) and e.strip() for e in examples):
            raise EvalDataError(f"{where}: every example must be a non-empty string")
        kept = tuple(e.strip()[:MAX_PROSE_CHARS].strip() for e in examples)
        docs.append(ToolDoc(name, summary, kept, source="eval"))
    return docs


def load_queries(path: Path, known: set[str] | None = None) -> list[EvalQuery]:
    """The labelled queries; with ``known``, a gold name outside the catalogue is an error."""
    out: list[EvalQuery] = []
    for lineno, row in _read_jsonl(Path(path), "queries"):
        where = f"{path}:{lineno}"
        # any length: fit_entry cuts it as a caller of find_tools must, and the report counts it
        query = _text(row, "query", where, MAX_FILE_BYTES, required=True)
        gold = row.get("gold", [])
        if not isinstance(gold, list) or not all(isinstance(g, str) and g for g in gold):
            raise EvalDataError(f"{where}: 'gold' must be a list of tool names")
        kind = row.get("type") or ("none" if not gold else "single" if len(gold) == 1 else "multi")
        if kind not in QUERY_TYPES:
            raise EvalDataError(f"{where}: 'type' must be one of {', '.join(QUERY_TYPES)}")
        if (kind == "none") != (not gold):
            raise EvalDataError(f"{where}: a 'none' query has no gold, every other has some")
        if known is not None:
            unknown = [g for g in gold if g not in known]
            if unknown:
                raise EvalDataError(f"{where}: gold {unknown} not in the catalogue")
        out.append(EvalQuery(query, tuple(dict.fromkeys(gold)), kind))
    return out


def fit_entry(query: str, limit: int = MAX_ENTRY_CHARS) -> tuple[str, bool]:
    """The query as one find_tools entry: whitespace folded, cut at a word boundary if too long."""
    text = " ".join(query.split())
    if len(text) <= limit:
        return text, False
    cut = text[:limit]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut), True


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    rank = q / 100 * (len(sorted_values) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (rank - lo)


def evaluate(
    finder: Finder,
    queries: Sequence[EvalQuery],
    *,
    tools: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """Send each query as a one-entry find with k=10 and score the rank order of ``injected``."""
    outcomes: list[QueryOutcome] = []
    for i, q in enumerate(queries):
        entry, cut = fit_entry(q.query)
        started = time.perf_counter()
        try:
            result = finder.find([entry], k=EVAL_K)
        except QueryError:
            # find_tools would refuse this entry (say, nothing printable in it): a miss
            result = FindResult()
            rung = "refused"
        else:
            rung = result.entries[0].rung if result.entries else "none"
        seconds = time.perf_counter() - started
        outcomes.append(
            QueryOutcome(q.query, q.gold, q.type, tuple(result.names), rung, seconds, cut)
        )
        if progress:
            progress(i + 1, len(queries))
    return score(outcomes, tools=tools)


def score(outcomes: Sequence[QueryOutcome], *, tools: int = 0) -> EvalReport:
    """The figures for a set of answered queries.

    R@k counts the share of a query's gold tools within the first k injected
    (so a two-tool query with one found scores 0.5), averaged over tool queries.
    MRR@10 uses the best-ranked gold tool. ``none_empty`` is the share of
    no-tool queries answered with nothing at all.
    """
    tool_q = [o for o in outcomes if o.type != "none"]
    none_q = [o for o in outcomes if o.type == "none"]

    def recall(k: int) -> float:
        if not tool_q:
            return 0.0
        total = sum(len(set(o.gold) & set(o.found[:k])) / len(o.gold) for o in tool_q)
        return 100.0 * total / len(tool_q)

    mrr = 0.0
    for o in tool_q:
        ranks = [o.found.index(g) + 1 for g in o.gold if g in o.found[:EVAL_K]]
        mrr += 1.0 / min(ranks) if ranks else 0.0
    times = sorted(o.seconds * 1000 for o in outcomes)
    rungs: dict[str, int] = {}
    for o in outcomes:
        rungs[o.rung] = rungs.get(o.rung, 0) + 1
    return EvalReport(
        tools=tools,
        queries=len(outcomes),
        tool_queries=len(tool_q),
        none_queries=len(none_q),
        recall_at_1=recall(1),
        recall_at_3=recall(3),
        recall_at_5=recall(5),
        mrr_at_10=100.0 * mrr / len(tool_q) if tool_q else 0.0,
        none_empty=100.0 * sum(1 for o in none_q if not o.found) / len(none_q) if none_q else 0.0,
        latency_p50_ms=_percentile(times, 50),
        latency_p99_ms=_percentile(times, 99),
        truncated=sum(1 for o in outcomes if o.truncated),
        rungs=dict(sorted(rungs.items())),
        outcomes=list(outcomes),
    )


def format_report(report: EvalReport, *, title: str = "") -> str:
    """The human-readable summary the eval command prints."""
    head = f"{title}: " if title else ""
    lines = [
        f"{head}{report.tools} tools, {report.queries} queries "
        f"({report.tool_queries} with a tool, {report.none_queries} with none)",
    ]
    if report.tool_queries:
        lines.append(
            f"  R@1 {report.recall_at_1:5.1f}   R@3 {report.recall_at_3:5.1f}   "
            f"R@5 {report.recall_at_5:5.1f}   MRR@10 {report.mrr_at_10:5.1f}"
        )
    if report.none_queries:
        lines.append(f"  no-tool queries answered with nothing: {report.none_empty:5.1f}%")
    lines.append(
        f"  find_tools latency: p50 {report.latency_p50_ms:.2f} ms   "
        f"p99 {report.latency_p99_ms:.2f} ms"
    )
    rungs = ", ".join(f"{k} {v}" for k, v in report.rungs.items())
    lines.append(f"  rungs: {rungs}")
    if report.truncated:
        lines.append(
            f"  {report.truncated} queries longer than {MAX_ENTRY_CHARS} characters "
            f"were cut at a word boundary"
        )
    return "\n".join(lines)


# -- learning: the same path as real use, and cross-validation --------------------------

LEARN_CHANNEL: Final = "chat"


class CachedEmbedder:
    """An embedder that embeds each distinct text once (an evaluation embeds the same texts
    as phrases and as queries, fold after fold)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self._rows: dict[str, Matrix] = {}

    def embed(self, texts: Sequence[str]) -> Matrix:
        missing = list(dict.fromkeys(t for t in texts if t not in self._rows))
        if missing:
            for text, row in zip(missing, self.inner.embed(missing), strict=True):
                self._rows[text] = row
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._rows[t] for t in texts]).astype(np.float32)


def learn_from(learner: Any, queries: Sequence[EvalQuery]) -> dict[str, int]:
    """Feed labelled queries through ``Learner.learn``, as if each had led to a successful
    call of each of its gold tools on the chat channel; counts by outcome."""
    counts: dict[str, int] = {}
    for q in queries:
        entry, _ = fit_entry(q.query)
        for tool in q.gold:
            result = learner.learn(entry, tool, LEARN_CHANNEL)
            counts[result.reason] = counts.get(result.reason, 0) + 1
    return counts


def fold_of(query: str, k: int) -> int:
    """A query's fold: a hash of its text, so folds are stable across runs and machines."""
    return int(hashlib.sha256(query.encode("utf-8")).hexdigest(), 16) % k


def learned_engine(
    docs: Sequence[ToolDoc], embedder: Embedder, learn: Sequence[EvalQuery], store_dir: Path
) -> tuple[Any, dict[str, int]]:
    """A fresh in-memory index over ``docs`` that learned from ``learn`` through the real path."""
    from chalie.discovery.engine import DiscoveryEngine
    from chalie.discovery.learning import LearnedExamples, Learner

    engine = DiscoveryEngine.build(docs, embedder)
    store = LearnedExamples(store_dir / "learned.db")
    try:
        counts = learn_from(Learner(store, engine, channels=(LEARN_CHANNEL,)), learn)
    finally:
        store.close()
    return engine, counts


def cross_validate(
    docs: Sequence[ToolDoc],
    queries: Sequence[EvalQuery],
    embedder: Embedder,
    *,
    folds: int = 5,
    progress: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """k-fold: learn from the tool queries of k-1 folds, score the held-out fold; pooled figures.

    No-tool queries are never learned from; each is scored in its own fold.
    """
    if not 2 <= folds <= 20:
        raise ValueError("folds must be within 2..20")
    cached = embedder if isinstance(embedder, CachedEmbedder) else CachedEmbedder(embedder)
    assigned = [fold_of(q.query, folds) for q in queries]
    outcomes: list[QueryOutcome] = []
    for fold in range(folds):
        train = [q for q, f in zip(queries, assigned, strict=True) if f != fold and q.gold]
        test = [q for q, f in zip(queries, assigned, strict=True) if f == fold]
        with tempfile.TemporaryDirectory(prefix="chalie-eval-") as tmp:
            engine, _ = learned_engine(docs, cached, train, Path(tmp))
            outcomes.extend(evaluate(engine, test, tools=len(docs)).outcomes)
        if progress:
            progress(fold + 1, folds)
    return score(outcomes, tools=len(docs))

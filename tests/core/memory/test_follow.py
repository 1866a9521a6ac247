"""Two daemons' memory books on one store: each one's index follows the other's writes while
both run (chalie.memory.book.MemoryBook.follow; NOTIFY on PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chalie.discovery.embedder import Embedder
from chalie.memory.book import MemoryBook
from chalie.memory.records import Draft, Provenance
from chalie.memory.store import MemoryStore
from chalie.memory.whose import OWNER
from chalie.store.store_place import Postgres
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

ME = Provenance(principal=OWNER, source="person")


@pytest.fixture
def two(
    tmp_path: Path, embedder: Embedder, pg_cluster: Any
) -> Iterator[tuple[MemoryBook, MemoryBook]]:
    """Two daemons' books on one PostgreSQL (on SQLite, one daemon a file: nothing to follow)."""
    store_place = Postgres(pg_cluster.new_database())
    books = [
        MemoryBook(MemoryStore(store_place), embedder, tmp_path / name / "memory")
        for name in ("a", "b")
    ]
    followers = [b.follow() for b in books]
    yield books[0], books[1]
    for f in followers:
        f.close()
    for b in books:
        b.close()
        b.store.close()


def recalled(book: MemoryBook, query: str) -> list[str]:
    return [h.memory.text for h in book.recall([OWNER], query=query, k=3)]


def test_a_memory_stored_forgotten_or_promoted_on_a_is_followed_by_bs_open_index(
    two: tuple[MemoryBook, MemoryBook],
) -> None:
    a, b = two
    assert recalled(b, "bicycle lock code") == []  # B's index is open, and empty
    built = b.rebuilt
    stored, _ = a.store_memory(Draft(text="the bicycle lock code is 4711"), ME)
    wait_until(
        lambda: recalled(b, "bicycle lock code") == ["the bicycle lock code is 4711"],
        5,
        "B recalls what A stored",
    )
    assert b.rebuilt == built  # followed, not rebuilt from the table
    agents = a.store_memory(
        Draft(text="the staging database is on port 6543"),
        Provenance(principal="agent:ci", source="agent"),
    )[0]
    a.promote(agents.id)  # another principal's graph on B too
    wait_until(
        lambda: recalled(b, "staging database port") == ["the staging database is on port 6543"],
        5,
        "B recalls the promoted memory as the owner's",
    )
    a.forget([OWNER], stored.id)
    wait_until(lambda: recalled(b, "bicycle lock code") == [], 5, "B forgets it too")

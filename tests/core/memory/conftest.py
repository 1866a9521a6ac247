"""A memory book over a temporary store (SQLite, and a real PostgreSQL), with the embedder
the project ships."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chalie.discovery.embedder import Embedder, load_embedder
from chalie.memory.book import MemoryBook
from chalie.memory.store import MemoryStore
from chalie.store.store_place import Place
from tests.slow import require_slow


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    require_slow("a model")
    return load_embedder()


@pytest.fixture
def book(tmp_path: Path, embedder: Embedder, store_place: Place) -> Iterator[MemoryBook]:
    b = MemoryBook(MemoryStore(store_place), embedder, tmp_path / "index" / "memory")
    yield b
    b.close()
    b.store.close()

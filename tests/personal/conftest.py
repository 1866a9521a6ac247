"""Fixtures for the personal abilities: a home with an account book, real servers on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chalie.accounts.book import AccountBook


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir(mode=0o700)
    return h


@pytest.fixture
def book(home: Path) -> Iterator[AccountBook]:
    b = AccountBook(home / "chalie.db", home)
    yield b
    b.close()

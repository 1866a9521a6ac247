"""Fixtures for the personal abilities: a home with an account store, real servers on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chalie.accounts.store import AccountStore


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir(mode=0o700)
    return h


@pytest.fixture
def book(home: Path) -> Iterator[AccountStore]:
    b = AccountStore(home / "chalie.db", home)
    yield b
    b.close()

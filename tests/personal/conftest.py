"""Fixtures for the personal abilities: a home with an account book, real servers on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chalie.accounts.book import AccountBook
from chalie.personal.runtime import PersonalRuntime, PersonalSettings
from chalie.services import Services


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


def runtime(book: AccountBook, **settings: object) -> PersonalRuntime:
    return PersonalRuntime(book, PersonalSettings(**settings))  # type: ignore[arg-type]


def services(rt: PersonalRuntime) -> Services:
    return Services(personal=rt)

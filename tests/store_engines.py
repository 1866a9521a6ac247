"""The store suite's engines: a test that takes ``store_place`` runs once on SQLite and once
on a real PostgreSQL (one parametrised suite, never two copies).

The PostgreSQL run is marked slow (it starts a server): one throw-away cluster a test
session (:class:`tools.pg_cluster.PgCluster`, started at the first test that needs it),
and a fresh database for each test. Without PostgreSQL installed the PostgreSQL run
fails, naming the package, in CI (``CI`` set) and skips elsewhere.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from chalie.store.sql import Connection, open_connection
from chalie.store.store_place import Place, Postgres
from tools.pg_cluster import PgCluster, bin_dir

ENGINES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)]


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    if bin_dir() is None:
        message = "PostgreSQL is not installed (apt-get install -y postgresql)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    if importlib.util.find_spec("psycopg") is None:
        if os.environ.get("CI"):  # the test extra installs it: missing there is a defect
            pytest.fail("psycopg is not installed: .ci/run installs chalie[test]")
        pytest.skip("psycopg is not installed (pip install 'chalie[postgres]')")
    cluster = PgCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture(params=ENGINES)
def store_place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    """Where a store under test keeps its state: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "chalie.db"
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    return Postgres(cluster.new_database())


@contextmanager
def opened(place: Place, schema: str) -> Iterator[Connection]:
    """A connection to ``place`` with ``schema`` made, closed after."""
    conn = open_connection(place)
    try:
        conn.script(schema)
        yield conn
    finally:
        conn.close()

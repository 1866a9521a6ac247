"""The store interface (chalie.store.sql, chalie.store.store_place): one dialect on SQLite and on a
real
PostgreSQL (tests/store_engines.py runs each test on both), the ``[store]`` setting, and a
store not on PostgreSQL yet failing closed."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from chalie.process.config import Config, ConfigError
from chalie.store.sql import Connection, open_connection, postgres_ddl
from chalie.store.store_place import (
    NOT_ON_POSTGRES,
    PASSWORD_SECRET,
    IntegrityError,
    Place,
    Postgres,
    StoreError,
    StoreUnavailable,
    check_ported,
    sqlite_file,
)
from chalie_app.cli import cli
from tests.store_engines import opened

SCHEMA = """
CREATE TABLE IF NOT EXISTS things (
    id      INTEGER PRIMARY KEY,
    name    TEXT NOT NULL UNIQUE,
    at      REAL NOT NULL,
    big     INTEGER NOT NULL DEFAULT 0,
    body    BLOB,
    note    TEXT
);
CREATE INDEX IF NOT EXISTS things_at ON things (at);
"""


@pytest.fixture
def conn(store_place: Place) -> Iterator[Connection]:
    with opened(store_place, SCHEMA) as c:
        yield c


def test_one_dialect_runs_alike_on_both_engines(conn: Connection) -> None:
    at = 1_765_000_000.123456  # a timestamp: a 4-byte REAL would lose its seconds
    made = conn.execute(
        "INSERT INTO things (name, at, big, body) VALUES (?, ?, ?, ?) RETURNING id",
        ("a", at, 2**40, b"\x00\xff"),
    ).fetchone()
    assert made[0] >= 1
    row = conn.execute("SELECT name, at, big, body FROM things WHERE id = ?", (made[0],)).fetchone()
    assert tuple(row) == ("a", at, 2**40, b"\x00\xff")
    # An upsert in the common form: DO UPDATE with excluded, and DO NOTHING.
    upsert = (
        "INSERT INTO things (name, at) VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET at = excluded.at"
    )
    conn.execute(upsert, ("a", 5.0))
    ignored = conn.execute(
        "INSERT INTO things (name, at) VALUES (?, ?) ON CONFLICT DO NOTHING", ("a", 9.0)
    )
    assert ignored.rowcount == 0
    assert conn.execute("SELECT at FROM things WHERE name = 'a'").fetchone()[0] == 5.0
    # '?' and '%' inside quoted text are text, not placeholders.
    conn.execute("INSERT INTO things (name, at, note) VALUES ('q?%', ?, 'x?')", (1.0,))
    found = conn.execute(
        "SELECT note FROM things WHERE name LIKE 'q?%' AND at = ?", (1.0,)
    ).fetchall()
    assert [tuple(r) for r in found] == [("x?",)]
    assert conn.columns("things") == {"id", "name", "at", "big", "body", "note"}
    assert conn.columns("absent") == set()


def test_a_broken_constraint_is_an_integrity_error_and_the_store_goes_on(
    conn: Connection,
) -> None:
    conn.execute("INSERT INTO things (name, at) VALUES (?, ?)", ("a", 1.0))
    with pytest.raises(IntegrityError):
        conn.execute("INSERT INTO things (name, at) VALUES (?, ?)", ("a", 2.0))
    with pytest.raises(StoreError):
        conn.execute("SELECT nope FROM things")
    assert conn.execute("SELECT count(*) FROM things").fetchone()[0] == 1


def test_a_transaction_commits_whole_or_not_at_all(conn: Connection, store_place: Place) -> None:
    with conn.transaction() as tx:
        tx.execute("INSERT INTO things (name, at) VALUES (?, ?)", ("a", 1.0))
        tx.execute("INSERT INTO things (name, at) VALUES (?, ?)", ("b", 1.0))
    with pytest.raises(IntegrityError), conn.transaction() as tx:
        tx.execute("INSERT INTO things (name, at) VALUES (?, ?)", ("c", 1.0))
        tx.execute("INSERT INTO things (name, at) VALUES (?, ?)", ("a", 1.0))
    with pytest.raises(RuntimeError), conn.transaction() as tx:
        tx.execute("DELETE FROM things")
        raise RuntimeError("changed my mind")
    other = open_connection(store_place)  # another connection sees what was committed only
    names = [r[0] for r in other.execute("SELECT name FROM things ORDER BY name")]
    assert names == ["a", "b"]
    other.close()


def test_sqlite_only_syntax_is_refused_on_both_engines(conn: Connection) -> None:
    for statement in (
        "INSERT OR IGNORE INTO things (name, at) VALUES (?, ?)",
        "PRAGMA table_info(things)",
        "BEGIN IMMEDIATE",
    ):
        with pytest.raises(ValueError, match="SQLite-only"):
            conn.execute(statement, ("x", 1.0) if "?" in statement else ())


def test_two_connections_creating_one_schema_at_once_both_succeed(store_place: Place) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def make() -> None:
        try:
            c = open_connection(store_place, racing=True)
            start.wait()
            c.script(SCHEMA)
            c.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_the_ddl_types_map_to_postgresql_ones() -> None:
    out = postgres_ddl(SCHEMA)
    assert "id      BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY" in out
    assert "at      DOUBLE PRECISION NOT NULL" in out
    assert "big     BIGINT NOT NULL" in out and "body    BYTEA" in out
    with pytest.raises(ValueError):
        postgres_ddl("CREATE TRIGGER t AFTER INSERT ON things BEGIN SELECT 1; END")


# -- [store] ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql://chalie:hunter2@db.example/chalie", "must not carry a password"),
        ("postgresql://chalie@db/chalie?password=hunter2", "must not carry a password"),
        ("mysql://chalie@db/chalie", "must start with postgresql://"),
        ("/var/lib/chalie.db", "must start with postgresql://"),
    ],
)
def test_a_bad_store_url_is_one_line_and_never_shows_the_password(
    tmp_path: Path, url: str, said: str
) -> None:
    with pytest.raises(ConfigError) as err:
        Config.from_mapping({"store": {"url": url}}, home=tmp_path)
    message = str(err.value)
    assert said in message and "\n" not in message and "hunter2" not in message


def test_the_password_comes_from_the_environment_or_the_secrets_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "postgresql://chalie@127.0.0.1:5/chalie"
    plain = Config.from_mapping({}, home=tmp_path)
    assert plain.store_place == tmp_path / "chalie.db"
    named = Config.from_mapping({"store": {"url": url, "password_env": "PG_SECRET"}}, home=tmp_path)
    monkeypatch.delenv("PG_SECRET", raising=False)
    with pytest.raises(StoreUnavailable, match="PG_SECRET, which is not set"):
        named.store_place  # noqa: B018
    monkeypatch.setenv("PG_SECRET", "from-env")
    place = named.store_place
    assert isinstance(place, Postgres) and place.password == "from-env"
    assert "from-env" not in repr(place) and str(place) == url
    from chalie.mcp.secrets import SecretFile

    SecretFile(tmp_path).put({PASSWORD_SECRET: "from-file"})
    kept = Config.from_mapping({"store": {"url": url}}, home=tmp_path).store_place
    assert isinstance(kept, Postgres) and kept.password == "from-file"


def test_a_store_not_on_postgresql_yet_fails_closed_naming_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(NOT_ON_POSTGRES, "tests.unported", "a store under test")
    place = Postgres("postgresql://chalie@127.0.0.1:5/chalie")
    assert sqlite_file(tmp_path / "chalie.db", "tests.unported") == tmp_path / "chalie.db"
    with pytest.raises(StoreUnavailable, match=r"a store under test \(tests.unported\)"):
        sqlite_file(place, "tests.unported")
    with pytest.raises(StoreUnavailable) as err:
        check_ported(place)
    for module in NOT_ON_POSTGRES:
        assert module in str(err.value)
    check_ported(tmp_path / "chalie.db")  # SQLite: every store is there


def test_an_unreachable_store_is_one_line_from_a_cli_command(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        '[store]\nurl = "postgresql://chalie@127.0.0.1:5/chalie"\nconnect_timeout = 2\n'
    )
    done = CliRunner().invoke(cli, ["--home", str(tmp_path), "token", "list"])
    assert done.exit_code == 1, done.output
    assert "PostgreSQL at postgresql://chalie@127.0.0.1:5/chalie:" in done.output
    assert "Traceback" not in done.output and not (tmp_path / "chalie.db").exists()


@pytest.mark.slow
def test_chalie_run_on_an_unreachable_postgresql_refuses_to_start_in_one_line(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(
        "[mcp_server]\nport = 0\n[chat]\nport = 0\n[store]\n"
        'url = "postgresql://chalie@127.0.0.1:5/chalie"\nconnect_timeout = 2\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "chalie", "--home", str(home), "run"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    said = [line for line in done.stderr.splitlines() if "PostgreSQL at" in line]
    assert len(said) == 1 and "postgresql://chalie@127.0.0.1:5/chalie" in said[0]
    assert "Traceback" not in done.stderr
    assert not (home / "chalie.db").exists()  # never a silent fallback to SQLite


def test_a_sqlite_store_never_imports_the_postgresql_driver(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from chalie.gate.tokens import TokenStore; "
        "from chalie.process.config import Config; "
        f"c = Config.from_mapping({{}}, home=Path({str(tmp_path)!r})); "
        "s = TokenStore(c.store_place); s.create('a'); s.close(); "
        "print('psycopg' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "False"

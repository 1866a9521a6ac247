"""The token store: hashes only, shown once, revocable, validated names, the first-boot file."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from chalie.gate.tokens import (
    FIRST_TOKEN_FILE,
    TokenError,
    TokenStore,
    bearer,
    digest,
    ensure_first_token,
)
from chalie.store.sql import Place, open_connection
from chalie_app.cli import cli


@pytest.fixture
def store(store_place: Place) -> Iterator[TokenStore]:
    """A token store on each engine (tests/store_engines.py)."""
    s = TokenStore(store_place)
    yield s
    s.close()


def test_a_created_token_verifies_and_only_its_hash_is_stored(
    store: TokenStore, store_place: Place
) -> None:
    secret = store.create("laptop")
    info = store.verify(secret)
    assert info is not None and info.name == "laptop" and info.active
    raw = open_connection(store_place)
    rows = raw.execute("SELECT * FROM tokens").fetchall()
    raw.close()
    flat = repr(rows)
    assert secret not in flat and digest(secret) in flat
    if isinstance(store_place, Path):
        assert store_place.read_bytes().find(secret.encode()) == -1


def test_secrets_are_unique_and_high_entropy(store: TokenStore) -> None:
    a, b = store.create("a"), store.create("b")
    assert a != b and len(a) >= 40
    assert store.verify(a).name == "a"  # type: ignore[union-attr]
    assert store.verify(b).name == "b"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "name", ["", "-lead", ".x", "a b", "x" * 65, "é", "a/b", "a\nb", "tok;DROP TABLE tokens"]
)
def test_bad_names_are_refused_with_a_code(store: TokenStore, name: str) -> None:
    with pytest.raises(TokenError) as err:
        store.create(name)
    assert err.value.code == "invalid-token-name"
    with pytest.raises(TokenError):
        store.revoke(name)
    assert store.list() == []


def test_a_duplicate_active_name_is_refused(store: TokenStore) -> None:
    first = store.create("ci")
    with pytest.raises(TokenError) as err:
        store.create("ci")
    assert err.value.code == "token-exists"
    assert store.verify(first) is not None  # the first one is untouched


def test_a_revoked_token_never_verifies_and_its_name_can_be_reused(store: TokenStore) -> None:
    old = store.create("ci")
    assert store.revoke("ci") is True
    assert store.revoke("ci") is False  # already revoked
    assert store.verify(old) is None
    assert [t.active for t in store.list()] == [False]
    new = store.create("ci")
    assert store.verify(new) is not None and store.verify(old) is None


def test_revoking_an_unknown_name_says_so(store: TokenStore) -> None:
    assert store.revoke("nobody") is False


@pytest.mark.parametrize(
    "secret", [None, 3, b"bytes", "", "x" * 10_000, "chalie_", "\x00", "\udcff", "a" * 256]
)
def test_hostile_secrets_are_simply_not_tokens(store: TokenStore, secret: object) -> None:
    store.create("real")
    assert store.verify(secret) is None


def test_revocation_from_another_process_is_seen_at_the_next_check(
    store: TokenStore, store_place: Place
) -> None:
    secret = store.create("shared")
    other = TokenStore(store_place)
    try:
        assert other.revoke("shared")
    finally:
        other.close()
    assert store.verify(secret) is None


def test_verify_records_last_use_at_most_once_a_minute(store: TokenStore) -> None:
    secret = store.create("x")
    assert store.list()[0].last_used is None
    info = store.verify(secret)
    assert info is not None and info.last_used is not None
    store.flush()
    first = store.list()[0].last_used
    assert first == info.last_used
    again = store.verify(secret)
    assert again is not None and again.last_used == first  # no second write within the minute
    store.flush()
    assert store.list()[0].last_used == first


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Bearer abcdefgh", "abcdefgh"),
        ("bearer   abcdefgh  ", "abcdefgh"),
        ("bEaReR abcdefgh", "abcdefgh"),
        (b"BEARER abcdefgh", "abcdefgh"),
        ("Bearer abc", None),  # shorter than any b64token we accept
        ("Bearer abcdefgh ijk", None),
        ("Basic abcdefgh", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_header_parsing(header: str | None, expected: str | None) -> None:
    assert bearer(header) == expected


def test_first_boot_writes_one_token_once_to_a_0600_file(store: TokenStore, tmp_path: Path) -> None:
    path = ensure_first_token(store, tmp_path)
    assert path == tmp_path / FIRST_TOKEN_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    secret = path.read_text().strip()
    assert store.verify(secret) is not None
    path.unlink()
    assert ensure_first_token(store, tmp_path) is None  # a token exists: nothing new
    assert not path.exists()
    store.revoke("first")
    assert ensure_first_token(store, tmp_path) is None  # all revoked is the operator's choice


def test_first_boot_does_not_follow_a_planted_symlink(store: TokenStore, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / FIRST_TOKEN_FILE).symlink_to(target)
    path = ensure_first_token(store, tmp_path)
    assert path is not None and not path.is_symlink()
    assert target.read_text() == "keep"


def test_cli_creates_lists_and_revokes(tmp_path: Path) -> None:
    runner = CliRunner()
    home = ["--home", str(tmp_path)]
    made = runner.invoke(cli, [*home, "token", "create", "phone"])
    assert made.exit_code == 0, made.output
    secret = made.stdout.strip().splitlines()[0]
    with TokenStore(tmp_path / "chalie.db") as s:
        assert s.verify(secret) is not None
    listed = runner.invoke(cli, [*home, "token", "list"])
    assert "phone" in listed.output and "active" in listed.output and secret not in listed.output
    dup = runner.invoke(cli, [*home, "token", "create", "phone"])
    assert dup.exit_code != 0 and "token-exists" in dup.output
    bad = runner.invoke(cli, [*home, "token", "create", "no spaces"])
    assert bad.exit_code != 0 and "invalid-token-name" in bad.output
    gone = runner.invoke(cli, [*home, "token", "revoke", "phone"])
    assert gone.exit_code == 0
    again = runner.invoke(cli, [*home, "token", "revoke", "phone"])
    assert again.exit_code != 0 and "unknown-token" in again.output
    assert "revoked" in runner.invoke(cli, [*home, "token", "list"]).output
    with TokenStore(tmp_path / "chalie.db") as s:
        assert s.verify(secret) is None


def test_the_gateway_permission_is_off_unless_granted_and_is_seen_by_verify(
    store: TokenStore,
) -> None:
    plain = store.create("plain")
    keen = store.create("keen", scope="gateway")
    assert store.verify(plain).gateway is False  # type: ignore[union-attr]
    assert store.verify(keen).gateway is True  # type: ignore[union-attr]
    assert {t.name: t.gateway for t in store.list()} == {"keen": True, "plain": False}


def test_a_store_from_before_the_gateway_permission_gains_it_and_keeps_its_tokens(
    store_place: Place,
) -> None:
    db = store_place
    conn = open_connection(db)
    conn.script(
        "CREATE TABLE tokens (name TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE,"
        " created REAL NOT NULL, revoked REAL, last_used REAL)"
    )
    conn.execute("INSERT INTO tokens VALUES ('old', ?, 1.0, NULL, NULL)", (digest("chalie_x" * 6),))
    conn.close()
    with TokenStore(db) as s:
        found = s.verify("chalie_x" * 6)
        assert found is not None and found.name == "old" and found.gateway is False
        s.create("new", scope="gateway")
        assert [t.gateway for t in s.list()] == [True, False]
    with TokenStore(db) as s:  # a second open migrates nothing twice
        assert len(s.list()) == 2


def test_cli_grants_the_gateway_only_with_the_flag(tmp_path: Path) -> None:
    runner = CliRunner()
    home = ["--home", str(tmp_path)]
    assert runner.invoke(cli, [*home, "token", "create", "a"]).exit_code == 0
    made = runner.invoke(cli, [*home, "token", "create", "b", "--gateway"])
    assert made.exit_code == 0, made.output
    listed = runner.invoke(cli, [*home, "token", "list", "--json"])
    import json

    assert {t["name"]: t["gateway"] for t in json.loads(listed.stdout)} == {"a": False, "b": True}
    assert "SCOPE" in runner.invoke(cli, [*home, "token", "list"]).output


def test_a_token_is_regenerated_in_one_step_keeping_its_id(store_place: Place) -> None:
    with TokenStore(store_place) as store:
        old = store.create("desk", scope="owner")
        before = store.verify(old)
        assert before is not None
        new = store.regenerate("desk")
        assert new is not None and new != old
        assert store.verify(old) is None  # the old secret stops at once
        after = store.verify(new)
        assert after is not None and (after.id, after.scope) == (before.id, "owner")
        assert store.regenerate("nobody") is None
        store.revoke("desk")
        assert store.regenerate("desk") is None  # a revoked token is not brought back

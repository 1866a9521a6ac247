"""chalie accounts: add, list, test, default, remove; passwords only in the 0600 secrets file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from chalie.accounts.spec import Account, AccountSpecError
from chalie.accounts.store import AccountStore
from chalie.store.store_place import Place
from chalie_app.cli import cli
from tools.personal_servers import free_port, make_calendar, radicale


def run(home: Path, *args: str, stdin: str = "") -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--home", str(home), "accounts", *args], input=stdin)
    return result.exit_code, result.output


def test_passwords_live_only_in_the_0600_secrets_file(home: Path) -> None:
    code, out = run(
        home,
        "add",
        "imap",
        "mail",
        "--host",
        "imap.example.com",
        "--username",
        "ann",
        "--address",
        "Ann <ann@example.com>",
        "--password-stdin",
        stdin="s3cr3t-app-password\n",
    )
    assert code == 0, out
    assert "the default" in out
    secrets = home / "mcp-secrets.json"
    assert stat.S_IMODE(os.stat(secrets).st_mode) == 0o600
    assert json.loads(secrets.read_text()) == {"account:mail.password": "s3cr3t-app-password"}
    for f in home.iterdir():
        if f.name.startswith("chalie.db"):
            assert b"s3cr3t-app-password" not in f.read_bytes()
    code, out = run(home, "list", "--json")
    rows = json.loads(out)
    assert rows == [
        {
            "name": "mail",
            "kind": "imap",
            "default": True,
            "host": "imap.example.com",
            "port": 993,
            "security": "tls",
            "address": "Ann <ann@example.com>",
            "username": "ann",
            "password": "stored",
        }
    ]
    assert "s3cr3t" not in out
    code, out = run(home, "remove", "mail")
    assert code == 0 and json.loads(secrets.read_text()) == {}


def test_several_accounts_of_a_kind_one_default(home: Path, store_place: Place) -> None:
    book = AccountStore(store_place, home)
    for name in ("home", "work"):
        book.add(Account(name=name, kind="caldav", url=f"https://{name}.example/dav/"), "pw")
    assert [a.name for a in book.list("caldav") if a.default] == ["home"]
    book.set_default("work")
    assert book.pick(("caldav",), None).name == "work"
    assert book.pick(("caldav",), "home").name == "home"
    book.remove("work")
    assert book.pick(("caldav",), None).name == "home"
    # one account of the kind: a name that is not its own (a model's "primary") means it
    assert book.pick(("caldav",), "primary").name == "home"
    book.add(Account(name="play", kind="caldav", url="https://play.example/dav/"), "pw")
    with pytest.raises(Exception) as err:
        book.pick(("caldav",), "nope")
    assert getattr(err.value, "code", None) == "unknown-account"
    assert getattr(err.value, "valid_values", None) == ("home", "play")
    book.add(Account(name="play", kind="caldav", url="https://p2.example/dav/"), "pw", replace=True)
    assert book.get("play").url == "https://p2.example/dav/"  # type: ignore[union-attr]
    book.close()


@pytest.mark.parametrize(
    "account",
    [
        Account(name="Bad Name", kind="caldav", url="https://x.example/"),
        Account(name="a", kind="caldav", url="ftp://x.example/"),
        Account(name="a", kind="caldav", url="https://user:pw@x.example/"),
        Account(name="a", kind="imap", host=""),
        Account(name="a", kind="imap", host="x.example", username="ann\nEvil: 1"),
        Account(name="a", kind="smtp", host="x.example", address="not an address"),
    ],
)
def test_malformed_accounts_are_refused_naming_the_field(
    book: AccountStore, account: Account
) -> None:
    with pytest.raises(AccountSpecError):
        book.add(account, "pw")
    assert book.list() == []


@pytest.mark.slow
def test_test_reports_what_it_found_and_structured_failures(home: Path) -> None:
    with radicale() as srv:
        make_calendar(srv, "alice", "work", "Work")
        code, out = run(
            home,
            "add",
            "caldav",
            "cal",
            "--url",
            srv.url + "/",
            "--username",
            "alice",
            "--password-stdin",
            stdin="secret\n",
        )
        assert code == 0, out
        code, out = run(home, "test", "cal", "--json")
        assert code == 0, out
        assert [c["href"] for c in json.loads(out)["calendars"]] == ["/alice/work/"]
        run(
            home,
            "add",
            "caldav",
            "wrong",
            "--url",
            srv.url + "/",
            "--username",
            "alice",
            "--password-stdin",
            stdin="nope\n",
        )
        code, out = run(home, "test", "wrong")
        assert code == 1 and "auth-failed: wrong:" in out and "Traceback" not in out
    run(
        home,
        "add",
        "imap",
        "gone",
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--security",
        "none",
        "--username",
        "a",
        "--password-stdin",
        stdin="pw\n",
    )
    code, out = run(home, "test", "gone")
    assert code == 1 and "account-unreachable: gone:" in out
    code, out = run(home, "test", "nobody")
    assert code == 1 and "unknown-account" in out


def test_every_account_failure_code_is_a_published_code() -> None:
    from chalie.accounts.failure import CODES, HINTS
    from chalie.errors import KNOWN_CODES

    assert set(CODES) <= KNOWN_CODES
    assert set(HINTS) == set(CODES)

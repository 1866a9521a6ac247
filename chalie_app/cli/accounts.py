"""``chalie accounts add | list | test | default | remove``: people's CalDAV, CardDAV, IMAP,
SMTP and ICS accounts.

The CLI writes ``chalie.db`` and the 0600 secrets file itself, so it works
with or without a daemon (the abilities read the accounts on every call). A
password is never taken on the command line, where any local process can
read it: it is prompted for (hidden), or read as one line from standard
input with ``--password-stdin``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from chalie.accounts.failure import AccountFailure
from chalie.accounts.spec import KINDS, SECURITIES, Account, AccountSpecError
from chalie.accounts.store import AccountStore
from chalie.net.loopback import is_loopback
from chalie_app.cli.daemon import fail
from chalie_app.cli.group import Ctx, cli


def _book(obj: Ctx) -> AccountStore:
    obj.layout.create()
    return AccountStore(obj.store, obj.home)


def _password(kind: str, from_stdin: bool, none: bool) -> str | None:
    if none or (kind == "ics" and not from_stdin):
        return None
    if from_stdin or not sys.stdin.isatty():
        line = sys.stdin.readline()
        return line.rstrip("\r\n") or None
    value: str = click.prompt(
        "password (or app password)", hide_input=True, default="", show_default=False
    )
    return value or None


@cli.group()
def accounts() -> None:
    """People's accounts: calendars (CalDAV, ICS), contacts (CardDAV), mail (IMAP, SMTP)."""


@accounts.command("add")
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("name")
@click.option("--url", default="", help="caldav, carddav, ics: the server's or feed's URL")
@click.option("--host", default="", help="imap, smtp: the server's host name")
@click.option("--port", default=0, type=int, help="imap, smtp (default: by --security)")
@click.option(
    "--security",
    type=click.Choice(SECURITIES),
    default="tls",
    show_default=True,
    help="imap, smtp: TLS from the start, STARTTLS, or none (plain text)",
)
@click.option("--username", default="", help="the login name on the server")
@click.option("--address", default="", help="imap, smtp: your address, e.g. 'Ann <ann@x.org>'")
@click.option("--password-stdin", is_flag=True, help="read the password as one line of stdin")
@click.option("--no-password", is_flag=True, help="the account needs none")
@click.option("--replace", is_flag=True, help="replace an account of this name")
@click.option("--default", "make_default", is_flag=True, help="make it the default of its kind")
@click.pass_obj
def accounts_add(
    obj: Ctx,
    kind: str,
    name: str,
    url: str,
    host: str,
    port: int,
    security: str,
    username: str,
    address: str,
    password_stdin: bool,
    no_password: bool,
    replace: bool,
    make_default: bool,
) -> None:
    """Add an account; the password goes to the 0600 secrets file, never to chalie.db."""
    book = _book(obj)
    try:
        account = Account(
            name=name,
            kind=kind,  # type: ignore[arg-type]
            url=url,
            host=host,
            port=port,
            security=security,  # type: ignore[arg-type]
            username=username,
            address=address,
        )
        stored = book.add(account, _password(kind, password_stdin, no_password), replace=replace)
        if make_default:
            stored = book.set_default(name)
    except AccountSpecError as exc:
        fail(str(exc))
    finally:
        book.close()
    if stored.security == "none" and stored.kind in ("imap", "smtp"):
        if not is_loopback(stored.host):
            click.echo(
                f"warning: {stored.name} talks to {stored.host} without TLS: the password "
                "crosses the network in plain text",
                err=True,
            )
    default = " (the default)" if stored.default else ""
    click.echo(f"added {stored.kind} account {stored.name}{default}; check it with "
               f"`chalie accounts test {stored.name}`")  # fmt: skip


@accounts.command("list")
@click.option("--json", "as_json", is_flag=True, help="print the accounts as JSON")
@click.pass_obj
def accounts_list(obj: Ctx, as_json: bool) -> None:
    """Every account (passwords are never shown, only whether one is stored)."""
    book = _book(obj)
    try:
        rows = [a.shown() for a in book.list()]
    finally:
        book.close()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no accounts (add one with `chalie accounts add KIND NAME ...`)")
        return
    for r in rows:
        where = r.get("url") or f"{r['host']}:{r['port']} ({r['security']})"
        mark = "*" if r["default"] else " "
        user = f" as {r['username']}" if r.get("username") else ""
        click.echo(f"{mark} {r['name']:<16} {r['kind']:<8} {where}{user}  password {r['password']}")


@accounts.command("test")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
@click.pass_obj
def accounts_test(obj: Ctx, name: str, as_json: bool) -> None:
    """Connect and log in; report what the account holds. Exit 1 with the error code if not."""
    from chalie.personal.probe import probe
    from chalie.personal.runtime import PersonalRuntime, settings_from

    book = _book(obj)
    try:
        account = book.get(name)
        if account is None:
            fail(f"unknown-account: no account is named {name}")
        rt = PersonalRuntime(book, settings_from(obj.config))
        try:
            report: dict[str, Any] = probe(rt, account)
        except AccountFailure as exc:
            fail(f"{exc.code}: {name}: {exc.message}")
    finally:
        book.close()
    if as_json:
        click.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    click.echo(f"{name}: ok ({account.kind})")
    for key, value in report.items():
        if key not in ("ok", "account", "kind"):
            click.echo(f"  {key}: {json.dumps(value, ensure_ascii=False)}")


@accounts.command("default")
@click.argument("name")
@click.pass_obj
def accounts_default(obj: Ctx, name: str) -> None:
    """Make NAME the default account of its kind."""
    book = _book(obj)
    try:
        account = book.set_default(name)
    except AccountSpecError as exc:
        fail(str(exc))
    finally:
        book.close()
    click.echo(f"{account.name} is the default {account.kind} account")


@accounts.command("remove")
@click.argument("name")
@click.pass_obj
def accounts_remove(obj: Ctx, name: str) -> None:
    """Remove an account and its password."""
    from chalie.personal.calstore import CalendarStore
    from chalie.process.home import personal_cache_file

    book = _book(obj)
    try:
        gone = book.remove(name)
    finally:
        book.close()
    cache = personal_cache_file(obj.config.home)
    if gone and cache.exists():  # what was synced from it goes too
        store = CalendarStore(cache)
        try:
            store.forget(name)
        finally:
            store.close()
    if not gone:
        fail(f"no account is named {name}")
    click.echo(f"removed {name}")

"""``chalie token create|list|revoke``: the bearer tokens of network clients.

These commands open ``chalie.db`` directly, whether or not a daemon runs:
the token store has no state but its table (SQLite in WAL mode serialises
the two processes), and the daemon reads the table at every check, so a
token created or revoked here takes effect at the next connection without
telling the daemon. The database is 0600 in the 0700 home, so whoever may
use the control socket may open it too: going through the daemon would add
no protection.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import TypeVar

import click
import msgspec

from chalie.gate.tokens import TokenError, TokenStore
from chalie.wire.principals import Scope
from chalie_app.cli.group import Ctx, cli

T = TypeVar("T")


def _store(obj: Ctx) -> TokenStore:
    return TokenStore(obj.store)


def _when(ts: float | None) -> str:
    return "-" if ts is None else dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


@cli.group()
def token() -> None:
    """Bearer tokens for the WebSocket chat and the inbound MCP server."""


@token.command("create")
@click.argument("name")
@click.option(
    "--owner",
    is_flag=True,
    help="A token for the person Chalie serves: chat clients, answering approvals.",
)
@click.option(
    "--gateway",
    is_flag=True,
    help="Let this agent call Chalie's tools directly ([mcp_server] gateway must be on).",
)
@click.pass_obj
def token_create(obj: Ctx, name: str, owner: bool, gateway: bool) -> None:
    """Create a token NAME and print its secret (shown this once only).

    Without a flag the token is an agent's (inbound MCP talk_to_chalie only).
    """
    if owner and gateway:
        raise click.ClickException("--owner and --gateway are two scopes; choose one")
    scope: Scope = "owner" if owner else "gateway" if gateway else "agent"
    try:
        with _store(obj) as store:
            secret = store.create(name, scope=scope)
    except TokenError as exc:
        raise click.ClickException(f"{exc} [{exc.code}]") from None
    click.echo(secret)
    click.echo(f"{scope} token {name!r} created; this is the only time it is shown.", err=True)


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the tokens as JSON.")
@click.pass_obj
def token_list(obj: Ctx, as_json: bool) -> None:
    """List tokens by name (never their secrets)."""
    with _store(obj) as store:
        infos = store.list()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": t.name,
                        "created": t.created,
                        "revoked": t.revoked,
                        "last_used": t.last_used,
                        "id": t.id,
                        "scope": t.scope,
                        "gateway": t.gateway,
                    }
                    for t in infos
                ]
            )
        )
        return
    if not infos:
        click.echo("no tokens")
        return
    click.echo(f"{'NAME':<24} {'ID':<20} {'SCOPE':<8} {'STATE':<8} {'CREATED':<17} LAST USED")
    for t in infos:
        state = "active" if t.active else "revoked"
        click.echo(
            f"{t.name:<24} {t.id:<20} {t.scope:<8} {state:<8} {_when(t.created):<17} "
            f"{_when(t.last_used)}"
        )


@token.command("exchanges")
@click.option("--conversation", help="Only this conversation's exchanges.")
@click.option(
    "--limit",
    type=click.IntRange(1, 2000),
    default=50,
    show_default=True,
    help="Show at most this many, newest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the exchanges as JSON.")
@click.pass_obj
def token_exchanges(obj: Ctx, conversation: str | None, limit: int, as_json: bool) -> None:
    """What agents asked Chalie with loop_in_human, and its answers, newest first
    (kept for the owner, whether or not anybody was connected; "new": no owner client
    has received it yet). A pending approval is answered with `chalie policy answer`."""
    from chalie.mcp_server.exchange import summary
    from chalie.mcp_server.kept import KeptExchanges

    book = KeptExchanges(obj.store)
    try:
        kept = book.recent(limit, conversation)
    finally:
        book.close()
    if as_json:
        click.echo(
            json.dumps(
                [{**msgspec.to_builtins(k.exchange), "seen": k.seen} for k in kept],
            )
        )
        return
    if not kept:
        click.echo("no agent exchanges kept")
        return
    for k in kept:
        ex = k.exchange
        click.echo(
            f"{_when(ex.ts)}  #{ex.kept:<5} {'' if k.seen else 'new '}"
            f"[{ex.conversation_id}] {summary(ex)}"
        )


@token.command("regenerate")
@click.argument("name")
@click.pass_obj
def token_regenerate(obj: Ctx, name: str) -> None:
    """A new secret for the token NAME in one step, printed once; the old one stops."""
    secret = _on_active(obj, name, lambda store: store.regenerate(name))
    click.echo(secret)
    click.echo(f"token {name!r} regenerated; the old secret no longer works.", err=True)


@token.command("revoke")
@click.argument("name")
@click.pass_obj
def token_revoke(obj: Ctx, name: str) -> None:
    """Revoke the token NAME: it stops working at the next connection."""
    _on_active(obj, name, lambda store: store.revoke(name))
    click.echo(f"token {name!r} revoked")


def _on_active(obj: Ctx, name: str, change: Callable[[TokenStore], T | None]) -> T:
    """``change``'s answer for the active token ``name``; one line and exit 1 when there
    is none (``change`` answered None or False) or the name is not one a token has."""
    try:
        with _store(obj) as store:
            done = change(store)
    except TokenError as exc:
        raise click.ClickException(f"{exc} [{exc.code}]") from None
    if done is None or done is False:
        raise click.ClickException(f"no active token named {name!r} [unknown-token]")
    return done

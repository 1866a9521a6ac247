"""``chalie store migrate``: copy this home's ``chalie.db`` into ``[store] url``'s PostgreSQL.

Run with no daemon on the home (the instance lock is taken). Every store module opens
its tables on both sides first (the SQLite file's brought up to date, PostgreSQL's made),
then :func:`chalie.store.store_copy.copy_store` copies them in one transaction and checks the
counts. The SQLite file is left as it was: remove ``[store] url`` to go back to it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from chalie_app.cli.daemon import fail
from chalie_app.cli.group import Ctx, cli


def open_every_store(place: Any, home: Path) -> None:
    """Open (and close) every durable store on ``place``, so each made or migrated its
    tables. The token store comes first: the MCP owners' migration reads it."""
    from actors.mcp.asks import Budget
    from chalie.accounts.store import AccountStore
    from chalie.calls.outbox import Outbox
    from chalie.calls.trail import Trail
    from chalie.conversation.compaction import SummaryStore
    from chalie.conversation.store import ConversationStore
    from chalie.discovery.learning import LearnedExamples
    from chalie.discovery.written import WrittenCache
    from chalie.gate.approvals import ApprovalStore
    from chalie.gate.policy import PolicyStore
    from chalie.gate.tokens import TokenStore
    from chalie.mcp.store import McpStore
    from chalie.mcp_server.kept import KeptExchanges
    from chalie.mcp_server.owners import ConversationOwners
    from chalie.memory.reflection import ReflectionLedger
    from chalie.memory.store import MemoryStore
    from chalie.schedule.store import ReminderStore

    stores: list[Any] = [
        TokenStore(place),
        PolicyStore(place),
        ApprovalStore(place),
        Trail(place),
        ConversationStore(place),
        SummaryStore(place),
        Outbox(place),
        McpStore(place),
        ConversationOwners(place),
        KeptExchanges(place),
        Budget(place),
        ReminderStore(place),
        MemoryStore(place),
        ReflectionLedger(place),
        LearnedExamples(place),
        WrittenCache(place),
        AccountStore(place, home),
    ]
    for store in stores:
        store.close()


@cli.group()
def store() -> None:
    """Where the durable state lives: chalie.db, or a PostgreSQL database ([store] url)."""


@store.command("migrate")
@click.option("--json", "as_json", is_flag=True, help="Print the tables copied as JSON.")
@click.pass_obj
def migrate(obj: Ctx, as_json: bool) -> None:
    """Copy this home's chalie.db into [store] url's (empty) PostgreSQL, then check the counts."""
    from chalie.process.daemon import AlreadyRunning, instance_lock
    from chalie.store.sql import open_connection
    from chalie.store.store_copy import CopyError, copy_store
    from chalie.store.store_place import Postgres

    cfg = obj.config
    target = obj.store
    source = cfg.layout.db
    if not isinstance(target, Postgres):
        fail("[store] url is not set in config.toml: there is no PostgreSQL to copy into")
    if not source.exists():
        fail(f"{source} does not exist: there is nothing to copy")
    try:
        with instance_lock(cfg.home):
            open_every_store(source, cfg.home)
            src, dst = open_connection(source), open_connection(target)
            try:
                if dst.tables():
                    fail(f"{target} has tables already: migrate copies into an empty database")
                open_every_store(target, cfg.home)
                seeded = {
                    t
                    for t in dst.tables()
                    if dst.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                }
                copied = copy_store(src, dst, seeded=seeded)
            except CopyError as exc:
                fail(str(exc))
            finally:
                src.close()
                dst.close()
    except AlreadyRunning as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps(dict(copied)))
        return
    for table, rows in copied:
        click.echo(f"{table:28s} {rows:8d} rows")
    click.echo(f"copied {sum(n for _, n in copied)} rows of {len(copied)} tables into {target}")

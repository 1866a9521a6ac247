"""``chalie reminders list | cancel``: through the daemon, or on chalie.db when none runs."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click
import msgspec

from chalie.process import control
from chalie_app.cli.daemon import ask_daemon, fail
from chalie_app.cli.group import Ctx, cli


def _offline_rows(obj: Ctx, pending_only: bool, limit: int) -> list[dict[str, Any]]:
    from chalie.schedule.store import ReminderStore

    store = ReminderStore(obj.store)
    try:
        return [
            msgspec.to_builtins(r) for r in store.listed(pending_only=pending_only, limit=limit)
        ]
    finally:
        store.close()


def _running(obj: Ctx) -> bool:
    try:
        obj.client.check()
    except control.DaemonNotRunning:
        return False
    return True


def _when(ts: float | None, zone_name: str) -> str:
    if ts is None:
        return "-"
    from chalie.schedule.rules import RuleError, zone

    try:
        tz: Any = zone(zone_name)
    except RuleError:
        tz = dt.UTC
    return dt.datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%d %H:%M %Z")


@cli.group()
def reminders() -> None:
    """Reminders: list, add and cancel them."""


@reminders.command("list")
@click.option("--all", "show_all", is_flag=True, help="Also the fired and cancelled ones.")
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000),
    default=100,
    show_default=True,
    help="At most this many.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def list_(obj: Ctx, show_all: bool, limit: int, as_json: bool) -> None:
    """Reminders by their next time (the next firing of a recurring one)."""
    if _running(obj):
        rows = ask_daemon(obj, "reminders.list", {"all": show_all, "limit": limit})
    else:
        rows = _offline_rows(obj, not show_all, limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if not rows:
        click.echo("no reminders", err=True)
    for r in rows:
        late = " late" if r.get("last_late") else ""
        click.echo(
            f"{r['id']:>6}  {_when(r['next_fire'], r['zone']):<24} {r['state']:<9} "
            f"{r['kind']} {r['rule']}  {r['text']}  (fired {r['fired']}{late})"
        )


@reminders.command("add")
@click.argument("text")
@click.option(
    "--at", "at", default=None, help="An ISO date-time (in --zone unless it has an offset)."
)
@click.option("--after", "after", default=None, help="A delay: 90, 45s, 10m, 1h30m, 2d.")
@click.option("--every", "every", default=None, help="An RRULE or a five-field cron rule.")
@click.option("--zone", default="UTC", show_default=True, help="IANA time zone.")
@click.pass_obj
def add(
    obj: Ctx, text: str, at: str | None, after: str | None, every: str | None, zone: str
) -> None:
    """Set a reminder for yourself (the daemon must run)."""
    given = [(k, v) for k, v in (("at", at), ("after", after), ("every", every)) if v]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --at, --after or --every")
    kind, rule = given[0]
    row = ask_daemon(obj, "reminders.add", {"text": text, "kind": kind, "rule": rule, "zone": zone})
    click.echo(f"reminder {row['id']} at {_when(row['next_fire'], row['zone'])}")


@reminders.command("cancel")
@click.argument("reminder_id", type=click.IntRange(1))
@click.pass_obj
def cancel(obj: Ctx, reminder_id: int) -> None:
    """Cancel a pending reminder (a recurring one stops for good)."""
    if _running(obj):
        ask_daemon(obj, "reminders.cancel", {"id": reminder_id})
    else:
        from chalie.schedule.store import ReminderStore

        store = ReminderStore(obj.store)
        try:
            if not store.cancel(reminder_id):
                fail(f"reminder-not-found: no pending reminder {reminder_id}")
        finally:
            store.close()
    click.echo(f"cancelled reminder {reminder_id}")

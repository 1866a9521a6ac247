"""``chalie trail``: recent tool calls from the daemon's action trail, filterable."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import click

from chalie.gate.display import NAME_CHARS, PARAMS_CHARS, one_line
from chalie.wire.messages import TRAIL_FILTERS
from chalie_app.cli.daemon import ask_daemon
from chalie_app.cli.group import Ctx, cli


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _took(row: dict[str, Any]) -> str:
    # An interrupted call's end is when the next daemon found it, not when it stopped.
    if row.get("ended_at") is None or row.get("status") == "interrupted":
        return "-"
    ms = (row["ended_at"] - row["started_at"]) * 1000
    return f"{ms:.0f}ms" if ms < 10_000 else f"{ms / 1000:.1f}s"


@cli.command("trail")
@click.option("--tool", help="Only calls to this tool.")
@click.option(
    "--status",
    type=click.Choice(tuple(TRAIL_FILTERS)),
    help="Only calls with this outcome (cancelled: the calls that were cancelled).",
)
@click.option("--conversation", help="Only calls from this conversation id.")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=20,
    show_default=True,
    help="At most this many rows.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON, newest first.")
@click.pass_obj
def trail_command(
    obj: Ctx,
    tool: str | None,
    status: str | None,
    conversation: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Show recent tool calls, newest first, from the running daemon."""
    args: dict[str, Any] = {"limit": limit}
    stored, code = TRAIL_FILTERS[status] if status is not None else (None, None)
    for key, value in (
        ("tool", tool),
        ("status", stored),
        ("code", code),
        ("conversation", conversation),
    ):
        if value is not None:
            args[key] = value
    rows: list[dict[str, Any]] = ask_daemon(obj, "trail", args)
    if as_json:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if not rows:
        click.echo("no calls recorded" + (" matching the filters" if len(args) > 1 else ""))
        return
    for row in rows:
        outcome = row["status"] + (f" ({row['code']})" if row.get("code") else "")
        gate = row.get("decision") or "-"
        if row.get("decided_by"):
            gate += f" by {row['decided_by']}"
        click.echo(
            f"{_when(row['started_at'])}  {row['tool']:<16} {outcome:<28} {_took(row):>7}  "
            f"gate {gate:<16} {row['channel']:<10} {one_line(row['conversation_id'], NAME_CHARS)}"
            f"  {row['call_id']}"
        )
        from chalie.mcp.provenance import suffix

        where = suffix(obj.home, row["tool"])  # a remote MCP tool names its server
        click.echo(
            f"    params {one_line(row['params'], PARAMS_CHARS)}{where}"
            + (f"  — {one_line(row['act_summary'])}" if row.get("act_summary") else "")
        )
        if row.get("healed"):
            click.echo(f"    healed {one_line(row['healed'], PARAMS_CHARS)}")

"""``chalie ask`` (one turn without a human) and ``chalie conversations list | show | delete``."""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import Any

import click

from chalie_app.cli.daemon import EXIT_ERROR_REPLY, ask_daemon, call_daemon
from chalie_app.cli.group import Ctx, cli

# How long past the turn's own timeout the CLI waits for the daemon's reply.
REPLY_GRACE = 10.0


@cli.command("ask")
@click.argument("text", required=False)
@click.option(
    "--channel",
    default="subconscious",
    show_default=True,
    help="A channel without a human (permission asks become denials).",
)
@click.option(
    "--conversation",
    "conversation_id",
    default=None,
    help="Continue this conversation (default: a new one).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(1, 3600),
    default=600.0,
    show_default=True,
    help="Seconds to wait for the turn to end.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the whole reply as JSON.")
@click.pass_obj
def ask(
    obj: Ctx,
    text: str | None,
    channel: str,
    conversation_id: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Run one turn of TEXT (or standard input) through the daemon and print the answer."""
    if text is None:
        if sys.stdin.isatty():
            raise click.UsageError("give TEXT or pipe it on standard input")
        text = sys.stdin.read()
    if not text.strip():
        raise click.UsageError("the text is empty")
    args: dict[str, Any] = {"text": text, "channel": channel, "timeout": timeout}
    if conversation_id:
        args["conversation_id"] = conversation_id
    if as_json:
        # Whatever the turn gave, its conversation id included, on a timeout too.
        reply = call_daemon(obj, "ask", args, timeout=timeout + REPLY_GRACE)
        if not reply.ok:
            payload = {"ok": False, "code": reply.error, **(reply.data or {})}
            click.echo(json.dumps(payload, indent=2, ensure_ascii=False))
            sys.exit(EXIT_ERROR_REPLY)
        data = reply.data
    else:
        data = ask_daemon(obj, "ask", args, timeout=timeout + REPLY_GRACE)
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        click.echo(data.get("text", ""))
        click.echo(f"conversation {data['conversation_id']}", err=True)
    if data.get("reason") != "final":
        click.echo(f"the turn ended: {data.get('reason')}", err=True)
        sys.exit(1)


@cli.group()
def conversations() -> None:
    """Stored conversations."""


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


@conversations.command("list")
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000),
    default=50,
    show_default=True,
    help="At most this many, the most recent first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the conversations as JSON.")
@click.pass_obj
def conversations_list(obj: Ctx, limit: int, as_json: bool) -> None:
    """The most recently active conversations first."""
    rows = ask_daemon(obj, "conversations.list", {"limit": limit})
    if as_json:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if not rows:
        click.echo("no conversations")
        return
    for r in rows:
        click.echo(
            f"{r['id']}  {r['channel']:<14} {_when(r['updated'])}  {r['messages']:>4} msgs  "
            f"{r['title']}"
        )


@conversations.command("show")
@click.argument("conversation_id")
@click.option("--json", "as_json", is_flag=True, help="Print the conversation as JSON.")
@click.pass_obj
def conversations_show(obj: Ctx, conversation_id: str, as_json: bool) -> None:
    """A conversation's history and turns."""
    data = ask_daemon(obj, "conversations.show", {"conversation_id": conversation_id})
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    info = data["info"]
    click.echo(f"{info['id']} on {info['channel']}, started {_when(info['created'])}")
    for m in data["messages"]:
        role = m["role"]
        if role == "assistant" and m.get("tool_calls"):
            for call in m["tool_calls"]:
                args = call.get("arguments")
                shown = (
                    json.dumps(args, ensure_ascii=False) if args is not None else call.get("raw")
                )
                click.echo(f"  tool call  {call['name']} {shown}"[:300])
        if m.get("text"):
            label = {"tool": f"result of {m.get('tool')}", "background": "background"}.get(
                role, role
            )
            text = " ".join(m["text"].split())
            click.echo(f"  {label:<10} {text}"[:300])
    for t in data["turns"]:
        click.echo(
            f"  turn {t['turn_id']}: {t['state']} {t.get('reason') or ''} "
            f"steps={t['steps']} tokens={t['tokens']} {'; '.join(t['notes'])}"
        )


@conversations.command("delete")
@click.argument("conversation_id")
@click.pass_obj
def conversations_delete(obj: Ctx, conversation_id: str) -> None:
    """Delete a conversation, its history and its events."""
    ask_daemon(obj, "conversations.delete", {"conversation_id": conversation_id})
    click.echo(f"deleted {conversation_id}")

"""``chalie policy list | set | reset | answer``: the permission table and pending requests."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import click

from chalie.gate.display import NAME_CHARS, one_line
from chalie.wire.messages import ANSWER_WORDS, CHANNELS
from chalie_app.cli.daemon import ask_daemon
from chalie_app.cli.group import Ctx, cli

ANSWERS = ANSWER_WORDS


def _provenance(obj: Ctx, permission: str) -> str:
    """Where a remote MCP proxy comes from (``  [remote tool 'x' on MCP server s]``)."""
    from chalie.mcp.provenance import suffix

    return suffix(obj.home, permission)


@cli.group()
def policy() -> None:
    """The permission gate's table: (channel, permission) -> allow | ask | deny."""


@policy.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print rules and pending requests as JSON.")
@click.pass_obj
def policy_list(obj: Ctx, as_json: bool) -> None:
    """Show every rule (set by you, or seen by the gate) and the requests awaiting an answer."""
    data: dict[str, Any] = ask_daemon(obj, "policy.list")
    if as_json:
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    rules = data.get("rules") or []
    if rules:
        click.echo("rules:")
        for r in rules:
            when = dt.datetime.fromtimestamp(r["updated_at"]).strftime("%Y-%m-%d %H:%M")
            origin = "" if r.get("origin", "set") == "set" else f"  ({r['origin']}, not configured)"
            origin += _provenance(obj, r["permission"])
            click.echo(
                f"  {r['channel']:<15} {r['permission']:<32} {r['decision']:<6} {when}{origin}"
            )
    else:
        click.echo("rules: none (every permission is ask until you set it)")
    pending = data.get("pending") or []
    if pending:
        click.echo("pending requests:")
        now = time.time()
        for p in pending:
            left = max(0, int(p["expires_at"] - now))
            click.echo(
                f"  {p['request_id']}  {p['channel']} {one_line(p['permission'], NAME_CHARS)}  "
                f"conversation {one_line(p['conversation_id'], NAME_CHARS)}  expires in {left}s"
                + (f"  — {one_line(p['act_summary'])}" if p.get("act_summary") else "")
            )
    else:
        click.echo("pending requests: none")


@policy.command("pending")
@click.option("--json", "as_json", is_flag=True, help="Print the requests as JSON.")
@click.pass_obj
def policy_pending(obj: Ctx, as_json: bool) -> None:
    """The permission requests awaiting your answer (kept across restarts), with their prompts."""
    pending: list[dict[str, Any]] = ask_daemon(obj, "policy.pending")
    if as_json:
        click.echo(json.dumps(pending, indent=2, ensure_ascii=False))
        return
    if not pending:
        click.echo("no pending requests")
        return
    now = time.time()
    for p in pending:
        left = max(0, int(p["expires_at"] - now))
        click.echo(
            f"{p['request_id']}  {p['channel']} {one_line(p['permission'], NAME_CHARS)}  "
            f"conversation {one_line(p['conversation_id'], NAME_CHARS)}  expires in {left}s"
        )
        for line in str(p.get("prompt") or "").splitlines():
            click.echo(f"    {line}")  # each line escaped and capped by the gate
        if p.get("form") is not None:
            click.echo("    a form: answer with --content '{\"field\": ...}' (or deny)")
    click.echo("answer with: chalie policy answer REQUEST_ID once|always|deny [--content JSON]")


@policy.command("set")
@click.argument("channel", type=click.Choice(CHANNELS))
@click.argument("permission")
@click.argument("decision", type=click.Choice(("allow", "ask", "deny")))
@click.pass_obj
def policy_set(obj: Ctx, channel: str, permission: str, decision: str) -> None:
    """Set PERMISSION (tool or tool.action) on CHANNEL to DECISION."""
    ask_daemon(
        obj, "policy.set", {"channel": channel, "permission": permission, "decision": decision}
    )
    click.echo(f"{channel} {permission} -> {decision}")


@policy.command("reset")
@click.option("--channel", type=click.Choice(CHANNELS), help="Only rules on this channel.")
@click.option("--permission", help="Only rules for this permission.")
@click.pass_obj
def policy_reset(obj: Ctx, channel: str | None, permission: str | None) -> None:
    """Remove rules (all of them, or those matching the filters); they become ask again."""
    args = {k: v for k, v in (("channel", channel), ("permission", permission)) if v is not None}
    data = ask_daemon(obj, "policy.reset", args)
    click.echo(f"removed {data['removed']} rule(s)")


@policy.command("answer")
@click.argument("request_id")
@click.argument("answer", type=click.Choice(tuple(ANSWERS)))
@click.option(
    "--content", help="A request with a form: a JSON object of its fields (checked against it)."
)
@click.pass_obj
def policy_answer(obj: Ctx, request_id: str, answer: str, content: str | None) -> None:
    """Answer a pending permission request (see `chalie policy pending`)."""
    args: dict[str, Any] = {"request_id": request_id, "answer": ANSWERS[answer]}
    if content is not None:
        try:
            args["content"] = json.loads(content)
        except ValueError as exc:
            raise click.UsageError(f"--content is not JSON ({str(exc)[:80]})") from None
    ask_daemon(obj, "policy.answer", args)
    click.echo(f"{request_id}: {ANSWERS[answer]}")

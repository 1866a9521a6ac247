"""``chalie tools ...``: the registered abilities and their descriptors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from chalie.cli import Ctx, cli
from chalie.registry import DuplicateAbilityError, Registry


def load_registry(ctx: Ctx) -> Registry:
    try:
        return Registry.collect(dropin=ctx.config.abilities_dir)
    except DuplicateAbilityError as exc:
        raise click.ClickException(str(exc)) from None


@cli.group()
def tools() -> None:
    """Registered abilities."""


@tools.command("list")
@click.option(
    "--json", "as_json", is_flag=True, help="Print descriptors exactly as the model sees them."
)
@click.option(
    "--async-channel", is_flag=True, help="Assemble as for a channel that allows async calls."
)
@click.pass_obj
def tools_list(obj: Ctx, as_json: bool, async_channel: bool) -> None:
    """List the registered abilities."""
    reg = load_registry(obj)
    if as_json:
        descriptors = reg.descriptors(allow_async=async_channel)
        click.echo(json.dumps(descriptors, indent=2, ensure_ascii=False))
    else:
        width = max((len(n) for n in reg.names()), default=4)
        for entry in reg:
            flags = []
            if entry.cls.internal:
                flags.append("internal")
            if not entry.cls.discoverable:
                flags.append("hidden")
            if entry.cls.isolation == "process":
                flags.append("process")
            tail = f"  [{', '.join(flags)}]" if flags else ""
            click.echo(f"{entry.name:<{width}}  {entry.cls.tooltip}{tail}")
    for failure in reg.failures:
        click.echo(f"warning: could not load {failure.path}: {failure.error}", err=True)


# -- chalie tools call: a real call through the running daemon ----------------------------

PROMPT_ANSWERS = {"o": "allow_once", "a": "allow_always", "d": "deny"}


def parse_pairs(pairs: tuple[str, ...]) -> dict[str, object]:
    """``key=value`` pairs; a value that parses as JSON is that JSON, else the string."""
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="PARAMS")
        if key in out:
            raise click.BadParameter(f"{key!r} is given twice", param_hint="PARAMS")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def _prompt(request: dict[str, object], home: Path | None = None) -> str:
    from chalie.mcp.provenance import suffix

    params = json.dumps(request.get("params") or {}, ensure_ascii=False)
    where = suffix(home, str(request["permission"])) if home is not None else ""
    click.echo(
        f"permission requested: {request['permission']} on {request['channel']}{where}", err=True
    )
    if request.get("act_summary"):
        click.echo(f"  {request['act_summary']}", err=True)
    click.echo(f"  params {params}", err=True)
    try:
        choice = click.prompt(
            "allow [o]nce, [a]lways, or [d]eny?",
            type=click.Choice(tuple(PROMPT_ANSWERS)),
            err=True,
        )
    except click.Abort:
        click.echo("no answer; denying", err=True)  # fail closed: no human, no allow
        return "deny"
    return PROMPT_ANSWERS[str(choice)]


@tools.command("call")
@click.argument("name")
@click.argument("params", nargs=-1)
@click.option("--conversation", help="Conversation id to call in (default: a fresh one).")
@click.pass_obj
def tools_call(obj: Ctx, name: str, params: tuple[str, ...], conversation: str | None) -> None:
    """Call NAME through the daemon's dispatcher on the chat channel, with key=value PARAMS.

    When the permission gate asks, answer in the terminal. Prints the envelope;
    exits non-zero when it is an error envelope.
    """
    from chalie.cli.daemon import ask_daemon

    arguments = parse_pairs(params)
    arguments.setdefault("act_summary", f"{name} called from the chalie CLI")
    args: dict[str, object] = {"tool": name, "arguments": arguments}
    if conversation:
        args["conversation_id"] = conversation
    started = ask_daemon(obj, "tools.call", args)
    call_id = started["call_id"]
    try:
        outcome = _follow(obj, call_id)
    except KeyboardInterrupt:
        # Ctrl-C while waiting: the call must not run on without anyone to see it.
        ask_daemon(obj, "tools.cancel", {"call_id": call_id})
        click.echo(f"chalie: call {call_id} cancelled", err=True)
        raise SystemExit(130) from None
    click.echo(outcome["envelope"])
    if outcome["status"] != "success":
        raise SystemExit(1)


def _follow(obj: Ctx, call_id: str) -> dict[str, Any]:
    """Poll a call until it ends, answering each permission request in the terminal."""
    from chalie import control
    from chalie.cli.daemon import _client, ask_daemon, fail

    while True:
        news = ask_daemon(obj, "tools.poll", {"call_id": call_id, "wait": 2.0})
        for request in news.get("permission_requests", []):
            answer = _prompt(request, obj.config.home)
            sent = {"request_id": request["request_id"], "answer": answer}
            try:
                reply = _client(obj.config.home).call("policy.answer", sent)
            except control.DaemonNotRunning as exc:
                fail(str(exc))
            if reply.error == control.NOT_FOUND:
                # Answered from another terminal (policy answer) or expired meanwhile.
                click.echo("that request was already answered or has expired", err=True)
            elif not reply.ok:
                fail(f"{reply.error}: {reply.data.get('message', '') if reply.data else ''}")
        if news["state"] == "done":
            outcome: dict[str, Any] = news["outcome"]
            return outcome

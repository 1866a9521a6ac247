"""``chalie tools ...``: the registered abilities and their descriptors."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from chalie.calls.typed_text import MAX_VALUE_DEPTH as MAX_VALUE_DEPTH  # the one rule's limit
from chalie.wire.tool_names import FRAMEWORK_FIELDS
from chalie_app.cli.group import Ctx, cli

if TYPE_CHECKING:
    from chalie.calls.registry import Registry


def progress_line(progress: dict[str, Any]) -> str:
    """A remote tool's progress as one line for the terminal."""
    done, total = progress.get("progress"), progress.get("total")
    shown = f"{done:g}/{total:g}" if isinstance(total, int | float) else f"{done}"
    message = str(progress.get("message") or "")[:200]
    return f"{progress.get('tool', '')}: {shown}" + (f" {message}" if message else "")


def load_registry(ctx: Ctx) -> Registry:
    """The catalogue the daemon serves: built-in and drop-in abilities, and the proxies of
    every cached remote MCP tool (as the daemon registers them before it connects).

    Imports every ability (and what each needs): for ``tools list``, never for a call."""
    from chalie.calls.registry import DuplicateAbilityError, Registry
    from chalie.mcp.proxy import install_cached

    try:
        registry = Registry.collect(dropin=ctx.config.abilities_dir)
    except DuplicateAbilityError as exc:
        raise click.ClickException(str(exc)) from None
    config = ctx.config
    install_cached(registry, config.store_place, config.mcp.call_timeout)
    return registry


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


def parse_pairs(pairs: tuple[str, ...], schema: dict[str, Any] | None = None) -> dict[str, object]:
    """``key=value`` pairs, each value as :mod:`chalie.calls.typed_text` reads typed text: JSON
    when it parses, else the string; where the parameter takes a string and not the
    JSON's type, the text as typed."""
    from chalie.calls.typed_text import TypedTextError, typed

    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="PARAMS")
        if key in out:
            raise click.BadParameter(f"{key!r} is given twice", param_hint="PARAMS")
        if key in FRAMEWORK_FIELDS and key != "async":
            out[key] = raw
            continue
        try:
            out[key] = typed(schema, key, raw)
        except TypedTextError as exc:
            raise click.BadParameter(str(exc), param_hint="PARAMS") from None
    return out


def _schema_of(obj: Ctx, name: str) -> dict[str, Any] | None:
    """The tool's input schema from the daemon's catalogue (the one the call runs against);
    None when the daemon knows no such tool (the call then says so) or is not running (the
    pairs are still checked, so a malformed one is a usage error before "no daemon")."""
    from chalie.process import control

    try:
        reply = obj.client.call("tools.schema", {"tool": name})
    except control.DaemonNotRunning:
        return None
    if not reply.ok or not isinstance(reply.data, dict):
        return None
    schema = reply.data.get("input_schema")
    return schema if isinstance(schema, dict) else None


@tools.command("call")
@click.argument("name")
@click.argument("params", nargs=-1)
@click.option("--conversation", help="Conversation id to call in (default: a fresh one).")
@click.pass_obj
def tools_call(obj: Ctx, name: str, params: tuple[str, ...], conversation: str | None) -> None:
    """Call NAME through the daemon's dispatcher on the chat channel, with key=value PARAMS.

    A value is JSON (42, true, [1,2], {"a":1}) unless the tool's parameter is a
    string, which keeps the text as typed. When the permission gate asks,
    answer in the terminal; an answer given elsewhere (`chalie policy
    answer`) ends the prompt. Prints the envelope; exits non-zero when it is
    an error envelope.
    """
    from chalie_app.cli.daemon import ask_daemon

    arguments = parse_pairs(params, _schema_of(obj, name) if params else None)
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
    from chalie.process import control
    from chalie_app.cli.daemon import ask_daemon, fail
    from chalie_app.cli.prompt import ApprovalPrompt

    def still_pending(request_id: str) -> bool:
        pending = ask_daemon(obj, "policy.pending")
        return any(p.get("request_id") == request_id for p in pending or [])

    prompt = ApprovalPrompt(still_pending)
    while True:
        news = ask_daemon(obj, "tools.poll", {"call_id": call_id, "wait": 2.0})
        progress = news.get("progress")
        if isinstance(progress, dict):
            click.echo(f"chalie: {progress_line(progress)}", err=True)
        for request in news.get("permission_requests", []):
            from chalie.mcp.provenance import suffix  # a remote tool names its server

            where = suffix(obj.home, str(request.get("permission", "")))
            answer = prompt.ask({**request, "provenance": where.strip(" []")} if where else request)
            if answer is None:
                click.echo("chalie: that request was answered elsewhere", err=True)
                continue
            sent = {"request_id": request["request_id"], "answer": answer}
            try:
                reply = obj.client.call("policy.answer", sent)
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

"""``chalie memory list|search|show|forget|promote|export|import`` and ``chalie skills rules``.

With a daemon running the commands go through its control socket (its book
and indexes); without one the command opens the book itself, holding the
data directory's lock so no daemon starts meanwhile. Export and import are
JSONL: one memory a line.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import click
import msgspec

from chalie.process import control
from chalie.process.routing import Router
from chalie.wire.messages import ControlReply
from chalie_app.cli.daemon import EXIT_ERROR_REPLY, ask_daemon, fail
from chalie_app.cli.group import Ctx, cli

MAX_LINE = 64 * 1024


@contextmanager
def _offline(obj: Ctx) -> Iterator[Router]:
    from chalie.discovery.embedder import load_embedder
    from chalie.memory.book import MemoryBook
    from chalie.memory.commands import MemoryCommands
    from chalie.memory.store import MemoryStore
    from chalie.process.daemon import AlreadyRunning, instance_lock
    from chalie.process.home import memory_index_dir

    cfg = obj.config
    cfg.layout.create()
    try:
        with instance_lock(cfg.home):
            store = MemoryStore(cfg.store_place)
            book = MemoryBook(
                store, load_embedder(cfg.embedder.options()), memory_index_dir(cfg.home)
            )
            try:
                yield Router(MemoryCommands(book).routes())
            finally:
                book.close()
                store.close()
    except AlreadyRunning as exc:
        fail(str(exc))


def run(obj: Ctx, command: str, args: dict[str, Any], *, timeout: float = 60.0) -> Any:
    """The daemon's answer, or (no daemon) the same command run here."""
    try:
        obj.client.check()
    except control.DaemonNotRunning:
        with _offline(obj) as router:
            parsed = router.parse(control.encode_request(command, args))
            if isinstance(parsed, ControlReply):
                reply = parsed
            else:
                reply = router.run(*parsed)
        if not reply.ok:
            message = reply.data.get("message", "") if isinstance(reply.data, dict) else ""
            fail(f"{reply.error}: {message}" if message else str(reply.error), EXIT_ERROR_REPLY)
        return reply.data
    return ask_daemon(obj, command, args, timeout=timeout)


def _line(m: dict[str, Any]) -> str:
    when = dt.datetime.fromtimestamp(float(m.get("updated", 0))).strftime("%Y-%m-%d %H:%M")
    extra = []
    for key in ("place", "time", "skill"):
        if m.get(key):
            extra.append(f"{key}={m[key]}")
    if m.get("people"):
        extra.append("people=" + ",".join(m["people"]))
    if m.get("untrusted"):
        extra.append("UNTRUSTED-SOURCE=" + ",".join(m["untrusted"]))
    who = "" if m.get("principal") == "owner" else f" [{m.get('principal')}]"
    tail = f"  ({'; '.join(extra)})" if extra else ""
    return f"{m['id']:>6}  {when}  {m['kind']:<11} {m['text']}{who}{tail}"


@cli.group()
def memory() -> None:
    """What Chalie remembers (the owner's memories, and each agent's apart)."""


@memory.command("list")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=20,
    show_default=True,
    help="At most this many.",
)
@click.option(
    "--scope",
    type=click.Choice(["owner", "agents", "all"]),
    default="all",
    help="Whose memories: the owner's, the agents', or all.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def list_(obj: Ctx, limit: int, scope: str, as_json: bool) -> None:
    """The most recent memories, newest first."""
    rows = run(obj, "memory.list", {"limit": limit, "scope": scope})
    _show(rows, as_json)


@memory.command("search")
@click.argument("query", required=False)
@click.option("--location", default=None, help="Only memories about this place.")
@click.option(
    "--limit", type=click.IntRange(1, 50), default=10, show_default=True, help="At most this many."
)
@click.option("--agent", default=None, help="Search this agent token's memories instead.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def search(
    obj: Ctx, query: str | None, location: str | None, limit: int, agent: str | None, as_json: bool
) -> None:
    """Recall memories as the model does (meaning and words, fused)."""
    args: dict[str, Any] = {"limit": limit, "principal": f"agent:{agent}" if agent else "owner"}
    if query:
        args["query"] = query
    if location:
        args["location"] = location
    _show(run(obj, "memory.search", args), as_json)


@memory.command("show")
@click.argument("memory_id", type=click.IntRange(1))
@click.pass_obj
def show(obj: Ctx, memory_id: int) -> None:
    """One memory with its provenance."""
    click.echo(json.dumps(run(obj, "memory.show", {"id": memory_id}), indent=2, ensure_ascii=False))


@memory.command("forget")
@click.argument("memory_id", type=click.IntRange(1))
@click.pass_obj
def forget(obj: Ctx, memory_id: int) -> None:
    """Forget a memory (and any skill rule it is): restorable for 30 days, then gone."""
    run(obj, "memory.forget", {"id": memory_id})
    click.echo(f"forgot memory {memory_id} (chalie memory restore {memory_id} brings it back)")


@memory.command("forgotten")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=20,
    show_default=True,
    help="How many to show, the latest forgotten first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def forgotten(obj: Ctx, limit: int, as_json: bool) -> None:
    """The forgotten memories still restorable, the latest forgotten first."""
    _show(run(obj, "memory.forgotten", {"limit": limit}), as_json)


@memory.command("restore")
@click.argument("memory_id", type=click.IntRange(1))
@click.pass_obj
def restore(obj: Ctx, memory_id: int) -> None:
    """Bring a forgotten memory back, with its id."""
    run(obj, "memory.restore", {"id": memory_id})
    click.echo(f"restored memory {memory_id}")


@memory.command("promote")
@click.argument("memory_id", type=click.IntRange(1))
@click.pass_obj
def promote(obj: Ctx, memory_id: int) -> None:
    """Make an agent's memory yours (then it is recalled into your turns)."""
    row = run(obj, "memory.promote", {"id": memory_id})
    click.echo(f"memory {row['id']} is now the owner's")


@memory.command("export")
@click.argument("target", type=click.File("w", encoding="utf-8"), default="-")
@click.option(
    "--scope",
    type=click.Choice(["owner", "agents", "all"]),
    default="all",
    help="Whose memories: the owner's, the agents', or all.",
)
@click.pass_obj
def export(obj: Ctx, target: IO[str], scope: str) -> None:
    """Write every memory as JSONL (one object a line) to TARGET (default: stdout)."""
    rows = run(obj, "memory.export", {"scope": scope}, timeout=600.0)
    for row in rows:
        target.write(json.dumps(row, ensure_ascii=False) + "\n")
    click.echo(f"exported {len(rows)} memories", err=True)


@memory.command("import")
@click.argument("source", type=click.File("r", encoding="utf-8"), default="-")
@click.pass_obj
def import_(obj: Ctx, source: IO[str]) -> None:
    """Store the memories of a JSONL file (near-duplicates merge; bad lines are counted)."""
    rows: list[Any] = []
    unreadable = 0
    for raw in source:
        if not raw.strip():
            continue
        if len(raw) > MAX_LINE:
            unreadable += 1
            continue
        try:
            rows.append(msgspec.json.decode(raw))
        except msgspec.DecodeError:
            unreadable += 1
    result = run(obj, "memory.import", {"rows": rows}, timeout=3600.0)
    result["rejected"] = result.get("rejected", 0) + unreadable
    click.echo(
        f"stored {result['stored']}, merged {result['merged']}, rejected {result['rejected']}"
    )


def _show(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if not rows:
        click.echo("no memories", err=True)
    for m in rows:
        click.echo(_line(m))


@cli.group()
def skills() -> None:
    """Skill playbooks and the personalisation rules learnt for them."""


@skills.command("rules")
@click.argument("skill", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def rules(obj: Ctx, skill: str | None, as_json: bool) -> None:
    """The rules find_skills returns beside each playbook (memories linked to a skill)."""
    rows = run(obj, "skills.rules", {"skill": skill} if skill else {})
    if as_json:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if not rows:
        click.echo("no rules", err=True)
    for r in rows:
        click.echo(f"{r['skill']}: {r['rule']}  (memory {r['id']})")
    sys.stdout.flush()

"""``chalie index rebuild`` and ``chalie tools find``: the discovery index from the command line.

``tools find`` works on ``<home>/index`` directly, with no daemon: it runs the
real find_tools ability over the persisted index when it is current, and over a
fresh in-memory index (with a warning) when it is stale, so it never replaces
an index a running daemon serves. ``index rebuild`` asks a running daemon to
rebuild (the ``index.rebuild`` control command, polled for progress), and
otherwise rebuilds here while holding the daemon's lock, so no daemon starts
on a half-replaced index and none has its index deleted under it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any, Final

import click

from chalie.process import control
from chalie_app.cli.group import Ctx, cli
from chalie_app.cli.tools import load_registry, tools

if TYPE_CHECKING:
    from chalie.discovery.embedder import Embedder

REBUILD_POLL_SECONDS: Final = 0.25


def _embedder(obj: Ctx) -> Embedder:
    from chalie.discovery.embedder import EmbedderError, load_embedder

    try:
        return load_embedder(obj.config.embedder.options())
    except EmbedderError as exc:
        raise click.ClickException(f"embedder: {exc}") from None


@cli.group()
def index() -> None:
    """The discovery index (tools and skills)."""


@index.command("rebuild")
@click.option(
    "--reuse",
    is_flag=True,
    help="Keep the vectors of tools whose text is unchanged (default: embed everything anew).",
)
@click.pass_obj
def index_rebuild(obj: Ctx, reuse: bool) -> None:
    """Rebuild the tool and skill indexes from the registry and the skill folders.

    With a daemon running, the daemon rebuilds (and serves the new index at
    once); this command shows its progress. Without one, it rebuilds here.
    """
    home = obj.home
    if control.read_pid(home) is not None and control.socket_path(home).exists():
        _rebuild_in_daemon(obj, reuse)
        return
    from chalie.process.daemon import AlreadyRunning, instance_lock

    try:
        with instance_lock(home):
            _rebuild_here(obj, reuse)
    except AlreadyRunning:
        raise click.ClickException(
            f"a daemon holds the lock on {home} but does not answer yet; "
            "run this again once `chalie status` answers (it will rebuild in the daemon)"
        ) from None


def _rebuild_in_daemon(obj: Ctx, reuse: bool) -> None:
    from chalie_app.cli.daemon import ask_daemon

    reply = ask_daemon(obj, "index.rebuild", {"start": True, "reuse": reuse})
    job = reply["job"]
    if not reply["job"]["started"]:
        click.echo(f"a rebuild already runs in the daemon (job {job['job_id']}); following it")
    with click.progressbar(length=max(job["total"], 1), label="tools ", show_pos=True) as bar:
        shown = 0
        while job["phase"] == "running":
            time.sleep(REBUILD_POLL_SECONDS)
            reply = ask_daemon(obj, "index.rebuild", {"start": False})
            if reply["job"] is None or reply["job"]["job_id"] != job["job_id"]:
                raise click.ClickException("the daemon lost track of the rebuild (restarted?)")
            job = reply["job"]
            if job["total"] and bar.length != job["total"]:
                bar.length = job["total"]
            bar.update(job["done"] - shown)
            shown = job["done"]
    if job["phase"] == "failed":
        raise click.ClickException(f"index rebuild failed in the daemon: {job['error']}")
    index = reply["index"]
    click.echo(
        f"the daemon indexed {job['tools']} tools and {job['skills']} skills with "
        f"{index.get('model_id')} (distance ceiling {index.get('ceiling')}) "
        f"in {job['finished'] - job['started']:.1f}s"
    )


def _learned_phrases(obj: Ctx) -> dict[str, list[str]] | None:
    """The learned examples in chalie.db, so the new index holds them (None: none kept yet)."""
    from chalie.discovery.learning import LearnedExamples
    from chalie.process.home import DB_NAME

    path = obj.home / DB_NAME
    if not path.exists():
        return None
    store = LearnedExamples(path, per_tool=obj.config.discovery.examples_per_tool)
    try:
        return store.phrases()
    finally:
        store.close()


def _rebuild_here(obj: Ctx, reuse: bool) -> None:
    from chalie.discovery.engine import DiscoveryEngine, registry_docs
    from chalie.discovery.skills import SkillLibrary
    from chalie.discovery.types import IndexCorruptError
    from chalie.process.home import index_dirs

    registry = load_registry(obj)
    docs = registry_docs(registry)
    library = SkillLibrary.standard(obj.home)
    embedder = _embedder(obj)
    tools_dir, skills_dir = index_dirs(obj.home)
    try:
        with click.progressbar(length=max(len(docs), 1), label="tools ", show_pos=True) as bar:
            done = [0]

            def progress(n: int, total: int) -> None:
                bar.update(n - done[0])
                done[0] = n

            engine = DiscoveryEngine.build(
                docs,
                embedder,
                directory=tools_dir,
                progress=progress,
                reuse=reuse,
                learned=_learned_phrases(obj),
            )
        skills = DiscoveryEngine.build(
            library.docs(), embedder, directory=skills_dir, reuse=reuse, kind="skills"
        )
    except (IndexCorruptError, OSError) as exc:
        raise click.ClickException(f"index rebuild failed: {exc}") from None
    click.echo(
        f"indexed {len(engine)} tools and {len(skills)} skills with {embedder.model_id} "
        f"(distance ceiling {engine.ceiling:g}) in {tools_dir.parent}"
    )
    problems = [(f.path, f.error) for f in registry.failures]
    problems += [(f.path, f.error) for f in library.failures]
    for path, error in problems:
        click.echo(f"warning: could not load {path}: {error}", err=True)


@tools.command("find")
@click.argument("query", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result body as JSON.")
@click.pass_obj
def tools_find(obj: Ctx, query: tuple[str, ...], as_json: bool) -> None:
    """Run find_tools: one QUERY per tool name or described action."""
    import pykka

    from abilities.find_tools import FindTools
    from actors.discovery import DiscoveryActor, DiscoveryHandle
    from chalie.calls.envelope import render
    from chalie.calls.invoke import coerce_params, invoke
    from chalie.services import Services
    from chalie.wire.messages import TurnContext

    registry = load_registry(obj)
    embedder = _embedder(obj)
    ref = DiscoveryActor.start(registry=registry, home=obj.home, embedder=embedder, readonly=True)
    try:
        handle = DiscoveryHandle(ref, timeout=600.0)  # a stale index is rebuilt in memory first
        status = handle.status()
        if not status["ready"]:
            raise click.ClickException(
                f"discovery index unavailable: {status['error']} "
                "(`chalie index rebuild` makes a new one)"
            )
        for notice in status["notices"]:
            click.echo(f"warning: {notice}; `chalie index rebuild` replaces it", err=True)
        services = Services(discovery=handle)
        context = TurnContext(conversation_id="cli", turn_id=f"cli-{uuid.uuid4().hex[:8]}")
        try:
            params: Any = coerce_params(FindTools, {"query": list(query)})
        except Exception as exc:  # msgspec.ValidationError names the offending entry
            raise click.ClickException(f"invalid query: {exc}") from None
        result = invoke(FindTools(context, services), params)
    finally:
        try:
            ref.stop()
        except pykka.ActorDeadError:
            pass
    if as_json:
        failure = {"error": result.code, "message": result.body}
        click.echo(result.body if result.ok else json.dumps(failure))
    else:
        click.echo(render("find_tools", result))
    if not result.ok:
        raise SystemExit(1)

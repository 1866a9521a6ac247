"""``chalie index rebuild`` and ``chalie tools find``: the discovery index from the command line.

Both work on ``<home>/index`` directly, with no daemon: ``tools find`` runs the
real find_tools ability over the persisted index when it is current, and over a
fresh in-memory index (with a warning) when it is stale, so it never replaces
an index a running daemon serves; ``index rebuild`` writes a new one.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import click
import pykka

from abilities.find_tools import FindTools
from actors.discovery import DiscoveryActor, DiscoveryHandle
from chalie.cli import Ctx, cli
from chalie.cli.tools import load_registry, tools
from chalie.discovery.embedder import Embedder, EmbedderError, load_embedder
from chalie.discovery.engine import DiscoveryEngine, registry_docs
from chalie.discovery.skills import SkillLibrary
from chalie.discovery.types import IndexCorruptError
from chalie.envelope import render
from chalie.home import index_dirs
from chalie.invoke import coerce_params, invoke
from chalie.messages import TurnContext
from chalie.services import Services


def _embedder(obj: Ctx) -> Embedder:
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
    """Rebuild the tool and skill indexes from the registry and the skill folders."""
    registry = load_registry(obj)
    docs = registry_docs(registry)
    library = SkillLibrary.standard(obj.config.home)
    embedder = _embedder(obj)
    tools_dir, skills_dir = index_dirs(obj.config.home)
    try:
        with click.progressbar(length=max(len(docs), 1), label="tools ", show_pos=True) as bar:
            done = [0]

            def progress(n: int, total: int) -> None:
                bar.update(n - done[0])
                done[0] = n

            engine = DiscoveryEngine.build(
                docs, embedder, directory=tools_dir, progress=progress, reuse=reuse
            )
        skills = DiscoveryEngine.build(library.docs(), embedder, directory=skills_dir, reuse=reuse)
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
    registry = load_registry(obj)
    embedder = _embedder(obj)
    ref = DiscoveryActor.start(
        registry=registry, home=obj.config.home, embedder=embedder, readonly=True
    )
    try:
        handle = DiscoveryHandle(ref, timeout=600.0)  # a stale index is rebuilt in memory first
        status = handle.status()
        if not status["ready"]:
            raise click.ClickException(f"discovery index unavailable: {status['error']}")
        services = Services(registry=registry, discovery=handle)
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

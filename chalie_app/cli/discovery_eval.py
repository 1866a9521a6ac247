"""``chalie discovery eval``: measure find_tools on any labelled catalogue.

The catalogue goes into a fresh in-memory index (nothing under the data
directory is touched) and every query runs through the real cascade; see
chalie.discovery.evaluate for what each figure means.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from chalie.discovery.embedder import EmbedderError, load_embedder
from chalie.discovery.engine import DiscoveryEngine
from chalie.discovery.evaluate import (
    EvalDataError,
    cross_validate,
    evaluate,
    format_report,
    learned_engine,
    load_catalogue,
    load_queries,
)
from chalie.discovery.types import IndexCorruptError
from chalie.process import control
from chalie_app.cli.group import Ctx, cli


@cli.group()
def discovery() -> None:
    """Tool discovery: quality measurement and learned examples."""


@discovery.group("examples")
def examples() -> None:
    """Learned examples: find_tools entries that led to a tool's successful use."""


def _examples_call(obj: Ctx, args: dict[str, Any]) -> Any:
    """Through the daemon when one runs (its index follows at once), else on chalie.db."""
    home = obj.home
    if control.read_pid(home) is not None and control.socket_path(home).exists():
        from chalie_app.cli.daemon import ask_daemon

        return ask_daemon(obj, "discovery.examples", args)
    from chalie.discovery.learning import LearnedExamples
    from chalie.process.home import DB_NAME

    store = LearnedExamples(home / DB_NAME, per_tool=obj.config.discovery.examples_per_tool)
    try:
        if args["action"] == "list":
            rows = store.examples(args.get("tool"))
            return {"examples": [vars(e) for e in rows]}
        if args["action"] == "forget":
            if "id" in args:
                return {"forgotten": 0 if store.forget_id(args["id"]) is None else 1}
            return {"forgotten": store.forget_tool(args["tool"])}
        return {"forgotten": store.clear()}
    finally:
        store.close()


@examples.command("list")
@click.argument("tool", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the examples as JSON.")
@click.pass_obj
def examples_list(obj: Ctx, tool: str | None, as_json: bool) -> None:
    """List learned examples, of one TOOL or of all."""
    args: dict[str, Any] = {"action": "list"}
    if tool:
        args["tool"] = tool
    rows = _examples_call(obj, args)["examples"]
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        click.echo("no learned examples")
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["created"]))
        text = row["text"].encode("unicode_escape").decode("ascii")[:120]
        click.echo(f"{row['id']:>6}  {row['tool']:<24} {row['channel']:<14} {when}  {text}")


@examples.command("forget")
@click.argument("target")
@click.pass_obj
def examples_forget(obj: Ctx, target: str) -> None:
    """Forget one example (by its ID) or all of a TOOL's."""
    args: dict[str, Any] = {"action": "forget"}
    if target.isdigit():
        args["id"] = int(target)
    else:
        if len(target) > 256:
            raise click.BadParameter("a tool name is at most 256 characters", param_hint="TARGET")
        args["tool"] = target
    count = _examples_call(obj, args)["forgotten"]
    click.echo(f"forgot {count} example{'s' * (count != 1)}")


@examples.command("clear")
@click.pass_obj
def examples_clear(obj: Ctx) -> None:
    """Forget every learned example."""
    count = _examples_call(obj, {"action": "clear"})["forgotten"]
    click.echo(f"forgot {count} example{'s' * (count != 1)}")


@discovery.command("eval")
@click.option(
    "--tools",
    "tools_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL catalogue: {name, description} or {name, summary, examples} per line.",
)
@click.option(
    "--queries",
    "queries_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL queries: {query, gold: [names], type: single|multi|none} per line.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
@click.option("--misses", type=click.IntRange(0, 10_000), default=0, help="List N misses (R@5).")
@click.option(
    "--ceiling",
    type=click.FloatRange(0.0, 2.0),
    default=None,
    help="Override the model's calibrated distance ceiling (for calibration runs).",
)
@click.option(
    "--learn-from",
    "learn_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="JSONL queries learned first, through the same path as real use.",
)
@click.option(
    "--folds",
    type=click.IntRange(2, 20),
    default=None,
    help="k-fold cross-validation over --queries: learn from k-1 folds, score the other.",
)
@click.pass_obj
def discovery_eval(
    obj: Ctx,
    tools_path: Path,
    queries_path: Path,
    as_json: bool,
    misses: int,
    ceiling: float | None,
    learn_path: Path | None,
    folds: int | None,
) -> None:
    """Print R@1, R@3, R@5, MRR@10, the no-tool share answered with nothing, and latency.

    With --learn-from, the labelled queries of that file are learned first (as
    if each had led to a successful call of its gold tools on the chat
    channel); with --folds, --queries is cross-validated against itself.
    """
    if learn_path is not None and folds is not None:
        raise click.UsageError("--learn-from and --folds are two ways to learn: pick one")
    if ceiling is not None and (learn_path is not None or folds is not None):
        raise click.UsageError("--ceiling is for catalogue-only calibration runs")
    try:
        docs = load_catalogue(tools_path)
        known = {d.name for d in docs}
        queries = load_queries(queries_path, known=known)
        learn = load_queries(learn_path, known=known) if learn_path is not None else []
    except EvalDataError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        embedder = load_embedder(obj.config.embedder.options())
    except EmbedderError as exc:
        raise click.ClickException(f"embedder: {exc}") from None
    started = time.perf_counter()
    learned = ""
    try:
        if folds is not None:
            report = cross_validate(docs, queries, embedder, folds=folds)
            engine = DiscoveryEngine.build(docs, embedder)
            build_seconds = time.perf_counter() - started
            learned = f"{folds}-fold cross-validated learning over its own tool queries"
        elif learn:
            with tempfile.TemporaryDirectory(prefix="chalie-eval-") as tmp:
                engine, counts = learned_engine(docs, embedder, learn, Path(tmp))
                build_seconds = time.perf_counter() - started
                report = evaluate(engine, queries, tools=len(docs))
            outcome = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            learned = f"learned from {len(learn)} queries of {learn_path} ({outcome})"
        else:
            engine = DiscoveryEngine.build(docs, embedder, ceiling=ceiling)
            build_seconds = time.perf_counter() - started
            report = evaluate(engine, queries, tools=len(docs))
    except (IndexCorruptError, EmbedderError, ValueError) as exc:
        raise click.ClickException(f"evaluation failed: {exc}") from None
    if as_json:
        figures = report.figures()
        figures.update(
            model_id=embedder.model_id,
            ceiling=engine.ceiling,
            build_seconds=round(build_seconds, 3),
            learning=learned or None,
        )
        click.echo(json.dumps(figures, sort_keys=True))
        return
    click.echo(format_report(report, title=tools_path.parent.name or str(tools_path)))
    if learned:
        click.echo(f"  {learned}")
    click.echo(
        f"  model {embedder.model_id}, ceiling {engine.ceiling}, "
        f"index built in {build_seconds:.2f}s"
    )
    for miss in report.misses(5)[:misses]:
        got = ", ".join(miss.found[:5]) or "nothing"
        click.echo(f"  miss: {miss.query!r}: wanted {', '.join(miss.gold)}; got {got}")
    sys.stdout.flush()

"""``chalie discovery eval``: measure find_tools on any labelled catalogue.

The catalogue goes into a fresh in-memory index (nothing under the data
directory is touched) and every query runs through the real cascade; see
chalie.discovery.evaluate for what each figure means.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from chalie.cli import Ctx, cli
from chalie.discovery.embedder import EmbedderError, load_embedder
from chalie.discovery.engine import DiscoveryEngine
from chalie.discovery.evaluate import (
    EvalDataError,
    evaluate,
    format_report,
    load_catalogue,
    load_queries,
)
from chalie.discovery.types import IndexCorruptError


@cli.group()
def discovery() -> None:
    """Tool discovery: quality measurement."""


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
@click.pass_obj
def discovery_eval(
    obj: Ctx,
    tools_path: Path,
    queries_path: Path,
    as_json: bool,
    misses: int,
    ceiling: float | None,
) -> None:
    """Print R@1, R@3, R@5, MRR@10, the no-tool share answered with nothing, and latency."""
    try:
        docs = load_catalogue(tools_path)
        queries = load_queries(queries_path, known={d.name for d in docs})
    except EvalDataError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        embedder = load_embedder(obj.config.embedder.options())
    except EmbedderError as exc:
        raise click.ClickException(f"embedder: {exc}") from None
    started = time.perf_counter()
    try:
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
        )
        click.echo(json.dumps(figures, sort_keys=True))
        return
    click.echo(format_report(report, title=tools_path.parent.name or str(tools_path)))
    click.echo(
        f"  model {embedder.model_id}, ceiling {engine.ceiling}, "
        f"index built in {build_seconds:.2f}s"
    )
    for miss in report.misses(5)[:misses]:
        got = ", ".join(miss.found[:5]) or "nothing"
        click.echo(f"  miss: {miss.query!r}: wanted {', '.join(miss.gold)}; got {got}")
    sys.stdout.flush()

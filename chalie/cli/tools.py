"""``chalie tools ...``: the registered abilities and their descriptors."""

from __future__ import annotations

import json

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
@click.option("--json", "as_json", is_flag=True, help="Print descriptors exactly as the model sees them.")
@click.option("--async-channel", is_flag=True, help="Assemble as for a channel that allows async calls.")
@click.pass_obj
def tools_list(obj: Ctx, as_json: bool, async_channel: bool) -> None:
    """List the registered abilities."""
    reg = load_registry(obj)
    if as_json:
        click.echo(json.dumps(reg.descriptors(allow_async=async_channel), indent=2, ensure_ascii=False))
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

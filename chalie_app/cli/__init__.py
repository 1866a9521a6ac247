"""The ``chalie`` command: one click group; each command family lives in its own module.

The families are imported when their command runs (:class:`~chalie_app.cli.group.LazyGroup`),
so a command loads only what it needs.
"""

from __future__ import annotations

from chalie_app.cli.group import Ctx, cli

__all__ = ["Ctx", "cli", "main"]


def main() -> None:
    cli(prog_name="chalie")

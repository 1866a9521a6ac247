"""The ``chalie`` command: one click group; each command family lives in its own module.

The families are imported when their command runs (:class:`~chalie_app.cli.group.LazyGroup`),
so a command loads only what it needs.
"""

from __future__ import annotations

from chalie_app.cli.group import Ctx, cli

__all__ = ["Ctx", "cli", "main"]


def main() -> None:
    """Run the command, then leave without the interpreter's finalisation
    (:mod:`chalie.process.quick_exit`: exit handlers and flushes kept, ~20 ms a command saved)."""
    from chalie.process.quick_exit import exit_code, quick_exit

    try:
        cli(prog_name="chalie")
    except SystemExit as exc:  # click ends every command so, the code included
        quick_exit(exit_code(exc.code))
    quick_exit(0)

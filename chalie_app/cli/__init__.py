"""The ``chalie`` command: one click group; each command family lives in its own module."""

from __future__ import annotations

from chalie_app.cli.group import Ctx, cli

__all__ = ["Ctx", "cli", "main"]


def main() -> None:
    cli(prog_name="chalie")


# Command families register themselves on the group when imported.
from chalie_app.cli import chat as _chat  # noqa: E402,F401
from chalie_app.cli import conversations as _conversations  # noqa: E402,F401
from chalie_app.cli import daemon as _daemon  # noqa: E402,F401
from chalie_app.cli import discovery as _discovery  # noqa: E402,F401
from chalie_app.cli import discovery_eval as _discovery_eval  # noqa: E402,F401
from chalie_app.cli import mcp as _mcp  # noqa: E402,F401
from chalie_app.cli import policy as _policy  # noqa: E402,F401
from chalie_app.cli import token as _token  # noqa: E402,F401
from chalie_app.cli import tools as _tools  # noqa: E402,F401
from chalie_app.cli import trail as _trail  # noqa: E402,F401

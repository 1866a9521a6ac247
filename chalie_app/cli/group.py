"""The ``chalie`` click group and the context every command gets (:class:`Ctx`)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import click

from chalie.config import Config, ConfigError
from chalie.home import HomeError

if TYPE_CHECKING:
    from chalie.control import ControlClient


class Ctx:
    """What every command may need, built lazily so ``--help`` stays fast."""

    def __init__(self, home: str | None) -> None:
        self._home = home
        self._config: Config | None = None
        self._client: ControlClient | None = None

    @property
    def config(self) -> Config:
        if self._config is None:
            try:
                self._config = Config.load(self._home)
            except (ConfigError, HomeError) as exc:
                raise click.ClickException(str(exc)) from None
        return self._config

    @property
    def client(self) -> ControlClient:
        """One control client for the command: a command that polls keeps one socket."""
        if self._client is None:
            from chalie.control import ControlClient

            self._client = ControlClient(self.config.home)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


@click.group()
@click.option(
    "--home",
    envvar="CHALIE_HOME",
    metavar="DIR",
    help="Data directory; env CHALIE_HOME; default: the platform's user data dir. "
    "Give it before the command: chalie --home DIR run.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log debug lines to stderr.")
@click.pass_context
def cli(ctx: click.Context, home: str | None, verbose: bool) -> None:
    """Chalie: a daemon that gives a language model hands, safely."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    ctx.obj = Ctx(home)
    ctx.call_on_close(ctx.obj.close)

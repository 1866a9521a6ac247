"""The ``chalie`` click group, the context every command gets (:class:`Ctx`), lazy loading.

A command runs importing only what it needs: the group knows each command's module and
one-line help (:data:`COMMANDS`), and imports the module when the command is run (its
decorators register it then). ``chalie --help`` imports none of them.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click

if TYPE_CHECKING:
    from chalie.process.config import Config
    from chalie.process.control import ControlClient
    from chalie.process.home import Home
    from chalie.store.store_place import Place


class Ctx:
    """What every command may need, built lazily so ``--help`` stays fast.

    :attr:`home` and :attr:`layout` name the data directory without reading
    ``config.toml``: a command that only talks to the daemon or opens ``chalie.db``
    needs no more (the daemon runs on the configuration it loaded). :attr:`config`
    reads and checks the file, for the commands that use a setting.
    """

    def __init__(self, home: str | None) -> None:
        self._home = home
        self._layout: Home | None = None
        self._config: Config | None = None
        self._client: ControlClient | None = None

    @property
    def layout(self) -> Home:
        """The data directory (``--home``, ``CHALIE_HOME`` or the platform's), checked."""
        if self._layout is None:
            from chalie.process.home import Home, HomeError

            try:
                where = Home.locate(self._home)
                where.check()
            except HomeError as exc:
                raise click.ClickException(str(exc)) from None
            self._layout = where
        return self._layout

    @property
    def home(self) -> Path:
        return self.layout.root

    @property
    def config(self) -> Config:
        if self._config is None:
            from chalie.process.config import Config, ConfigError
            from chalie.process.home import HomeError

            try:
                self._config = Config.load(self._home)
            except (ConfigError, HomeError) as exc:
                raise click.ClickException(str(exc)) from None
        return self._config

    @property
    def store(self) -> Place:
        """Where the durable state lives: ``[store] url``'s database, else ``chalie.db``.
        A ``config.toml`` without a ``[store]`` table is only parsed, not loaded whole (a
        token command stays light); with one, or unreadable, it is loaded and checked."""
        import tomllib

        try:
            raw = tomllib.loads(self.layout.config_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return self.layout.db
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            raw = {"store": None}  # the full load says what is wrong, in one line
        return self.config.store_place if "store" in raw else self.layout.db

    @property
    def client(self) -> ControlClient:
        """One control client for the command: a command that polls keeps one socket."""
        if self._client is None:
            from chalie.process.control import ControlClient

            self._client = ControlClient(self.home)
        return self._client

    def set_home(self, home: str) -> None:
        """The data directory, given after the command; before anything was loaded."""
        loaded = self._config.home if self._config is not None else None
        if self._layout is not None:
            loaded = self._layout.root
        if loaded is not None and str(loaded) != home:
            raise click.UsageError("--home was given twice with different directories")
        self._home = home

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


# command -> (the modules that register it, its one-line help). The help here is what
# ``chalie --help`` lists without importing anything; a test checks it against each
# command's own docstring.
COMMANDS: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "accounts": (
        ("accounts",),
        "People's accounts: calendars (CalDAV, ICS), contacts (CardDAV), mail (IMAP, SMTP).",
    ),
    "run": (("daemon",), "Run the daemon in the foreground (stop it with Ctrl-C, SIGTERM or..."),
    "status": (("daemon",), "Show the running daemon: actors and their restarts, workers, uptime."),
    "stop": (("daemon",), "Stop the running daemon and wait until its process is gone..."),
    "chat": (("chat",), "Talk to Chalie in the terminal (or pipe one message in: `echo hi |..."),
    "ask": (
        ("conversations",),
        "Run one turn of TEXT (or standard input) through the daemon and...",
    ),
    "conversations": (("conversations",), "Stored conversations."),
    "tools": (("tools", "discovery"), "Registered abilities."),
    "trail": (("trail",), "Show recent tool calls, newest first, from the running daemon."),
    "policy": (
        ("policy",),
        "The permission gate's table: (channel, permission) -> allow | ask | deny.",
    ),
    "token": (("token",), "Bearer tokens for the WebSocket chat and the inbound MCP server."),
    "brain": (("brain",), "The Brain dashboard."),
    "mcp": (("mcp",), "Remote MCP servers whose tools become Chalie tools."),
    "index": (("discovery",), "The discovery index (tools and skills)."),
    "discovery": (("discovery_eval",), "Tool discovery: quality measurement and learned examples."),
    "memory": (
        ("memory",),
        "What Chalie remembers (the owner's memories, and each agent's apart).",
    ),
    "skills": (("memory",), "Skill playbooks and the personalisation rules learnt for them."),
    "reminders": (("reminders",), "Reminders: list, add and cancel them."),
    "store": (
        ("store",),
        "Where the durable state lives: chalie.db, or a PostgreSQL database ([store] url).",
    ),
}
HELP_OPTIONS: Final = ["-h", "--help"]


def _home_option(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """``--home`` given after the command (``chalie run --home X``): the same as before it."""
    if value is not None:
        obj = ctx.find_object(Ctx)
        if obj is not None:
            obj.set_home(value)


def _with_home(command: click.Command) -> click.Command:
    """Accept ``--home`` on ``command`` and its subcommands too (once)."""
    if not any(p.name == "home_after" for p in command.params):
        command.params.append(
            click.Option(
                ["--home", "home_after"],
                metavar="DIR",
                expose_value=False,
                is_eager=True,
                callback=_home_option,
                help="Data directory (as chalie --home DIR).",
            )
        )
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _with_home(sub)
    return command


class LazyGroup(click.Group):
    """A group whose commands are imported when used (see :data:`COMMANDS`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loaded: set[str] = set()

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = COMMANDS.get(cmd_name)
        if found is not None and cmd_name not in self._loaded:
            for module in found[0]:
                importlib.import_module(f"chalie_app.cli.{module}")
            self._loaded.add(cmd_name)
        command = self.commands.get(cmd_name)
        return None if command is None else _with_home(command)

    def invoke(self, ctx: click.Context) -> object:
        """Every command: an unusable ``chalie.db`` or store is one line and exit 1."""
        try:
            return super().invoke(ctx)
        except Exception as exc:
            # Not imported: no command opened the database, so nothing raised DatabaseUnusable
            # (importing it would load sqlite3 into every command).
            db = sys.modules.get("chalie.store.db")
            if db is not None and isinstance(exc, db.DatabaseUnusable):
                raise click.ClickException(str(exc)) from None
            # The store unreachable, or a store not on PostgreSQL yet: one line.
            place = sys.modules.get("chalie.store.store_place")
            if place is not None and isinstance(exc, place.StoreUnavailable):
                raise click.ClickException(str(exc)) from None
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from chalie import __version__

        click.echo(f"chalie {__version__}")
        ctx.exit()


@click.group("chalie", cls=LazyGroup, context_settings={"help_option_names": HELP_OPTIONS})
@click.option(
    "--home",
    envvar="CHALIE_HOME",
    metavar="DIR",
    help="Data directory; env CHALIE_HOME; default: the platform's user data dir. "
    "Accepted before or after the command.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log debug lines to stderr.")
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_version,
    help="Print the version and exit.",
)
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


def load_all() -> None:
    """Import every command family (tests, and the help text check)."""
    for modules, _help in COMMANDS.values():
        for module in modules:
            importlib.import_module(f"chalie_app.cli.{module}")


__all__ = ["COMMANDS", "Ctx", "LazyGroup", "cli", "load_all"]

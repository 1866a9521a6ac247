"""``chalie brain open``: a one-time sign-in link to the Brain dashboard, opened in a browser.

The link comes from the running daemon over the control socket (the owner's): it signs one
browser in once, within two minutes, and is printed so it can be pasted where no browser runs.
"""

from __future__ import annotations

import webbrowser

import click

from chalie.control import DaemonNotRunning
from chalie_app.cli.group import Ctx, cli


@cli.group()
def brain() -> None:
    """The Brain dashboard."""


@brain.command("open")
@click.option("--no-browser", is_flag=True, help="Print the link only.")
@click.pass_obj
def brain_open(obj: Ctx, no_browser: bool) -> None:
    """Print a one-time sign-in link to the dashboard and open it when a browser is there."""
    try:
        reply = obj.client.call("brain.link", None, timeout=10)
    except DaemonNotRunning:
        raise click.ClickException("the daemon is not running (chalie run)") from None
    if not reply.ok:
        message = (reply.data or {}).get("message", reply.error)
        raise click.ClickException(f"no link: {message} [{reply.error}]")
    url = str(reply.data["url"])
    click.echo(url)
    click.echo(f"one-time sign-in link, valid {reply.data.get('expires_in', 120):g} s", err=True)
    if not no_browser:
        try:
            opened = webbrowser.get() is not None and webbrowser.open(url)
        except webbrowser.Error:
            opened = False
        if not opened:
            click.echo("no browser here: paste the link into one", err=True)

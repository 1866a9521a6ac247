"""``chalie brain open``: a one-time sign-in link to the Brain dashboard, opened in a browser.

The link comes from the running daemon over the control socket (the owner's): it signs one
browser in once, within two minutes, and is printed so it can be pasted where no browser runs.
The browser is never given the link on its command line (every local user reads
``/proc/*/cmdline``): it opens a page only the owner reads (``brain-open.html`` in the data
directory, 0600) that goes on to the link. ``chalie brain sign-out`` ends every session.
"""

from __future__ import annotations

import webbrowser

import click

from chalie.brain.access import sign_in_page
from chalie.process.control import DaemonNotRunning
from chalie.process.home import write_private
from chalie.wire.messages import ControlReply
from chalie_app.cli.group import Ctx, cli


@cli.group()
def brain() -> None:
    """The Brain dashboard."""


def _call(obj: Ctx, command: str, failed: str) -> ControlReply:
    """The daemon's successful reply to a Brain control command, else a one-line error."""
    try:
        reply = obj.client.call(command, None, timeout=10)
    except DaemonNotRunning:
        raise click.ClickException("the daemon is not running (chalie run)") from None
    if not reply.ok:
        message = (reply.data or {}).get("message", reply.error)
        raise click.ClickException(f"{failed}: {message} [{reply.error}]")
    return reply


@brain.command("open")
@click.option("--no-browser", is_flag=True, help="Print the link only.")
@click.pass_obj
def brain_open(obj: Ctx, no_browser: bool) -> None:
    """Print a one-time sign-in link to the dashboard and open it when a browser is there."""
    reply = _call(obj, "brain.link", "no link")
    url = str(reply.data["url"])
    click.echo(url)
    click.echo(f"one-time sign-in link, valid {reply.data.get('expires_in', 120):g} s", err=True)
    if not no_browser:
        page = obj.layout.sign_in_page
        try:
            write_private(page, sign_in_page(url))
            opened = webbrowser.get() is not None and webbrowser.open(page.as_uri())
        except (webbrowser.Error, OSError):
            opened = False
        if not opened:
            click.echo("no browser here: paste the link into one", err=True)


@brain.command("sign-out")
@click.pass_obj
def brain_sign_out(obj: Ctx) -> None:
    """Sign every browser out of the dashboard (one-time-link sessions included)."""
    reply = _call(obj, "brain.sign_out", "not signed out")
    click.echo(f"signed out {reply.data['sessions']} browser session(s)")

"""``chalie run``, ``chalie status``, ``chalie stop``, and how every command reaches the daemon.

:func:`ask_daemon` is the one way a CLI command talks to the daemon: it turns
"no daemon" into the one-line message and a non-zero exit, and an error reply
into ``chalie: <code>: <message>``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, NoReturn

import click

from chalie.process import control
from chalie_app.cli.group import Ctx, cli

EXIT_NO_DAEMON = 1
EXIT_ERROR_REPLY = 1


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"chalie: {message}", err=True)
    sys.exit(code)


def call_daemon(
    obj: Ctx, command: str, args: dict[str, Any] | None = None, *, timeout: float = 15.0
) -> Any:
    """Send one control request; the whole reply (exit non-zero when no daemon runs)."""
    try:
        return obj.client.call(command, args, timeout=timeout)
    except control.DaemonNotRunning as exc:
        fail(str(exc), EXIT_NO_DAEMON)


def ask_daemon(
    obj: Ctx, command: str, args: dict[str, Any] | None = None, *, timeout: float = 15.0
) -> Any:
    """Send one control request; the reply's data, or exit non-zero with one line."""
    reply = call_daemon(obj, command, args, timeout=timeout)
    if not reply.ok:
        message = reply.data.get("message", "") if isinstance(reply.data, dict) else ""
        fail(f"{reply.error}: {message}" if message else str(reply.error), EXIT_ERROR_REPLY)
    return reply.data


@cli.command("run")
@click.pass_context
def run_command(ctx: click.Context) -> None:
    """Run the daemon in the foreground (stop it with Ctrl-C, SIGTERM or `chalie stop`)."""
    # Imported here: the actor runtime is heavy, and the other commands never need it.
    # The composition root sits above the actors; the CLI is the only part of
    # chalie/ that reaches it, and only to run the daemon.
    import logging

    try:
        from chalie.process import daemon, heap, logs

        heap.pin_numeric_threads()  # before numpy is imported (the composition root imports it)
        from chalie_app import root

        heap.limit_arenas()  # before any thread starts (chalie/process/heap.py)
        obj: Ctx = ctx.obj
        verbose = bool(ctx.parent is not None and ctx.parent.params.get("verbose"))
        logs.configure(logging.DEBUG if verbose else logging.INFO)
        code = root.run(obj.config)
    except KeyboardInterrupt:  # a Ctrl-C before the stop handler was installed (no thread yet)
        click.echo("chalie: interrupted while starting; nothing was left running", err=True)
        sys.exit(130)
    daemon.exit_process(code)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _scalar(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict | list):
        import json

        return json.dumps(value, default=str, separators=(",", ":"))
    return str(value)


def _fields(item: object) -> str:
    if isinstance(item, dict):
        return "  ".join(f"{k} {_scalar(v)}" for k, v in item.items())
    return _scalar(item)


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option(
    "--wait",
    type=click.FloatRange(0, 3600),
    default=None,
    metavar="SECONDS",
    help="Wait up to SECONDS for a daemon that is starting to be ready (every actor up).",
)
@click.pass_obj
def status_command(obj: Ctx, as_json: bool, wait: float | None) -> None:
    """Show the running daemon: actors and their restarts, workers, uptime."""
    from chalie.discovery.state import describe

    data = _wait_ready(obj, wait) if wait is not None else ask_daemon(obj, "status")
    if as_json:
        import json

        click.echo(json.dumps(data, indent=2, default=str))
        return
    up = _age(data["uptime"])
    click.echo(f"chalie {data['version']}  pid {data['pid']}  up {up}  home {data['home']}")
    click.echo("actors:")
    now = time.time()
    for child in data["actors"]:
        state = "running" if child["alive"] else "down"
        started = child.get("started_at")
        line = (
            f"  {child['id']:<12} {state:<8} restarts {child['restarts']:<3} "
            f"up {_age(now - started if started else None)}"
        )
        if child.get("last_error"):
            line += f"  last error: {child['last_error']}"
        click.echo(line)
    workers = data.get("workers")
    if isinstance(workers, dict):
        click.echo("workers:")
        scalars = []
        for key, value in workers.items():
            if isinstance(value, list):
                if key != "workers":
                    click.echo(f"  {key}:" if value else f"  {key}: none")
                for item in value:
                    click.echo("    " + _fields(item) if key != "workers" else "  " + _fields(item))
            else:
                scalars.append(f"{key} {_scalar(value)}")
        if scalars:
            click.echo("  " + "  ".join(scalars))
    elif workers is not None:
        click.echo(f"workers: {_scalar(workers)}")
    click.echo(f"event loop: {'running' if data.get('loop') else 'down'}")
    click.echo(describe(data.get("discovery")))
    memory = data.get("memory")
    if isinstance(memory, dict):
        index = memory.get("index")
        loaded = "index loaded" if index else "index not loaded yet"
        click.echo(f"memory: {memory.get('memories', 0)} memories ({loaded})")
    scheduler = data.get("scheduler")
    if isinstance(scheduler, dict):
        click.echo(
            f"scheduler: {scheduler.get('pending', 0)} reminders pending, "
            f"{scheduler.get('fires', 0)} fired, {scheduler.get('reflections', 0)} reflections"
        )
    chat = data.get("chat")
    if isinstance(chat, dict):
        ws = chat.get("websocket") or "off"
        tcp = chat.get("zmq_tcp") or "off"
        click.echo(
            f"chat: websocket {ws} ({chat.get('websocket_clients', 0)} clients)  "
            f"zeromq ipc ({chat.get('zmq_clients', 0)} clients)  tcp {tcp}"
        )
    mcp = data.get("mcp_server")
    if isinstance(mcp, dict):
        line = f"mcp server: {mcp.get('state')}"
        if mcp.get("url"):
            line += f"  {mcp['url']}"
        for key in ("requests", "calls"):
            counts = mcp.get(key)
            if isinstance(counts, dict):
                line += f"  {key}: " + " ".join(f"{k} {v}" for k, v in counts.items())
        click.echo(line)


def _wait_ready(obj: Ctx, seconds: float) -> Any:
    """The status once every actor runs; exit 1 with one line when that takes too long."""
    deadline = time.monotonic() + seconds
    last = "no daemon running"
    while True:
        try:
            reply = obj.client.call("status", None, timeout=max(0.5, deadline - time.monotonic()))
        except control.DaemonNotRunning as exc:
            last = str(exc)
        else:
            if reply.ok and all(child["alive"] for child in reply.data["actors"]):
                return reply.data
            last = "the daemon is starting (not every actor is up yet)"
        if time.monotonic() >= deadline:
            fail(f"not ready within {seconds:g} s: {last}", EXIT_NO_DAEMON)
        time.sleep(0.05)


@cli.command("stop")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for the exit.")
@click.pass_obj
def stop_command(obj: Ctx, timeout: float) -> None:
    """Stop the running daemon and wait until its process is gone (none running: exit 0)."""
    try:
        reply = obj.client.call("stop", None, timeout=15.0)
    except control.DaemonNotRunning:
        holder = control.lock_holder(obj.home)
        if isinstance(holder, bool) or holder is None or not control.process_alive(holder):
            # As `systemctl stop` of a stopped unit: the wanted state holds already.
            click.echo(f"chalie: no daemon running on {obj.home}; nothing to stop")
            return
        # The lock is held but nothing answers yet: a daemon still starting (its signal
        # handler turns SIGTERM into the same clean stop).
        _stop_starting(holder, timeout)
        return
    if not reply.ok:
        fail(f"{reply.error}: {reply.data.get('message', '')}", EXIT_ERROR_REPLY)
    data = reply.data
    pid = int(data["pid"])
    if not control.wait_gone(pid, timeout):
        fail(f"daemon {pid} is still stopping after {timeout:g} s")
    click.echo(f"chalie: daemon {pid} stopped")


def _stop_starting(pid: int, timeout: float) -> None:
    """Stop a daemon that holds the lock but does not answer yet (still starting)."""
    import signal

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        click.echo(f"chalie: daemon {pid} stopped")
        return
    except PermissionError:
        fail(f"daemon {pid} is starting and belongs to another user; not stopped")
    if not control.wait_gone(pid, timeout):
        fail(f"daemon {pid} was starting and is still stopping after {timeout:g} s")
    click.echo(f"chalie: daemon {pid} was starting; stopped")

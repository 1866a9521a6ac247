"""``chalie mcp list | show | add | import | test | login | enable | disable | remove | tools |
approve``.

Changes are written to ``chalie.db`` (secrets to the 0600 secrets file) by the
CLI itself, so they work with or without a daemon; a running daemon is then
asked to reconcile its connections (``mcp.reload``). ``test`` connects from
the CLI process and keeps nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import click
import msgspec

from chalie.gate.display import one_line
from chalie.mcp.admin import McpAdmin, McpAdminError
from chalie.process import control
from chalie_app.cli.daemon import ask_daemon, fail
from chalie_app.cli.group import Ctx, cli


def _admin(obj: Ctx) -> McpAdmin:
    home = obj.home
    return McpAdmin(obj.store, home, on_change=lambda: _poke(home))


def _poke(home: Path) -> None:
    """Ask a running daemon to reconcile its connections; no daemon is fine."""
    if control.read_pid(home) is None:
        return
    client = control.ControlClient(home)
    try:
        client.call("mcp.reload", None, timeout=30)
    except control.DaemonNotRunning:
        pass
    finally:
        client.close()


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def _run(obj: Ctx, op: str, *args: Any, **kw: Any) -> Any:
    admin = _admin(obj)
    try:
        return getattr(admin, op)(*args, **kw)
    except McpAdminError as exc:
        fail(str(exc))
    finally:
        admin.close()


@cli.group()
def mcp() -> None:
    """Remote MCP servers whose tools become Chalie tools."""


@mcp.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON, for scripts.")
@click.pass_obj
def mcp_list(obj: Ctx, as_json: bool) -> None:
    """Every connection: status, transport, tool count, last heartbeat, last error."""
    rows = _run(obj, "list")
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        click.echo("no MCP servers (add one with `chalie mcp add` or `chalie mcp import`)")
        return
    for r in rows:
        extra = f"  quarantined {r['quarantined']}" if r["quarantined"] else ""
        click.echo(
            f"{r['name']:<16} {r['status']:<10} {r['transport']:<5} tools {r['tools']:<4}"
            f" heartbeat {_when(r['last_heartbeat'])}{extra}"
            + (f"  error: {r['last_error']}" if r["last_error"] and r["status"] != "online" else "")
        )


@mcp.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON, for scripts.")
@click.pass_obj
def mcp_show(obj: Ctx, name: str, as_json: bool) -> None:
    """One connection in full (secrets only as references)."""
    shown = _run(obj, "show", name)
    if as_json:
        _echo_json(shown)
        return
    for line in _readable(shown):
        click.echo(line)


def _readable(value: Any, indent: str = "") -> list[str]:
    """``key: value`` lines, nested mappings and lists indented below their key."""
    lines: list[str] = []
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        label = f"{indent}{key}:" if isinstance(value, dict) else f"{indent}-"
        if isinstance(item, dict | list) and item:
            lines.append(label)
            lines.extend(_readable(item, indent + "  "))
        elif isinstance(item, dict | list):
            lines.append(f"{label} (none)")
        else:
            shown = "-" if item is None or item == "" else item
            lines.append(f"{label} {one_line(str(shown), 200)}")
    return lines


@mcp.command("tools")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON, for scripts.")
@click.pass_obj
def mcp_tools(obj: Ctx, name: str, as_json: bool) -> None:
    """A server's tools: proxy name, remote name, state (active, quarantined, gone...)."""
    tools = _run(obj, "tools", name)
    if as_json:
        _echo_json(tools)
        return
    for t in tools:
        why = f"  ({t['changed']} changed)" if t.get("changed") else ""
        why += f"  ({t['problem']})" if t.get("problem") else ""
        click.echo(f"{t['proxy']:<48} {t['state']:<12} {t['remote']}{why}")


@mcp.command("add")
@click.argument("name")
@click.option("--command", "command", help="Run a stdio server: the executable.")
@click.option("--arg", "args", multiple=True, help="An argument of --command (repeatable).")
@click.option("--env", "env", multiple=True, help="NAME=VALUE for --command (repeatable).")
@click.option("--cwd", default="", help="Working directory of --command.")
@click.option("--url", help="A Streamable HTTP or SSE server's URL.")
@click.option(
    "--transport",
    type=click.Choice(("stdio", "http", "sse")),
    help="How to reach the server (default: stdio with --command, http with --url).",
)
@click.option("--header", "headers", multiple=True, help="'Name: value' for --url (repeatable).")
@click.option("--disabled", is_flag=True, help="Add it without connecting.")
@click.option(
    "--channel",
    "channels",
    multiple=True,
    help="Keep its tools on this channel only, off discovery (repeatable; e.g. web-browse).",
)
@click.option(
    "--protocol",
    type=click.Choice(("auto", "legacy")),
    default="auto",
    help="auto: 2026-07-28 when the server offers it; legacy: always the 2025-11-25 handshake.",
)
@click.option("--call-timeout", type=click.FloatRange(0.1, 86400), help="Seconds a call may take.")
@click.option("--connect-timeout", type=click.FloatRange(0.1, 600), help="Seconds to connect.")
@click.option("--heartbeat", type=click.FloatRange(1, 86400), help="Seconds between heartbeats.")
@click.option("--root", "roots", multiple=True, help="A root the server is told of (repeatable).")
@click.option("--sampling-tokens", type=click.IntRange(0), help="Sampling tokens a day.")
@click.option("--oauth", is_flag=True, help="The server wants OAuth: then chalie mcp login NAME.")
@click.option("--oauth-client-id", help="A pre-registered OAuth client (else it registers).")
@click.option("--oauth-client-secret", help="That client's secret (goes to the secrets file).")
@click.option(
    "--secrets-stdin",
    is_flag=True,
    help="Read secrets from stdin, not the command line (where other users see them): one "
    "a line, 'header Name: value', 'env NAME=VALUE' or 'oauth-client-secret VALUE'.",
)
@click.option("--oauth-scope", help="The OAuth scope to ask for.")
@click.option(
    "--oauth-redirect-port",
    type=click.IntRange(1024, 65535),
    help="The loopback port a pre-registered client's redirect URI names.",
)
@click.pass_obj
def mcp_add(
    obj: Ctx,
    name: str,
    command: str | None,
    args: tuple[str, ...],
    env: tuple[str, ...],
    cwd: str,
    url: str | None,
    transport: str | None,
    headers: tuple[str, ...],
    disabled: bool,
    channels: tuple[str, ...],
    protocol: str,
    call_timeout: float | None,
    connect_timeout: float | None,
    heartbeat: float | None,
    roots: tuple[str, ...],
    sampling_tokens: int | None,
    oauth: bool,
    oauth_client_id: str | None,
    oauth_client_secret: str | None,
    secrets_stdin: bool,
    oauth_scope: str | None,
    oauth_redirect_port: int | None,
) -> None:
    """Add one server by hand. Secrets (headers, *_TOKEN/*_KEY env) go to the secrets file;
    write ${VAR} to read one from the daemon's environment instead, or pass them on stdin
    (--secrets-stdin) so they are never on a command line or in shell history."""
    from chalie.mcp.importing import spec_from_options
    from chalie.mcp.spec import SpecError

    if secrets_stdin:
        more_headers, more_env, secret = _stdin_secrets(sys.stdin.read())
        headers, env = (*headers, *more_headers), (*env, *more_env)
        oauth_client_secret = secret or oauth_client_secret

    try:
        spec = spec_from_options(
            name,
            command=command,
            args=args,
            url=url,
            transport=transport,
            headers=headers,
            env=env,
            cwd=cwd,
            options={
                "call_timeout": call_timeout,
                "connect_timeout": connect_timeout,
                "heartbeat": heartbeat,
                "roots": roots,
                "sampling_tokens": sampling_tokens,
                "channels": channels,
                "oauth": oauth or None,
                "oauth_client_id": oauth_client_id,
                "oauth_client_secret": oauth_client_secret,
                "oauth_scope": oauth_scope,
                "oauth_redirect_port": oauth_redirect_port,
            },
        )
    except SpecError as exc:
        fail(str(exc))
    spec = msgspec.structs.replace(spec, enabled=not disabled, protocol=protocol)
    _run(obj, "add", spec)
    click.echo(f"added {spec.name} ({spec.transport})")


def _stdin_secrets(text: str) -> tuple[list[str], list[str], str | None]:
    """``--secrets-stdin``'s lines: headers, env entries and the OAuth client secret."""
    headers: list[str] = []
    env: list[str] = []
    secret: str | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        kind, _, value = line.partition(" ")
        value = value.strip()
        if kind == "header" and value:
            headers.append(value)
        elif kind == "env" and value:
            env.append(value)
        elif kind == "oauth-client-secret" and value:
            secret = value
        else:
            fail(
                f"stdin line {number}: expected 'header Name: value', 'env NAME=VALUE' or "
                "'oauth-client-secret VALUE'"
            )
    return headers, env, secret


@mcp.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--replace", is_flag=True, help="Overwrite servers that already exist.")
@click.pass_obj
def mcp_import(obj: Ctx, file: Path, replace: bool) -> None:
    """Import the mcpServers JSON of Claude Desktop/Code, Cursor or VS Code."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror}")
    report = _run(obj, "import_text", data, replace=replace)
    for name in report["added"]:
        click.echo(f"added {name}")
    for name in report["skipped_existing"]:
        click.echo(f"skipped {name} (exists; --replace to overwrite)")
    for problem in report["problems"]:
        click.echo(f"refused {problem}", err=True)
    if not report["added"] and report["problems"]:
        raise SystemExit(1)


@mcp.command("test")
@click.argument("name")
@click.option(
    "--timeout",
    type=click.FloatRange(0.1, 600),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the server.",
)
@click.pass_obj
def mcp_test(obj: Ctx, name: str, timeout: float) -> None:
    """Connect, list the tools, report the protocol version and latency; keep nothing."""
    import asyncio

    from chalie.mcp.probe import test_server
    from chalie.mcp.secrets import MissingSecret, resolve

    admin = _admin(obj)
    try:
        spec = admin.spec(name)
        resolved = resolve(spec, admin.secrets)
    except (McpAdminError, MissingSecret) as exc:
        fail(str(exc))
    finally:
        admin.close()
    report = asyncio.run(test_server(resolved, timeout=timeout))
    if not report["ok"]:
        fail(f"{name}: {report['kind']}: {report['error']}")
    click.echo(
        f"{name}: ok, protocol {report['protocol']}, {report['server']}, connect "
        f"{report['connect_ms']} ms, list {report['list_ms']} ms, probe {report['probe_ms']} ms, "
        f"{len(report['tools'])} tools"
    )


@mcp.command("login")
@click.argument("name")
@click.option("--timeout", type=click.FloatRange(1, 3600), default=300.0, help="Seconds to wait.")
@click.pass_obj
def mcp_login(obj: Ctx, name: str, timeout: float) -> None:
    """Authorize Chalie at an OAuth server: prints the URL to open, waits for the redirect,
    stores the grant in the secrets file, and has a running daemon reconnect."""
    import asyncio

    from chalie.mcp.oauth import login
    from chalie.mcp.secrets import MissingSecret, resolve

    admin = _admin(obj)
    try:
        spec = admin.spec(name)
        if not spec.oauth:
            fail(f"{name} does not use OAuth (add it with --oauth)")
        resolved = resolve(spec, admin.secrets)
    except (McpAdminError, MissingSecret) as exc:
        admin.close()
        fail(str(exc))

    def show(url: str) -> None:
        click.echo(f"Open this address in your browser to let Chalie connect to {name}:")
        click.echo(url)
        click.echo(f"Waiting up to {timeout:g} s for the authorization ...", nl=True)

    try:
        report = asyncio.run(login(resolved, admin.secrets, show, timeout=timeout))
    except TimeoutError:
        fail(f"{name}: nobody completed the authorization within {timeout:g} s")
    except Exception as exc:
        fail(f"{name}: the login failed: {scrubbed(exc, resolved)}")
    finally:
        admin.close()
    _poke(obj.home)
    click.echo(f"{name}: logged in ({report['tools']} tools, protocol {report['protocol']})")


def scrubbed(exc: BaseException, spec: Any) -> str:
    """One line about a failed login, without any of the server's secrets."""
    from chalie.mcp.session import describe

    text = describe(exc)
    for value in (spec.oauth_client_secret, *spec.headers.values()):
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text[:300]


@mcp.command("enable")
@click.argument("name")
@click.pass_obj
def mcp_enable(obj: Ctx, name: str) -> None:
    """Connect to a server again."""
    _run(obj, "set_enabled", name, True)
    click.echo(f"enabled {name}")


@mcp.command("disable")
@click.argument("name")
@click.pass_obj
def mcp_disable(obj: Ctx, name: str) -> None:
    """Disconnect a server; its tools answer mcp-unknown-tool until it is enabled."""
    _run(obj, "set_enabled", name, False)
    click.echo(f"disabled {name}")


@mcp.command("remove")
@click.argument("name")
@click.pass_obj
def mcp_remove(obj: Ctx, name: str) -> None:
    """Forget a server, its cached tools and its secrets."""
    out = _run(obj, "remove", name)
    click.echo(f"removed {name} ({out['removed_tools']} tools)")


@mcp.command("approve")
@click.argument("name")
@click.argument("tool", required=False)
@click.pass_obj
def mcp_approve(obj: Ctx, name: str, tool: str | None) -> None:
    """Accept the changed definition of a quarantined tool (or of all of NAME's)."""
    out = _run(obj, "approve", name, tool)
    if not out["approved"]:
        click.echo(f"{name}: nothing is quarantined")
        return
    for proxy in out["approved"]:
        click.echo(f"approved {proxy} (its policy is ask until you set it)")


@mcp.command("answer")
@click.argument("request_id")
@click.argument("answer", required=False)
@click.option("--decline", is_flag=True, help="Decline the server's question.")
@click.pass_obj
def mcp_answer(obj: Ctx, request_id: str, answer: str | None, decline: bool) -> None:
    """Answer a server's question (elicitation): ANSWER is a JSON object of its fields."""
    if decline == (answer is not None):
        fail("give a JSON object of the answer's fields, or --decline")
    content: Any = None
    if answer is not None:
        try:
            content = json.loads(answer)
        except ValueError as exc:
            fail(f"the answer is not JSON ({str(exc)[:80]})")
        if not isinstance(content, dict):
            fail("the answer must be a JSON object of the form's fields")
    # The same durable request as chalie policy answer (the gate checks it against the form).
    _echo_json(ask_daemon(obj, "mcp.answer", {"request_id": request_id, "content": content}))

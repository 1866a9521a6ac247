"""Reading connections the ecosystem's way: the ``mcpServers`` JSON, and ``mcp add`` arguments.

Accepted files: Claude Desktop / Claude Code / Cursor (``{"mcpServers": {...}}``)
and VS Code (``{"servers": {...}}`` in ``.vscode/mcp.json``, or
``{"mcp": {"servers": {...}}}`` in settings). Each entry is either
``command`` + ``args`` + ``env`` (+ ``cwd``) for stdio, or ``url`` +
``headers`` with ``type`` ``http`` (also ``streamable-http``,
``streamableHttp``) or ``sse``; a ``url`` with no ``type`` is tried over Streamable
HTTP, then SSE (``sse_fallback``), as Cursor and mcp-remote do. ``${env:VAR}``
(VS Code) reads as ``${VAR}``.

One bad entry never loses the others: :func:`parse_servers` returns the good
specs and one problem line per refused entry.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from chalie.mcp.spec import ServerSpec, SpecError, Transport, check_spec
from chalie.wire.mcp_names import BadSlug, slugify

MAX_FILE_BYTES: Final = 1 << 20
MAX_SERVERS: Final = 500
_TYPES: Final[dict[str, Transport]] = {
    "stdio": "stdio",
    "http": "http",
    "streamable-http": "http",
    "streamable_http": "http",
    "streamablehttp": "http",
    "sse": "sse",
}
_VSCODE_ENV: Final = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
_UNSUPPORTED_REF: Final = re.compile(r"\$\{(?!secret:)[A-Za-z_]*:[^}]*\}|\$\{[^}]*:-[^}]*\}")


class ImportFileError(ValueError):
    """The whole file is unusable (not JSON, too big, no server table)."""


@dataclass
class Parsed:
    specs: list[ServerSpec] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _table(doc: Any) -> Mapping[str, Any]:
    if not isinstance(doc, dict):
        raise ImportFileError("the file must hold a JSON object")
    for path in (("mcpServers",), ("servers",), ("mcp", "servers")):
        node: Any = doc
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            if not isinstance(node, dict):
                raise ImportFileError(f"{'.'.join(path)} must be an object of servers")
            return node
    raise ImportFileError("no mcpServers (or servers) table in the file")


def _vscode(value: Any) -> Any:
    if isinstance(value, str):
        return _VSCODE_ENV.sub(r"${\1}", value)
    if isinstance(value, list):
        return [_vscode(v) for v in value]
    if isinstance(value, dict):
        return {k: _vscode(v) for k, v in value.items()}
    return value


def _strings(where: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{where} must be a list of strings")
    return list(value)


def _unsupported_refs(entry: Mapping[str, Any]) -> str | None:
    text = json.dumps(entry)
    m = _UNSUPPORTED_REF.search(text)
    return m.group(0)[:60] if m else None


def spec_from_entry(name: str, entry: Any, *, enabled: bool = True) -> ServerSpec:
    """One ``mcpServers`` entry as a checked spec; SpecError naming what is wrong."""
    if not isinstance(entry, dict):
        raise SpecError("an entry must be an object")
    entry = _vscode(entry)
    bad = _unsupported_refs(entry)
    if bad:
        raise SpecError(f"unsupported reference {bad} (use ${{VAR}} for environment variables)")
    try:
        slug = slugify(name)
    except BadSlug as exc:
        raise SpecError(str(exc)) from None
    kind = entry.get("type") or entry.get("transport")
    if kind is not None and (not isinstance(kind, str) or kind.lower() not in _TYPES):
        raise SpecError(f"unknown type {str(kind)[:30]!r}; use stdio, http or sse")
    url = entry.get("url") or entry.get("serverUrl")
    transport: Transport
    if kind is not None:
        transport = _TYPES[kind.lower()]
    else:
        transport = "http" if url is not None else "stdio"
    # No type with a url: Streamable HTTP, else SSE (what Cursor and mcp-remote do).
    fallback = kind is None and url is not None
    disabled = entry.get("disabled", False)
    if not isinstance(disabled, bool):
        raise SpecError("disabled must be true or false")
    common: dict[str, Any] = {"name": slug, "enabled": enabled and not disabled}
    common.update(_options(entry))
    if transport == "stdio":
        command = entry.get("command")
        if not isinstance(command, str) or not command.strip():
            raise SpecError("a stdio server needs a command")
        env = entry.get("env") or {}
        cwd = entry.get("cwd") or ""
        if not isinstance(cwd, str):
            raise SpecError("cwd must be a string")
        spec = ServerSpec(
            transport="stdio",
            command=command,
            args=tuple(_strings("args", entry.get("args"))),
            env=env,
            cwd=cwd,
            **common,
        )
    else:
        if not isinstance(url, str):
            raise SpecError(f"an {transport} server needs a url")
        spec = ServerSpec(
            transport=transport,
            url=url,
            headers=entry.get("headers") or {},
            sse_fallback=fallback,
            **common,
        )
    return check_spec(spec)


# Per-server options an entry may carry (seconds; both spellings), beyond the transport's.
_OPTIONS: Final = {
    "timeout": "call_timeout",
    "callTimeout": "call_timeout",
    "call_timeout": "call_timeout",
    "connectTimeout": "connect_timeout",
    "connect_timeout": "connect_timeout",
    "heartbeat": "heartbeat",
    "roots": "roots",
    "samplingTokens": "sampling_tokens",
    "sampling_tokens": "sampling_tokens",
    "channels": "channels",
    "oauth": "oauth",
    "oauthClientId": "oauth_client_id",
    "oauth_client_id": "oauth_client_id",
    "oauthClientSecret": "oauth_client_secret",
    "oauth_client_secret": "oauth_client_secret",
    "oauthScope": "oauth_scope",
    "oauth_scope": "oauth_scope",
    "oauthRedirectPort": "oauth_redirect_port",
    "oauth_redirect_port": "oauth_redirect_port",
}


def _options(entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, name in _OPTIONS.items():
        if key in entry:
            if name in out:
                raise SpecError(f"{key} repeats another spelling of {name}")
            value = entry[key]
            listed = name in ("roots", "channels") and isinstance(value, list)
            out[name] = tuple(value) if listed else value
    return out


def parse_servers(text: str | bytes) -> Parsed:
    """Every server of an ``mcpServers`` file; ImportFileError only for an unusable file."""
    if len(text) > MAX_FILE_BYTES:
        raise ImportFileError(f"the file is larger than {MAX_FILE_BYTES // 1024} KiB")
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImportFileError(f"the file is not valid JSON ({str(exc)[:120]})") from None
    table = _table(doc)
    if len(table) > MAX_SERVERS:
        raise ImportFileError(f"the file lists more than {MAX_SERVERS} servers")
    out = Parsed()
    seen: dict[str, str] = {}
    for name, entry in table.items():
        shown = str(name)[:40]
        try:
            spec = spec_from_entry(str(name), entry)
        except SpecError as exc:
            out.problems.append(f"{shown}: {exc}")
            continue
        if spec.name in seen:
            out.problems.append(f"{shown}: its slug {spec.name!r} is taken by {seen[spec.name]!r}")
            continue
        seen[spec.name] = shown
        out.specs.append(spec)
    return out


def spec_from_options(
    name: str,
    *,
    command: str | None = None,
    args: Sequence[str] = (),
    url: str | None = None,
    transport: str | None = None,
    headers: Sequence[str] = (),
    env: Sequence[str] = (),
    cwd: str = "",
    options: dict[str, Any] | None = None,
) -> ServerSpec:
    """``chalie mcp add NAME --command ... | --url ...`` as a checked spec."""
    if (command is None) == (url is None):
        raise SpecError("give exactly one of --command or --url")

    def pairs(where: str, items: Sequence[str], sep: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in items:
            key, found, value = item.partition(sep)
            if not found:
                raise SpecError(f"{where} {item[:40]!r} must look like NAME{sep}VALUE")
            out[key.strip()] = value.strip() if where == "--header" else value
        return out

    entry: dict[str, Any]
    if command is not None:
        if transport not in (None, "stdio"):
            raise SpecError("--command makes a stdio server; --transport must be stdio")
        entry = {
            "command": command,
            "args": list(args),
            "env": pairs("--env", env, "="),
            "cwd": cwd,
        }
        if headers:
            raise SpecError("--header applies to --url servers only")
    else:
        if args or env or cwd:
            raise SpecError("--arg, --env and --cwd apply to --command servers only")
        entry = {
            "url": url,
            "type": transport or "http",
            "headers": pairs("--header", headers, ":"),
        }
    for key, value in (options or {}).items():
        if value is not None and value != ():
            entry[key] = list(value) if isinstance(value, tuple) else value
    return spec_from_entry(name, entry)

"""A connection's specification: transport, command or URL, headers, env, timeouts, roots; checked.

A :class:`ServerSpec` is what ``chalie.db`` stores for one remote server. It
never holds a raw secret: header values, secret-looking environment values
and URL credentials are references, either to the daemon's environment
(``${VAR}``) or to the 0600 secrets file (``${secret:ID}``, see
:mod:`chalie.mcp.secrets`). :func:`check_spec` is the one validation every
entry point (import, add, the mcp_manager ability, the store) goes through.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from chalie.wire.mcp_names import BadSlug, check_slug

Transport = Literal["stdio", "http", "sse"]
TRANSPORTS: Final[tuple[str, ...]] = ("stdio", "http", "sse")
# "auto": 2026-07-28 with peers that offer it, else the 2025-11-25 handshake; "legacy": always
# the handshake (an operator's choice for a peer whose modern path misbehaves).
Protocol = Literal["auto", "legacy"]

MAX_ARGS: Final = 128
MAX_ARG: Final = 4096
MAX_ENTRIES: Final = 64
MAX_VALUE: Final = 8192
MAX_URL: Final = 2048
MAX_ROOTS: Final = 64
MAX_SAMPLING_TOKENS: Final = 100_000_000
HEADER_NAME: Final = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
ENV_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# A reference inside a value: ${VAR} (the daemon's environment) or ${secret:ID}.
REF: Final = re.compile(r"\$\{(secret:)?([A-Za-z_][A-Za-z0-9_.-]{0,127})\}")
# Environment variable names that hold credentials by convention.
SECRET_NAME: Final = re.compile(
    r"(KEY|TOKEN|SECRET|PASS|PASSWORD|PASSWD|AUTH|CREDENTIAL|CREDENTIALS|PAT|PRIVATE|COOKIE|SESSION)",
    re.IGNORECASE,
)


class SpecError(ValueError):
    """A connection specification that cannot be used; the message names the field."""


CHANNEL: Final = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
MAX_CHANNELS: Final = 32


class ServerSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One remote MCP server as stored (secrets only as references)."""

    name: str
    transport: Transport
    # An http server whose Streamable HTTP attempt fails is tried over SSE (set for an
    # imported entry with a url and no type, as the clients it was copied from do).
    sse_fallback: bool = False
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    cwd: str = ""
    url: str = ""
    headers: dict[str, str] = {}
    enabled: bool = True
    protocol: Protocol = "auto"
    # None: the [mcp] config's default.
    connect_timeout: float | None = None
    call_timeout: float | None = None
    heartbeat: float | None = None
    # The roots this server is told about (file:// URIs); none by default.
    roots: tuple[str, ...] = ()
    # Model tokens this server's sampling requests may spend a day (None: the [mcp] default).
    sampling_tokens: int | None = None
    # The channels this server's tools are on (empty: everywhere find_tools is, as
    # before). When set, its tools are not discoverable and are callable only on
    # these channels (for a fetch server: ("web-browse",), off plain chat).
    channels: tuple[str, ...] = ()
    # OAuth 2.1 (chalie.mcp.oauth): the grant comes from `chalie mcp login NAME`. A
    # pre-registered client gives its id (and secret, sealed as a reference) and the
    # loopback port its redirect URI was registered with; without one the client registers.
    oauth: bool = False
    oauth_client_id: str = ""
    oauth_client_secret: str = ""
    oauth_scope: str = ""
    oauth_redirect_port: int | None = None

    def timeout(self, default: float) -> float:
        """Seconds a call of this server's tools may take: its own, else the default."""
        return self.call_timeout or default


def _text(field: str, value: Any, limit: int, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise SpecError(f"{field} must be a string, not {type(value).__name__}")
    if not empty and not value.strip():
        raise SpecError(f"{field} must not be empty")
    if len(value) > limit:
        raise SpecError(f"{field} is longer than {limit} characters")
    if "\x00" in value:
        raise SpecError(f"{field} contains a NUL character")
    return value


def _no_line_breaks(field: str, value: str) -> None:
    if any(c in value for c in "\r\n"):
        raise SpecError(f"{field} must not contain line breaks")


def _mapping(field: str, value: Any, key_rule: re.Pattern[str]) -> dict[str, str]:
    if not isinstance(value, dict):
        raise SpecError(f"{field} must be an object of strings")
    if len(value) > MAX_ENTRIES:
        raise SpecError(f"{field} has more than {MAX_ENTRIES} entries")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key_rule.match(key):
            raise SpecError(f"{field} has an invalid name {str(key)[:40]!r}")
        text = _text(f"{field}.{key}", item, MAX_VALUE)
        if field == "headers":
            _no_line_breaks(f"headers.{key}", text)
        out[key] = text
    return out


def _timeout(field: str, value: Any, low: float, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise SpecError(f"{field} must be a number of seconds from {low:g} to {high:g}")
    return float(value)


def root_uri(value: Any) -> str:
    """A root as a file:// URI: an absolute path or a file:// URI; SpecError otherwise."""
    text = _text("roots[]", value, MAX_ARG, empty=False)
    _no_line_breaks("roots[]", text)
    if text.startswith("file://"):
        path = text[len("file://") :]
        if not path.startswith("/"):
            raise SpecError(f"root {text[:60]!r} must be file:///absolute/path")
        return text
    if "://" in text:
        raise SpecError(f"root {text[:60]!r} is not a file:// URI (only local roots are given)")
    if not text.startswith("/"):
        raise SpecError(f"root {text[:60]!r} must be an absolute path")
    return Path(text).as_uri()


def check_roots(value: Any) -> tuple[str, ...]:
    if not isinstance(value, tuple | list) or len(value) > MAX_ROOTS:
        raise SpecError(f"roots must be a list of at most {MAX_ROOTS} paths or file:// URIs")
    return tuple(dict.fromkeys(root_uri(r) for r in value))


def check_spec(spec: ServerSpec) -> ServerSpec:
    """The spec itself once every field passes; SpecError naming the first one that does not."""
    try:
        check_slug(spec.name)
    except BadSlug as exc:
        raise SpecError(str(exc)) from None
    if spec.transport not in TRANSPORTS:
        raise SpecError(f"transport must be one of {', '.join(TRANSPORTS)}")
    if spec.protocol not in ("auto", "legacy"):
        raise SpecError("protocol must be auto or legacy")
    env = _mapping("env", spec.env, ENV_NAME)
    headers = _mapping("headers", spec.headers, HEADER_NAME)
    if spec.transport == "stdio":
        _text("command", spec.command, MAX_ARG, empty=False)
        if spec.url or spec.headers:
            raise SpecError("a stdio server takes a command, not a url or headers")
        if not isinstance(spec.args, tuple | list) or len(spec.args) > MAX_ARGS:
            raise SpecError(f"args must be a list of at most {MAX_ARGS} strings")
        for i, arg in enumerate(spec.args):
            _text(f"args[{i}]", arg, MAX_ARG)
        _text("cwd", spec.cwd, MAX_ARG)
    else:
        url = _text("url", spec.url, MAX_URL, empty=False)
        _no_line_breaks("url", url)
        if not re.match(r"^https?://[^/\s]+", url):
            raise SpecError("url must be an http:// or https:// address")
        if spec.command or spec.args or spec.cwd or spec.env:
            raise SpecError(f"an {spec.transport} server takes a url, not a command or env")
    if spec.sse_fallback and spec.transport != "http":
        raise SpecError("sse_fallback is for an http server (it tries SSE when HTTP fails)")
    channels = tuple(spec.channels) if isinstance(spec.channels, tuple | list) else ("",)
    if len(channels) > MAX_CHANNELS or not all(
        isinstance(c, str) and CHANNEL.match(c) for c in channels
    ):
        raise SpecError(
            f"channels must be at most {MAX_CHANNELS} channel names "
            "(lowercase letters, digits, - or _)"
        )
    _check_oauth(spec)
    return msgspec.structs.replace(
        spec,
        channels=tuple(dict.fromkeys(channels)),
        env=env,
        headers=headers,
        args=tuple(spec.args),
        connect_timeout=_timeout("connect_timeout", spec.connect_timeout, 0.1, 600),
        call_timeout=_timeout("call_timeout", spec.call_timeout, 0.1, 86400),
        heartbeat=_timeout("heartbeat", spec.heartbeat, 1, 86400),
        roots=check_roots(spec.roots),
        sampling_tokens=_tokens(spec.sampling_tokens),
    )


def _check_oauth(spec: ServerSpec) -> None:
    fields = (spec.oauth_client_id, spec.oauth_client_secret, spec.oauth_scope)
    if not spec.oauth:
        if any(fields) or spec.oauth_redirect_port is not None:
            raise SpecError("oauth_* settings need oauth = true")
        return
    if spec.transport != "http":
        raise SpecError("oauth is for Streamable HTTP servers (transport http)")
    for field, value in zip(
        ("oauth_client_id", "oauth_client_secret", "oauth_scope"), fields, strict=True
    ):
        _text(field, value, 512)
        _no_line_breaks(field, value)
    if spec.oauth_client_secret and not spec.oauth_client_id:
        raise SpecError("oauth_client_secret needs oauth_client_id")
    port = spec.oauth_redirect_port
    if port is not None and (isinstance(port, bool) or not 1024 <= port <= 65535):
        raise SpecError("oauth_redirect_port must be a port from 1024 to 65535")
    if spec.oauth_client_id and port is None:
        raise SpecError("a pre-registered client (oauth_client_id) needs oauth_redirect_port")


def _tokens(value: Any) -> int | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 0 <= value <= MAX_SAMPLING_TOKENS
    ):
        raise SpecError(f"sampling_tokens must be a whole number from 0 to {MAX_SAMPLING_TOKENS}")
    return value


def references(value: str) -> list[tuple[bool, str]]:
    """The references in a value: (is_secret_file, name) pairs."""
    return [(bool(m.group(1)), m.group(2)) for m in REF.finditer(value)]


def encode_spec(spec: ServerSpec) -> str:
    return msgspec.json.encode(spec).decode()


def decode_spec(text: str | bytes) -> ServerSpec:
    try:
        return check_spec(msgspec.json.decode(text, type=ServerSpec))
    except msgspec.ValidationError as exc:
        raise SpecError(str(exc)) from None

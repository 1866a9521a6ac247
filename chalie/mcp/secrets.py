"""Secrets of MCP connections: the 0600 secrets file, sealing literals into it, resolving refs.

Three operations, one place:

1. :func:`seal`: a spec as the operator typed it → a spec safe to store. Every
   header value, every environment value whose name looks like a credential
   (``*_TOKEN``, ``*_KEY``, ...) and every password or credential-looking
   query value in a URL that is not already a reference moves into the
   secrets file as ``${secret:<server>.<where>}``.
2. :func:`resolve`: a stored spec → the spec a transport gets, references
   replaced by values from the daemon's environment and the secrets file. A
   missing one raises :class:`MissingSecret` naming it (never a value).
3. :func:`shown`: a stored spec as a dict for display: references as they
   are, any other header value masked (``<hidden, 41 characters>``).

The file (``<home>/mcp-secrets.json``) is written atomically and 0600; it is
never logged and never returned by a command.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import msgspec

from chalie.mcp.spec import REF, SECRET_NAME, ServerSpec

FILE_NAME: Final = "mcp-secrets.json"
_ID_SAFE: Final = re.compile(r"[^a-z0-9_.-]+")


class MissingSecret(LookupError):
    """A reference whose value is not available; the message names the reference only."""


class SecretFile:
    """``<home>/mcp-secrets.json``: id → value, 0600, replaced atomically on every change."""

    def __init__(self, home: Path) -> None:
        self.path = Path(home) / FILE_NAME
        self._lock = threading.Lock()

    def _read(self) -> dict[str, str]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise MissingSecret(
                f"the MCP secrets file {self.path} is unreadable ({type(exc).__name__})"
            ) from None
        return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}

    def _write(self, data: Mapping[str, str]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(dict(sorted(data.items())), f)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)

    def get(self, secret_id: str) -> str | None:
        with self._lock:
            return self._read().get(secret_id)

    def put(self, values: Mapping[str, str]) -> None:
        if not values:
            return
        with self._lock:
            data = self._read()
            data.update(values)
            self._write(data)

    def drop_ids(self, ids: list[str]) -> None:
        with self._lock:
            data = self._read()
            if any(i in data for i in ids):
                self._write({k: v for k, v in data.items() if k not in ids})

    def drop_server(self, server: str) -> int:
        """Forget every secret of one server; returns how many."""
        with self._lock:
            data = self._read()
            keep = {k: v for k, v in data.items() if not k.startswith(f"{server}.")}
            if len(keep) != len(data):
                self._write(keep)
            return len(data) - len(keep)


def _has_ref(value: str) -> bool:
    return REF.search(value) is not None


def _secret_id(server: str, where: str) -> str:
    return f"{server}.{_ID_SAFE.sub('_', where.lower())}"


def _seal_url(server: str, url: str, found: dict[str, str]) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password and not _has_ref(parts.password):
        sid = _secret_id(server, "url.password")
        found[sid] = urllib.parse.unquote(parts.password)
        url = url.replace(f":{parts.password}@", f":${{secret:{sid}}}@", 1)
    for key, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if value and SECRET_NAME.search(key) and not _has_ref(value):
            sid = _secret_id(server, f"url.{key}")
            found[sid] = value
            quoted = urllib.parse.quote(value, safe="")
            for raw in (f"{key}={quoted}", f"{key}={value}"):
                if raw in url:
                    url = url.replace(raw, f"{key}=${{secret:{sid}}}", 1)
                    break
    return url


def seal(spec: ServerSpec, secrets: SecretFile) -> ServerSpec:
    """The spec with every literal secret moved into the secrets file (see the module doc)."""
    found: dict[str, str] = {}
    headers = {}
    for key, value in spec.headers.items():
        if value and not _has_ref(value):
            sid = _secret_id(spec.name, f"header.{key}")
            found[sid] = value
            value = f"${{secret:{sid}}}"
        headers[key] = value
    env = {}
    for key, value in spec.env.items():
        if value and SECRET_NAME.search(key) and not _has_ref(value):
            sid = _secret_id(spec.name, f"env.{key}")
            found[sid] = value
            value = f"${{secret:{sid}}}"
        env[key] = value
    url = _seal_url(spec.name, spec.url, found) if spec.url else spec.url
    client_secret = spec.oauth_client_secret
    if client_secret and not _has_ref(client_secret):
        sid = _secret_id(spec.name, "oauth.client_secret")
        found[sid] = client_secret
        client_secret = f"${{secret:{sid}}}"
    secrets.put(found)
    return msgspec.structs.replace(
        spec, headers=headers, env=env, url=url, oauth_client_secret=client_secret
    )


def _substitute(value: str, secrets: SecretFile, environ: Mapping[str, str], where: str) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1):
            found = secrets.get(m.group(2))
            if found is None:
                raise MissingSecret(
                    f"{where}: the secret {m.group(2)!r} is not in the secrets file"
                )
            return found
        env = environ.get(m.group(2))
        if env is None:
            raise MissingSecret(f"{where}: the environment variable {m.group(2)} is not set")
        return env

    return REF.sub(one, value)


def resolve(
    spec: ServerSpec, secrets: SecretFile, environ: Mapping[str, str] | None = None
) -> ServerSpec:
    """The spec with references replaced by their values; for a transport only, never stored."""
    environ = os.environ if environ is None else environ
    return msgspec.structs.replace(
        spec,
        headers={
            k: _substitute(v, secrets, environ, f"header {k}") for k, v in spec.headers.items()
        },
        env={k: _substitute(v, secrets, environ, f"env {k}") for k, v in spec.env.items()},
        url=_substitute(spec.url, secrets, environ, "url"),
        args=tuple(_substitute(a, secrets, environ, "args") for a in spec.args),
        oauth_client_secret=_substitute(
            spec.oauth_client_secret, secrets, environ, "oauth_client_secret"
        ),
    )


def mask(value: str) -> str:
    return f"<hidden, {len(value)} characters>"


def shown(spec: ServerSpec) -> dict[str, Any]:
    """The spec for display: references kept, literal header values masked."""
    out: dict[str, Any] = msgspec.to_builtins(spec)
    out["headers"] = {k: v if _has_ref(v) else mask(v) for k, v in spec.headers.items()}
    secret = spec.oauth_client_secret
    out["oauth_client_secret"] = secret if not secret or _has_ref(secret) else mask(secret)
    out["env"] = {
        k: v if _has_ref(v) or not SECRET_NAME.search(k) else mask(v) for k, v in spec.env.items()
    }
    return out

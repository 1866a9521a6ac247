"""OAuth 2.1 for remote MCP servers, as the MCP authorization spec describes it.

The flow itself is the mcp SDK's ``OAuthClientProvider`` (an ``httpx2.Auth``):
on a 401 it discovers the server's protected-resource metadata (RFC 9728),
then its authorization server's metadata (RFC 8414), registers a client
(RFC 7591) unless one is pre-registered (the spec's ``oauth_client_id``), runs
the authorization code grant with PKCE (S256) and refreshes expiring tokens.
What Chalie adds:

- :class:`SecretTokens`: the grant lives in the 0600 MCP secrets file
  (``<server>.oauth.tokens``, ``.client``, ``.server``), with the access token's
  absolute expiry so a restarted daemon refreshes instead of asking again.
- Two ways to run the provider. In the daemon (:func:`daemon_auth`) nobody can
  be sent to a browser: when the flow needs a person (no grant, or the grant
  was revoked or expired beyond refreshing) it raises :class:`LoginRequired`
  and the server shows as needing login. ``chalie mcp login NAME``
  (:func:`login`) prints the URL to open, waits on a loopback redirect
  (``http://127.0.0.1:<port>/callback``), stores the grant and proves it
  with one listing of the server's tools.
- :func:`revoke`: on ``chalie mcp remove`` the refresh and access tokens are
  revoked at the authorization server (RFC 7009) before they are forgotten.

No token is ever logged or returned by a command; the link scrubs them from
error text like any other secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, Final

import httpx2
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from pydantic import ValidationError

from chalie.mcp.secrets import SecretFile
from chalie.mcp.spec import ServerSpec

log = logging.getLogger("chalie.mcp")

CLIENT_NAME: Final = "Chalie"
CALLBACK_PATH: Final = "/callback"
MAX_CALLBACK: Final = 8192  # bytes of the redirect's request line and headers read
REVOKE_TIMEOUT: Final = 5.0


class LoginRequired(Exception):
    """The grant needs a person (none yet, revoked, or expired beyond refreshing)."""


class LoginFailed(Exception):
    """``chalie mcp login`` did not get a grant; the message says why (no secret in it)."""


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def login_hint(server: str) -> str:
    return f"run chalie mcp login {server}"


def _ids(server: str) -> tuple[str, str, str]:
    return f"{server}.oauth.tokens", f"{server}.oauth.client", f"{server}.oauth.server"


class SecretTokens(TokenStorage):
    """A server's grant in the 0600 secrets file (see the module doc)."""

    def __init__(self, secrets: SecretFile, spec: ServerSpec) -> None:
        self._secrets = secrets
        self._spec = spec
        self._tokens_id, self._client_id, self._server_id = _ids(spec.name)

    def _load(self, key: str) -> dict[str, Any] | None:
        raw = self._secrets.get(key)
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def tokens(self) -> OAuthToken | None:
        held = self._load(self._tokens_id)
        if held is None:
            return None
        expires_at = held.pop("expires_at", None)
        if isinstance(expires_at, int | float):
            held["expires_in"] = int(expires_at - time.time())
        try:
            return OAuthToken.model_validate(held)
        except ValidationError:
            return None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens()

    async def set_tokens(self, tokens: OAuthToken) -> None:
        data = tokens.model_dump(mode="json", exclude_none=True)
        if tokens.expires_in is not None:
            data["expires_at"] = time.time() + float(tokens.expires_in)
        self._secrets.put({self._tokens_id: json.dumps(data)})

    def client(self) -> OAuthClientInformationFull | None:
        spec = self._spec
        if spec.oauth_client_id:  # pre-registered: from the spec (its secret resolved)
            return OAuthClientInformationFull(
                client_id=spec.oauth_client_id,
                client_secret=spec.oauth_client_secret or None,
                redirect_uris=None,
                token_endpoint_auth_method=(
                    "client_secret_post" if spec.oauth_client_secret else "none"
                ),
            )
        held = self._load(self._client_id)
        if held is None:
            return None
        try:
            return OAuthClientInformationFull.model_validate(held)
        except ValidationError:
            return None

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client()

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        if self._spec.oauth_client_id:
            return  # a pre-registered client is the operator's, not ours to replace
        self._secrets.put({self._client_id: client_info.model_dump_json(exclude_none=True)})

    def forget_client(self) -> None:
        """Drop a dynamically registered client (its redirect URI held another port)."""
        self._secrets.drop_ids([self._client_id])

    def server(self) -> dict[str, Any]:
        return self._load(self._server_id) or {}

    def set_server(self, metadata: dict[str, Any]) -> None:
        self._secrets.put({self._server_id: json.dumps(metadata)})

    def secrets(self) -> list[str]:
        """The values error text must never show (for the link's scrubber)."""
        held = self.tokens()
        out = [held.access_token, held.refresh_token or ""] if held is not None else []
        client = self.client()
        if client is not None and client.client_secret:
            out.append(client.client_secret)
        return [s for s in out if len(s) >= 4]


class Provider(OAuthClientProvider):
    """The SDK's provider, also loading the stored token's expiry (so it refreshes in time)."""

    async def _initialize(self) -> None:
        await super()._initialize()
        tokens = self.context.current_tokens
        if tokens is not None and tokens.expires_in is not None:
            self.context.update_token_expiry(tokens)


def client_metadata(spec: ServerSpec, redirect_uri: str) -> OAuthClientMetadata:
    return OAuthClientMetadata.model_validate(
        {
            "client_name": CLIENT_NAME,
            "redirect_uris": [redirect_uri],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": (
                "client_secret_post" if spec.oauth_client_secret else "none"
            ),
            "scope": spec.oauth_scope or None,
        }
    )


def redirect_uri(port: int) -> str:
    return f"http://127.0.0.1:{port}{CALLBACK_PATH}"


def daemon_auth(
    spec: ServerSpec, secrets: SecretFile, on_needed: Callable[[], None] = lambda: None
) -> tuple[Provider, SecretTokens]:
    """The provider a daemon's connection uses: refreshes by itself, never asks a person
    (``on_needed`` hears that it would have to)."""
    storage = SecretTokens(secrets, spec)

    async def nobody(*_: Any) -> Any:
        on_needed()
        raise LoginRequired(login_hint(spec.name))

    provider = Provider(
        server_url=spec.url,
        client_metadata=client_metadata(spec, redirect_uri(spec.oauth_redirect_port or 1)),
        storage=storage,
        redirect_handler=nobody,
        callback_handler=nobody,
    )
    return provider, storage


# -- chalie mcp login ----------------------------------------------------------------------


class Callback:
    """The loopback redirect target: one request to /callback, its code and state."""

    def __init__(self) -> None:
        self.result: asyncio.Future[AuthorizationCodeResult] | None = None
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, port: int) -> None:
        self.result = asyncio.get_running_loop().create_future()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            writer.close()
            return
        line = head[:MAX_CALLBACK].split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        target = urllib.parse.urlsplit(parts[1] if len(parts) >= 2 else "")
        query = dict(urllib.parse.parse_qsl(target.query))
        status, text = "404 Not Found", "Not the callback."
        if target.path == CALLBACK_PATH and self.result is not None and not self.result.done():
            if query.get("code"):
                self.result.set_result(
                    AuthorizationCodeResult(
                        code=query["code"], state=query.get("state"), iss=query.get("iss")
                    )
                )
                status, text = "200 OK", "Chalie is connected. You can close this window."
            else:
                why = query.get("error", "no code")[:100]
                self.result.set_exception(LoginRequired(f"the authorization was refused ({why})"))
                status, text = "400 Bad Request", "The authorization was refused."
        body = text.encode()
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(Exception):
            await writer.drain()
        writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


async def login(
    spec: ServerSpec,
    secrets: SecretFile,
    show: Callable[[str], None],
    *,
    timeout: float = 300.0,
    verify: Any = True,
) -> dict[str, Any]:
    """Authorize Chalie at the server's authorization server and store the grant.

    ``spec`` is resolved (its client secret a value). ``show`` gets the URL the owner
    opens; this waits up to ``timeout`` seconds for the loopback redirect. Returns what
    the proven connection saw (the protocol and how many tools)."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    storage = SecretTokens(secrets, spec)
    callback = Callback()
    await callback.start(spec.oauth_redirect_port or 0)
    if not spec.oauth_client_id:
        storage.forget_client()  # a dynamic registration names the redirect URI's port
    secrets.drop_ids([_ids(spec.name)[0]])  # a login is a new grant

    async def redirect(url: str) -> None:
        show(url)

    async def wait() -> AuthorizationCodeResult:
        assert callback.result is not None
        return await asyncio.wait_for(asyncio.shield(callback.result), timeout)

    provider = Provider(
        server_url=spec.url,
        client_metadata=client_metadata(spec, redirect_uri(callback.port)),
        storage=storage,
        redirect_handler=redirect,
        callback_handler=wait,
    )
    try:
        async with httpx2.AsyncClient(
            auth=provider, verify=verify, headers=dict(spec.headers), timeout=30.0
        ) as http:
            async with Client(streamable_http_client(spec.url, http_client=http)) as client:
                listed = await client.list_tools()
                protocol = str(client.protocol_version)
    except BaseException as exc:
        leaf = _leaf(exc)
        if isinstance(leaf, TimeoutError):
            raise TimeoutError("nobody completed the authorization in time") from None
        if isinstance(leaf, asyncio.CancelledError | KeyboardInterrupt):
            raise
        raise LoginFailed(f"{type(leaf).__name__}: {str(leaf)[:300]}") from None
    finally:
        await callback.close()
    meta = provider.context.oauth_metadata
    if meta is not None:
        storage.set_server(
            {
                "issuer": str(meta.issuer),
                "token_endpoint": str(meta.token_endpoint),
                "revocation_endpoint": (
                    str(meta.revocation_endpoint) if meta.revocation_endpoint else None
                ),
            }
        )
    if storage.tokens() is None:
        raise LoginFailed("the authorization server gave no token")
    return {"name": spec.name, "protocol": protocol, "tools": len(listed.tools)}


def revoke(spec: ServerSpec, secrets: SecretFile, *, verify: Any = True) -> int:
    """Revoke the server's grant at its authorization server (RFC 7009); how many tokens
    it accepted. Never raises: a grant that cannot be revoked is still forgotten after."""
    storage = SecretTokens(secrets, spec)
    endpoint = storage.server().get("revocation_endpoint")
    tokens = storage.tokens()
    client = storage.client()
    if not endpoint or tokens is None or client is None:
        return 0
    done = 0
    pairs = [("refresh_token", tokens.refresh_token), ("access_token", tokens.access_token)]
    try:
        with httpx2.Client(verify=verify, timeout=REVOKE_TIMEOUT) as http:
            for hint, value in pairs:
                if not value:
                    continue
                form = {"token": value, "token_type_hint": hint, "client_id": client.client_id}
                if client.client_secret:
                    form["client_secret"] = client.client_secret
                response = http.post(str(endpoint), data=form)
                done += response.status_code == 200
    except Exception as exc:
        log.warning("revoking the grant of %s failed: %s", spec.name, type(exc).__name__)
    return done


__all__ = [
    "LoginFailed",
    "LoginRequired",
    "Provider",
    "SecretTokens",
    "daemon_auth",
    "login",
    "login_hint",
    "revoke",
]

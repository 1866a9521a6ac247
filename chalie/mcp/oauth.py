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
import hmac
import json
import logging
import time
import urllib.parse
from collections.abc import AsyncGenerator, Callable
from ipaddress import ip_address
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
from chalie.net.loopback import HOST, NETS, is_loopback
from chalie.net.ssrf import AllowEntry, Blocked, Guard, Resolver, Target, system_resolver

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


class AuthGuard:
    """The SSRF guard (:mod:`chalie.net.ssrf`) for a server's authorization-server URLs.

    The protected-resource and authorization-server metadata name the URLs the flow
    then fetches (metadata, registration, token, revocation): a hostile server could
    point them into the owner's network. Each is checked, every address its name
    resolves to, and the request is pinned to the checked address (the name kept for
    the Host header and TLS), so nothing resolves it again. Only public addresses pass,
    and loopback too when the configured MCP server itself is on loopback (a local
    server's own authorization server; the tests'); nothing else is allowed.
    """

    def __init__(self, server_url: str, resolver: Resolver | None = None) -> None:
        self._server = server_url
        self._resolver = resolver or system_resolver
        self._guard: Guard | None = None

    def guard(self) -> Guard:
        """The guard, its loopback allowance decided by the configured server (blocking)."""
        if self._guard is None:
            allow: tuple[AllowEntry, ...] = ()
            if self._is_loopback():
                allow = tuple(AllowEntry.parse(net) for net in NETS)
            self._guard = Guard(allow, self._resolver)
        return self._guard

    def _is_loopback(self) -> bool:
        try:
            host, port = Guard().check_url(self._server)
            found = [host] if _is_ip(host) else self._resolver(host, port)
        except (Blocked, OSError):
            return False
        return bool(found) and all(_is_ip(a) and is_loopback(a) for a in found)

    def check(self, url: str) -> Target:
        """The checked destination of ``url``; Blocked when it is refused (blocking)."""
        return self.guard().check(url)

    def pin(self, request: httpx2.Request, target: Target) -> None:
        """Send ``request`` to the checked address, its name kept for Host and TLS."""
        url = request.url
        if url.host != target.address:
            if url.scheme == "https":
                request.extensions = {**request.extensions, "sni_hostname": url.host}
            request.url = url.copy_with(host=target.address)

    async def admit(self, request: httpx2.Request) -> None:
        """Check and pin one request of the flow (the lookup off the loop)."""
        target = await asyncio.to_thread(self.check, str(request.url))
        self.pin(request, target)


def _is_ip(text: str) -> bool:
    try:
        ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


class Provider(OAuthClientProvider):
    """The SDK's provider, with what Chalie adds to it:

    - the stored token's expiry is loaded, so it refreshes in time;
    - a 401 on a token believed valid (revoked at the provider, its expiry wrong) is
      answered by one refresh and the request sent again, before the SDK's full flow
      (which in the daemon is needs-login); a refused refresh goes on to that flow;
    - every request of the flow other than the authenticated one (discovery,
      registration, token, redirects of them) passes the SSRF guard (:class:`AuthGuard`).
    """

    def __init__(self, *args: Any, guard: AuthGuard | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guard = guard

    async def _initialize(self) -> None:
        await super()._initialize()
        tokens = self.context.current_tokens
        if tokens is not None and tokens.expires_in is not None:
            self.context.update_token_expiry(tokens)

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        flow = super().async_auth_flow(request)
        try:
            outgoing = await flow.__anext__()
            while True:
                if outgoing is not request and self._guard is not None:
                    await self._guard.admit(outgoing)
                response = yield outgoing
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            return
        finally:
            await flow.aclose()

    async def _auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        inner = super()._auth_flow(request)
        refreshed = False
        try:
            outgoing = await inner.__anext__()
            while True:
                response = yield outgoing
                if (
                    outgoing is request
                    and response.status_code == 401
                    and not refreshed
                    and self.context.can_refresh_token()
                ):
                    refreshed = True  # once: a refused refresh goes on to the SDK's flow
                    log.info("a token believed valid was refused: refreshing it once")
                    answer = yield await self._refresh_token()
                    if await self._handle_refresh_response(answer):
                        self._add_auth_header(request)
                        again = yield request
                        if again.status_code != 401:
                            return
                        response = again
                outgoing = await inner.asend(response)
        except StopAsyncIteration:
            return
        finally:
            await inner.aclose()


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
    return f"http://{HOST}:{port}{CALLBACK_PATH}"


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
        guard=AuthGuard(spec.url),
    )
    return provider, storage


# -- chalie mcp login ----------------------------------------------------------------------


class Callback:
    """The loopback redirect target: one request to /callback, its code and state.

    Any local process can reach it: a request whose ``state`` is not this login's (once the
    authorization URL named it, :meth:`expect`) gets 400 and the login keeps waiting for
    the owner's browser."""

    def __init__(self) -> None:
        self.result: asyncio.Future[AuthorizationCodeResult] | None = None
        self._server: asyncio.Server | None = None
        self.port = 0
        self.state: str | None = None
        self.refused = 0

    def expect(self, authorization_url: str) -> None:
        """The state the authorization URL carries: the only one a callback may bring."""
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(authorization_url).query)
        found = query.get("state")
        self.state = found[0] if found else None

    async def start(self, port: int) -> None:
        self.result = asyncio.get_running_loop().create_future()
        self._server = await asyncio.start_server(self._serve, HOST, port)
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
        forged = self.state is not None and not hmac.compare_digest(
            query.get("state", "").encode(), self.state.encode()
        )
        if target.path == CALLBACK_PATH and forged:
            self.refused += 1
            log.warning("a login callback with another state was refused; still waiting")
            status, text = "400 Bad Request", "This is not the login Chalie is waiting for."
        elif target.path == CALLBACK_PATH and self.result is not None and not self.result.done():
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
        callback.expect(url)
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
        guard=AuthGuard(spec.url),
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
    guard = AuthGuard(spec.url)
    try:
        target = guard.check(str(endpoint))  # the SSRF guard, as for the flow's requests
        with httpx2.Client(verify=verify, timeout=REVOKE_TIMEOUT) as http:
            for hint, value in pairs:
                if not value:
                    continue
                form = {"token": value, "token_type_hint": hint, "client_id": client.client_id}
                if client.client_secret:
                    form["client_secret"] = client.client_secret
                request = http.build_request("POST", str(endpoint), data=form)
                guard.pin(request, target)
                response = http.send(request)
                done += response.status_code == 200
    except Blocked as exc:
        log.warning("the revocation endpoint of %s is refused: %s", spec.name, exc.reason)
    except Exception as exc:
        log.warning("revoking the grant of %s failed: %s", spec.name, type(exc).__name__)
    return done


__all__ = [
    "AuthGuard",
    "LoginFailed",
    "LoginRequired",
    "Provider",
    "SecretTokens",
    "daemon_auth",
    "login",
    "login_hint",
    "revoke",
]

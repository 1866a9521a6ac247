"""A fixture OAuth-protected MCP server: its own authorization server and resource server on one
loopback port.

``python -m tools.fixture_mcp.oauth_server [--ttl S] [--client ID:SECRET:REDIRECT] [--no-dcr]
[--token-endpoint URL]`` (the metadata names URL as its token endpoint: a hostile one)
prints ``PORT <n>``. The MCP endpoint ``/mcp`` (one tool, ``whoami``) answers 401
with ``WWW-Authenticate: Bearer resource_metadata=...`` unless the request carries a live
access token. The authorization server publishes RFC 9728 protected-resource
metadata and RFC 8414 metadata, registers clients (RFC 7591) unless ``--no-dcr``,
authorizes with PKCE S256 only (the "user" approves at once: ``/authorize``
redirects to the client's registered redirect URI with the code), issues
access tokens living ``--ttl`` seconds and rotating refresh tokens, and revokes
(RFC 7009). Test hooks: ``POST /admin/revoke`` (the owner revokes every grant at
the provider), ``POST /admin/revoke-access`` (every access token is revoked, the refresh
tokens still good), ``POST /admin/expire`` (every access token expires now),
``GET /admin/stats`` (counts of each step).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import secrets
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from chalie.net.listener import tcp_listener


@dataclass
class Grant:
    client_id: str
    refresh: str
    access: str
    expires: float
    revoked: bool = False
    access_revoked: bool = False  # the access token alone (its refresh token still good)


@dataclass
class State:
    base: str = ""
    ttl: float = 3600.0
    dcr: bool = True
    token_endpoint: str = ""  # what the metadata names as the token endpoint ("": ours)
    clients: dict[str, dict[str, Any]] = field(default_factory=dict)
    codes: dict[str, dict[str, Any]] = field(default_factory=dict)
    grants: list[Grant] = field(default_factory=list)
    stats: dict[str, int] = field(
        default_factory=lambda: {
            "registered": 0,
            "authorized": 0,
            "issued": 0,
            "refreshed": 0,
            "refused": 0,
            "revoked_by_client": 0,
            "unauthorized": 0,
        }
    )


S = State()


def error(status: int, code: str) -> JSONResponse:
    return JSONResponse({"error": code}, status_code=status)


async def prm(request: Request) -> Response:
    return JSONResponse(
        {
            "resource": f"{S.base}/mcp",
            "authorization_servers": [S.base],
            "bearer_methods_supported": ["header"],
        }
    )


async def asm(request: Request) -> Response:
    meta: dict[str, Any] = {
        "issuer": S.base,
        "authorization_endpoint": f"{S.base}/authorize",
        "token_endpoint": S.token_endpoint or f"{S.base}/token",
        "revocation_endpoint": f"{S.base}/revoke",
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["none", "client_secret_post"],
    }
    if S.dcr:
        meta["registration_endpoint"] = f"{S.base}/register"
    return JSONResponse(meta)


async def register(request: Request) -> Response:
    if not S.dcr:
        return error(404, "not_found")
    try:
        body = await request.json()
    except ValueError:
        return error(400, "invalid_client_metadata")
    uris = body.get("redirect_uris")
    if not isinstance(uris, list) or not uris:
        return error(400, "invalid_redirect_uri")
    client_id = "dyn-" + secrets.token_hex(6)
    S.clients[client_id] = {"redirect_uris": [str(u) for u in uris], "secret": None}
    S.stats["registered"] += 1
    return JSONResponse(
        {
            **body,
            "client_id": client_id,
            "client_id_issued_at": int(time.time()),
            "token_endpoint_auth_method": "none",
        },
        status_code=201,
    )


async def authorize(request: Request) -> Response:
    q = request.query_params
    client = S.clients.get(q.get("client_id", ""))
    redirect = q.get("redirect_uri", "")
    if client is None or redirect not in client["redirect_uris"]:
        return error(400, "invalid_client")
    if q.get("response_type") != "code" or q.get("code_challenge_method") != "S256":
        return error(400, "invalid_request")
    code = secrets.token_urlsafe(16)
    S.codes[code] = {
        "client_id": q["client_id"],
        "redirect_uri": redirect,
        "challenge": q.get("code_challenge", ""),
    }
    S.stats["authorized"] += 1
    sep = "&" if "?" in redirect else "?"
    args = urllib.parse.urlencode({"code": code, "state": q.get("state", ""), "iss": S.base})
    return RedirectResponse(f"{redirect}{sep}{args}", status_code=302)


def _issue(client_id: str) -> dict[str, Any]:
    grant = Grant(
        client_id=client_id,
        refresh="rt-" + secrets.token_urlsafe(24),
        access="at-" + secrets.token_urlsafe(24),
        expires=time.time() + S.ttl,
    )
    S.grants.append(grant)
    return {
        "access_token": grant.access,
        "token_type": "Bearer",
        "expires_in": int(S.ttl),
        "refresh_token": grant.refresh,
    }


def _client_ok(form: Any) -> str | None:
    client_id = str(form.get("client_id", ""))
    client = S.clients.get(client_id)
    if client is None:
        return None
    if client["secret"] is not None and form.get("client_secret") != client["secret"]:
        return None
    return client_id


async def token(request: Request) -> Response:
    form = await request.form()
    client_id = _client_ok(form)
    if client_id is None:
        return error(401, "invalid_client")
    kind = form.get("grant_type")
    if kind == "authorization_code":
        held = S.codes.pop(str(form.get("code", "")), None)
        verifier = str(form.get("code_verifier", ""))
        digest = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
        if (
            held is None
            or held["client_id"] != client_id
            or held["redirect_uri"] != form.get("redirect_uri")
            or digest.rstrip(b"=").decode() != held["challenge"]
        ):
            S.stats["refused"] += 1
            return error(400, "invalid_grant")
        S.stats["issued"] += 1
        return JSONResponse(_issue(client_id))
    if kind == "refresh_token":
        presented = str(form.get("refresh_token", ""))
        for grant in S.grants:
            if grant.refresh == presented and grant.client_id == client_id and not grant.revoked:
                grant.revoked = True  # rotated: the old pair is spent
                S.stats["refreshed"] += 1
                return JSONResponse(_issue(client_id))
        S.stats["refused"] += 1
        return error(400, "invalid_grant")
    return error(400, "unsupported_grant_type")


async def revoke(request: Request) -> Response:
    form = await request.form()
    presented = str(form.get("token", ""))
    for grant in S.grants:
        if presented in (grant.refresh, grant.access):
            grant.revoked = True
            S.stats["revoked_by_client"] += 1
    return Response(status_code=200)


async def admin_revoke(request: Request) -> Response:
    for grant in S.grants:
        grant.revoked = True
    return JSONResponse({"revoked": len(S.grants)})


async def admin_revoke_access(request: Request) -> Response:
    for grant in S.grants:
        grant.access_revoked = True
    return JSONResponse({"revoked": len(S.grants)})


async def admin_expire(request: Request) -> Response:
    for grant in S.grants:
        grant.expires = 0.0
    return JSONResponse({"expired": len(S.grants)})


async def admin_stats(request: Request) -> Response:
    live = sum(1 for g in S.grants if not g.revoked)
    return JSONResponse({**S.stats, "live_grants": live})


def live(header: str) -> str | None:
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    now = time.time()
    for grant in S.grants:
        if (
            grant.access == presented.strip()
            and not grant.revoked
            and not grant.access_revoked
            and grant.expires > now
        ):
            return grant.client_id
    return None


class Guarded:
    """/mcp needs a live access token; everything else is the authorization server."""

    def __init__(self, mcp_app: Any, oauth_app: Any) -> None:
        self.mcp_app, self.oauth_app = mcp_app, oauth_app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.mcp_app(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"].startswith("/mcp"):
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            if live(headers.get("authorization", "")) is None:
                S.stats["unauthorized"] += 1
                meta = (
                    f'Bearer resource_metadata="{S.base}/.well-known/oauth-protected-resource/mcp"'
                )
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"www-authenticate", meta.encode()),
                            (b"content-type", b"application/json"),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": b'{"error":"invalid_token"}'})
                return
            await self.mcp_app(scope, receive, send)
            return
        await self.oauth_app(scope, receive, send)


def build() -> Any:
    srv = MCPServer("guarded", version="1", log_level="WARNING")

    @srv.tool()
    def whoami() -> str:
        """Say that the caller got in."""
        return "you are in"

    oauth = Starlette(
        routes=[
            Route("/.well-known/oauth-protected-resource", prm),
            Route("/.well-known/oauth-protected-resource/mcp", prm),
            Route("/.well-known/oauth-authorization-server", asm),
            Route("/register", register, methods=["POST"]),
            Route("/authorize", authorize),
            Route("/token", token, methods=["POST"]),
            Route("/revoke", revoke, methods=["POST"]),
            Route("/admin/revoke", admin_revoke, methods=["POST"]),
            Route("/admin/expire", admin_expire, methods=["POST"]),
            Route("/admin/revoke-access", admin_revoke_access, methods=["POST"]),
            Route("/admin/stats", admin_stats),
        ]
    )
    return Guarded(srv.streamable_http_app(), oauth)


async def serve(args: argparse.Namespace) -> None:
    sock = tcp_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    S.base = f"http://127.0.0.1:{port}"
    S.ttl = args.ttl
    S.dcr = not args.no_dcr
    S.token_endpoint = args.token_endpoint
    for spec in args.client:
        client_id, secret, redirect = spec.split(":", 2)
        S.clients[client_id] = {"redirect_uris": [redirect], "secret": secret or None}
    server = uvicorn.Server(uvicorn.Config(build(), log_level="warning", lifespan="on"))
    print(f"PORT {port}", flush=True)
    await server.serve(sockets=[sock])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ttl", type=float, default=3600.0)
    parser.add_argument("--client", action="append", default=[], help="ID:SECRET:REDIRECT")
    parser.add_argument("--no-dcr", action="store_true")
    parser.add_argument("--token-endpoint", default="", help="the token endpoint to advertise")
    args = parser.parse_args()
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()

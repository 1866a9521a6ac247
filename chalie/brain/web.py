"""The Brain on the main web server: REST at ``/api/v1``, the dashboard at ``/brain/``.

Every request, in order:

1. The Host header must be this server's (else 421), and a browser Origin one of its own
   or configured ones (else 403): the DNS-rebinding guard the MCP server has.
2. REST: ``Authorization: Bearer`` with an active token (else 401) that is the owner's
   (:func:`chalie.brain.access.is_owner`, else 403). Dashboard: a live session cookie whose
   token is still active (else the sign-in page), and on every state-changing request the
   session's CSRF token in ``X-CSRF-Token`` or the ``csrf`` form field (else 403).
3. The arguments are checked against the operation's Struct (else 400 with the reason).
4. The backend runs the operation on a worker thread (never on the event loop).

Pages are one module each in :mod:`chalie.brain.pages`; every action a page offers posts to
``/brain/act/<operation>``, which runs the same operation the REST API does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Final

import jinja2
import msgspec
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from chalie.brain import access, api
from chalie.brain.openapi import document
from chalie.brain.operations import BY_NAME, OPERATIONS, ApiProblem, Backend, Operation
from chalie.gate.tokens import TokenInfo, bearer
from chalie.wire.principals import LOCAL_OWNER, Principal

log = logging.getLogger("chalie.brain")

HERE: Final = Path(__file__).parent
MAX_BODY: Final = 256 * 1024
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    # no-referrer would make Chromium send "Origin: null" on our own form posts.
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
ALL_METHODS: Final = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
SSE_KEEPALIVE: Final = 15.0
SSE_RECHECK: Final = 2.0

Verify = Callable[[str | None], TokenInfo | None]
HashActive = Callable[[str], bool]


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def _error(status: int, code: str, message: str) -> JSONResponse:
    body = msgspec.to_builtins(api.ApiError(error=code, message=message[:500]))
    return JSONResponse(body, status_code=status, headers=SECURITY_HEADERS)


# Where a one-time link lands: signed in, on to the overview from this origin.
SIGNED_IN_PAGE: Final = (
    '<!doctype html><html><head><meta charset="utf-8">'
    '<meta http-equiv="refresh" content="0;url=/brain/overview">'
    "<title>Signed in · Chalie Brain</title></head>"
    '<body><p><a href="/brain/overview">Signed in: go to the Brain</a></p></body></html>'
)


class Brain:
    """Builds the routes; holds what the requests share (the backend, sessions, templates)."""

    def __init__(
        self,
        backend: Backend,
        sessions: access.DashboardSessions,
        verify: Verify,
        hash_active: HashActive,
        *,
        hosts: frozenset[str],
        origins: frozenset[str],
        subscribe_approvals: Callable[[Callable[[Any], None]], Any] | None = None,
        unavailable: Callable[[BaseException], bool] = lambda exc: isinstance(exc, TimeoutError),
    ) -> None:
        self._unavailable = unavailable
        self.backend = backend
        self.sessions = sessions
        self._verify = verify
        self._hash_active = hash_active
        self.hosts = hosts
        self.origins = origins
        self._subscribe = subscribe_approvals
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        from chalie.brain.pages import PAGES, filters

        self.pages = {p.slug: p for p in PAGES}
        self.templates.filters.update(filters())

    # -- routes ---------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        rest: list[BaseRoute] = [
            Route("/openapi.json", self._guard_rest(self._openapi, token=False), methods=["GET"])
        ]
        # One route a path, whatever its methods (so a 405 lists them all); fixed paths
        # before parameterised ones (/approvals/history before /approvals/{request_id}).
        by_path: dict[str, dict[str, Operation]] = {}
        for o in OPERATIONS:
            by_path.setdefault(o.path, {})[o.method] = o
        for path in sorted(by_path, key=lambda p: (p.count("{"), p)):
            rest.append(Route(path, self._methods(by_path[path]), methods=ALL_METHODS))
        rest.append(Route("/{rest:path}", self._not_found, methods=ALL_METHODS))
        pages: list[BaseRoute] = [
            Route("/", self._guard_page(self._home, login=False)),
            Route("/login", self._guard_page(self._login_form, login=False), methods=["GET"]),
            Route("/login", self._guard_page(self._login, login=False), methods=["POST"]),
            Route("/link", self._guard_page(self._link, login=False), methods=["GET"]),
            Route("/logout", self._guard_page(self._logout), methods=["POST"]),
            Route("/act/{op}", self._guard_page(self._act), methods=["POST"]),
            Route("/approvals/stream", self._guard_page(self._stream), methods=["GET"]),
            Route("/fragment/{slug}", self._guard_page(self._fragment), methods=["GET"]),
            Route("/download/{op}", self._guard_page(self._download), methods=["GET"]),
            Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
            Route("/{slug}", self._guard_page(self._page), methods=["GET"]),
        ]
        return [Mount("/api/v1", routes=rest), Mount("/brain", routes=pages)]

    async def _not_found(self, request: Request) -> Response:
        refused = self._host_ok(request)
        return refused or _error(404, "not-found", "no such endpoint")

    def _methods(self, ops: dict[str, Operation]) -> Callable[[Request], Awaitable[Response]]:
        handlers = {m: self._guard_rest(self._rest(o)) for m, o in ops.items()}
        if "GET" in handlers:
            handlers["HEAD"] = handlers["GET"]
        allow = ", ".join(sorted(handlers))

        async def endpoint(request: Request) -> Response:
            handler = handlers.get(request.method)
            if handler is None:
                response = _error(405, "method-not-allowed", f"allowed: {allow}")
                response.headers["allow"] = allow
                return response
            return await handler(request)

        return endpoint

    # -- the shared checks ----------------------------------------------------------
    def _host_ok(self, request: Request) -> Response | None:
        if request.headers.get("host", "") not in self.hosts:
            return _error(421, "invalid-host", "this Host is not this server's")
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.origins:
            log.warning("the Brain refused a foreign origin", extra={"origin": origin[:200]})
            return _error(403, "origin-refused", "this Origin is not allowed")
        return None

    def _guard_rest(
        self,
        handler: Callable[[Request, TokenInfo | None], Awaitable[Response]],
        *,
        token: bool = True,
    ) -> Callable[[Request], Awaitable[Response]]:
        async def checked(request: Request) -> Response:
            refused = self._host_ok(request)
            if refused is not None:
                return refused
            info: TokenInfo | None = None
            if token:
                info = self._verify(bearer(request.headers.get("authorization")))
                if info is None:
                    return _error(401, "unauthorized", "a valid bearer token is required")
                if not access.is_owner(info):
                    return _error(403, "forbidden", "this token is not the owner's")
            return await handler(request, info)

        return _timed(checked)

    def session_of(self, request: Request) -> access.Session | None:
        session = self.sessions.get(request.cookies.get(access.COOKIE))
        if session is None:
            return None
        if session.token_hash is not None and not self._hash_active(session.token_hash):
            self.sessions.close(request.cookies.get(access.COOKIE))
            return None
        return session

    def _guard_page(
        self, handler: Callable[..., Awaitable[Response]], *, login: bool = True
    ) -> Callable[[Request], Awaitable[Response]]:
        async def checked(request: Request) -> Response:
            refused = self._host_ok(request)
            if refused is not None:
                return refused
            if not login:
                return self._secure(await handler(request))
            session = self.session_of(request)
            if session is None:
                if request.method == "GET" and not request.url.path.endswith("/stream"):
                    return self._secure(RedirectResponse("/brain/login", status_code=303))
                return _error(401, "unauthorized", "sign in first")
            if request.method != "GET":
                given = request.headers.get(access.CSRF_HEADER)
                if given is None:
                    form = await self._form(request)
                    if form is None:
                        return _error(413, "oversized-request", "the form is too large")
                    given = form.get(access.CSRF_FIELD)
                if not access.same_secret(given, session.csrf):
                    return _error(403, "csrf", "the form's CSRF token is missing or wrong")
            return self._secure(await handler(request, session))

        return _timed(checked)

    @staticmethod
    def _secure(response: Response) -> Response:
        for k, v in SECURITY_HEADERS.items():
            response.headers.setdefault(k, v)
        response.headers.setdefault("cache-control", "no-store")
        return response

    @staticmethod
    async def _body(request: Request) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def _form(self, request: Request) -> dict[str, Any] | None:
        cached = request.scope.get("chalie.form")
        if cached is not None:
            return dict(cached)
        body = await self._body(request)
        if body is None:
            return None
        from urllib.parse import parse_qs

        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
        form: dict[str, Any] = {}
        for k, values in parse_qs(text, keep_blank_values=True).items():
            form[k] = values if k.endswith("[]") else values[-1]
        request.scope["chalie.form"] = form
        return dict(form)

    # -- REST -----------------------------------------------------------------------
    async def _openapi(self, _request: Request, _info: TokenInfo | None) -> Response:
        return JSONResponse(document(), headers=SECURITY_HEADERS)

    def _rest(self, o: Operation) -> Callable[[Request, TokenInfo | None], Awaitable[Response]]:
        async def handler(request: Request, info: TokenInfo | None) -> Response:
            who = info.principal() if info is not None else None
            if o.changes:
                body = await self._body(request)
                if body is None:
                    return _error(413, "oversized-request", f"the body exceeds {MAX_BODY} bytes")
                raw: Any = {}
                if body.strip():
                    try:
                        raw = msgspec.json.decode(body)
                    except msgspec.DecodeError as exc:
                        return _error(400, "malformed-request", f"not JSON: {exc}")
                elif o.args.__struct_fields__:
                    # A body is required where one is documented: an empty POST to
                    # /policy/reset must not mean "reset everything".
                    return _error(400, "invalid-args", f"{o.name}: a JSON object body is required")
                strict = True
            else:
                items = request.query_params.multi_items()
                raw = dict(items)
                if len(raw) != len(items):
                    return _error(400, "invalid-args", f"{o.name}: a query parameter is repeated")
                strict = False
            return await self.run(o, dict(request.path_params), raw, strict=strict, who=who)

        return handler

    def parse(
        self, o: Operation, path: Mapping[str, Any], raw: Any, *, strict: bool
    ) -> tuple[Any, Any]:
        """The operation's path and argument Structs (msgspec.ValidationError: they do not fit)."""
        path_args = None
        if o.path_args is not None:
            path_args = msgspec.convert(dict(path), o.path_args, strict=False)
        if not isinstance(raw, dict):
            raise msgspec.ValidationError("Expected `object`")
        args = msgspec.convert(raw, o.args, strict=strict)
        return path_args, args

    async def call(
        self, o: Operation, path_args: Any, args: Any, who: Principal | None = None
    ) -> Any:
        """Run the backend's method; an operation that needs its caller gets ``who``, and
        without one it is refused (fail closed), never run as someone else."""
        method = getattr(self.backend, o.name)
        if o.caller:
            if who is None:
                raise ApiProblem(403, "forbidden", f"{o.name}: no signed-in caller")
            return await run_in_threadpool(method, path_args, args, who)
        return await run_in_threadpool(method, path_args, args)

    async def run(
        self,
        o: Operation,
        path: Mapping[str, Any],
        raw: Any,
        *,
        strict: bool,
        who: Principal | None = None,
    ) -> Response:
        try:
            path_args, args = self.parse(o, path, raw, strict=strict)
        except msgspec.ValidationError as exc:
            return _error(400, "invalid-args", f"{o.name}: {exc}")
        try:
            result = await self.call(o, path_args, args, who)
        except ApiProblem as exc:
            return _error(exc.status, exc.code, exc.message)
        except Exception as exc:
            return self._failed(o, exc)
        if o.download:
            kind = "text/csv" if getattr(args, "format", "") == "csv" else "application/x-ndjson"
            ext = "csv" if kind == "text/csv" else "jsonl"
            return StreamingResponse(
                iterate_in_threadpool(result),
                media_type=kind,
                headers={
                    **SECURITY_HEADERS,
                    "content-disposition": f'attachment; filename="trail.{ext}"',
                },
            )
        return Response(
            msgspec.json.encode(result),
            media_type="application/json",
            headers=SECURITY_HEADERS,
        )

    def _failed(self, o: Operation, exc: Exception) -> Response:
        if self._unavailable(exc):
            return _error(503, "unavailable", str(exc))
        log.exception("Brain operation %s failed", o.name)
        return _error(500, "internal-error", f"{o.name} failed: {type(exc).__name__}")

    # -- the dashboard --------------------------------------------------------------
    def render(
        self, name: str, request: Request, session: access.Session | None, **ctx: Any
    ) -> HTMLResponse:
        template = self.templates.get_template(name)
        ctx.setdefault("problem", "")
        ctx.setdefault("result", None)
        ctx.setdefault("page", None)
        html = template.render(
            csrf=session.csrf if session is not None else "",
            principal=session.principal if session is not None else "",
            pages=list(self.pages.values()),
            current=ctx.pop("current", ""),
            **ctx,
        )
        return HTMLResponse(html, status_code=ctx.get("status", 200))

    async def _home(self, request: Request) -> Response:
        if self.session_of(request) is None:
            return RedirectResponse("/brain/login", status_code=303)
        return RedirectResponse("/brain/overview", status_code=303)

    async def _login_form(self, request: Request, message: str = "", status: int = 200) -> Response:
        nonce = secrets.token_urlsafe(24)
        response = self.render(
            "login.html", request, None, nonce=nonce, message=message, current="login"
        )
        response.status_code = status
        response.set_cookie(
            access.PRE_COOKIE,
            nonce,
            max_age=600,
            path="/brain/login",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def _login(self, request: Request) -> Response:
        form = await self._form(request)
        if form is None:
            return _error(413, "oversized-request", "the form is too large")
        nonce = request.cookies.get(access.PRE_COOKIE, "")
        if not nonce or not access.same_secret(form.get("nonce"), nonce):
            return _error(403, "csrf", "the sign-in form expired; load it again")
        secret = form.get("token")
        info = self._verify(secret.strip() if isinstance(secret, str) else None)
        if info is None or not isinstance(secret, str):
            return await self._login_form(request, "That token is not valid.", 401)
        if not access.is_owner(info):
            return await self._login_form(request, "That token is not the owner's.", 403)
        return self._signed_in(request, info.name, _digest(secret.strip()), info.principal())

    async def _link(self, request: Request) -> Response:
        if not self.sessions.redeem(request.query_params.get("code")):
            return await self._login_form(
                request, "That sign-in link was used or has expired.", 401
            )
        # The link arrives from another site (the 0600 page ``chalie brain open`` gave the
        # browser): a redirect would go on without the SameSite=Strict cookie, so this
        # page moves on itself, from this origin.
        return self._signed_in(request, access.LOCAL_PRINCIPAL, None, LOCAL_OWNER, redirect=False)

    def _signed_in(
        self,
        request: Request,
        principal: str,
        token_hash: str | None,
        who: Principal,
        *,
        redirect: bool = True,
    ) -> Response:
        sid, _session = self.sessions.open(principal, token_hash, who)
        response: Response = (
            RedirectResponse("/brain/overview", status_code=303)
            if redirect
            else HTMLResponse(SIGNED_IN_PAGE)
        )
        response.set_cookie(
            access.COOKIE,
            sid,
            max_age=int(self.sessions.ttl),
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        response.delete_cookie(access.PRE_COOKIE, path="/brain/login")
        return response

    async def _logout(self, request: Request, _session: access.Session) -> Response:
        self.sessions.close(request.cookies.get(access.COOKIE))
        response = RedirectResponse("/brain/login", status_code=303)
        response.delete_cookie(access.COOKIE, path="/")
        return response

    async def _page(self, request: Request, session: access.Session) -> Response:
        page = self.pages.get(request.path_params["slug"])
        if page is None:
            return HTMLResponse("<h1>Not found</h1>", status_code=404)
        return await self.show(page, request, session)

    async def _fragment(self, request: Request, session: access.Session) -> Response:
        page = self.pages.get(request.path_params["slug"])
        if page is None or page.fragment is None:
            return HTMLResponse("", status_code=404)
        ctx = await page.load(self, dict(request.query_params))
        return self.render(page.fragment, request, session, current=page.slug, **ctx)

    async def show(
        self,
        page: Any,
        request: Request,
        session: access.Session,
        *,
        result: Any = None,
        problem: str = "",
        status: int = 200,
        query: Mapping[str, str] | None = None,
    ) -> Response:
        ctx = await page.load(self, dict(request.query_params if query is None else query))
        response = self.render(
            page.template,
            request,
            session,
            current=page.slug,
            page=page,
            result=result,
            problem=problem,
            **ctx,
        )
        response.status_code = status
        return response

    async def op(
        self, run: Callable[..., Any], path: Mapping[str, Any] | None = None, /, **raw: Any
    ) -> Any:
        """Run one operation for a page (its load step), named by its :class:`Backend`
        method; raises ApiProblem on a refusal."""
        o = BY_NAME[run.__name__]
        try:
            path_args, args = self.parse(o, path or {}, raw, strict=False)
        except msgspec.ValidationError as exc:
            raise ApiProblem(400, "invalid-args", str(exc)) from None
        return await self.call(o, path_args, args)

    async def _download(self, request: Request, session: access.Session) -> Response:
        """A download operation (the trail's export) for the signed-in browser: the REST
        operation's own answer, with the session in place of a bearer token."""
        o = BY_NAME.get(request.path_params["op"])
        if o is None or not o.download:
            return _error(404, "not-found", "no such download")
        items = request.query_params.multi_items()
        raw = dict(items)
        if len(raw) != len(items):
            return _error(400, "invalid-args", f"{o.name}: a query parameter is repeated")
        return await self.run(o, {}, raw, strict=False, who=session.who)

    async def _act(self, request: Request, session: access.Session) -> Response:
        o = BY_NAME.get(request.path_params["op"])
        form = await self._form(request) or {}
        back = str(form.pop("back", "") or "")
        form.pop(access.CSRF_FIELD, None)
        page = self.pages.get(back.partition("?")[0]) or (
            self.pages.get(o.page) if o is not None else None
        )
        if o is None or page is None or not o.changes:
            return HTMLResponse("<h1>No such action</h1>", status_code=404)
        path = {k[5:]: v for k, v in form.items() if k.startswith("path.")}
        raw: dict[str, Any] = {}
        for k, v in form.items():
            if k.startswith("path.") or v == "" or v == []:
                continue
            if k.startswith("arguments."):  # a tool's arguments, each as typed text
                raw.setdefault("arguments", {})[k[len("arguments.") :]] = v
            else:
                raw[k.removesuffix("[]")] = _form_value(v)
        from urllib.parse import parse_qsl

        query = dict(parse_qsl(back.partition("?")[2]))
        try:
            path_args, args = self.parse(o, path, raw, strict=False)
            result = await self.call(o, path_args, args, session.who)
        except msgspec.ValidationError as exc:
            return await self.show(
                page, request, session, problem=str(exc), status=400, query=query
            )
        except ApiProblem as exc:
            return await self.show(
                page, request, session, problem=exc.message, status=exc.status, query=query
            )
        if page.shows_results:
            return await self.show(
                page, request, session, result={"op": o.name, "value": result}, query=query
            )
        target = f"/brain/{back}" if back else f"/brain/{page.slug}"
        return RedirectResponse(target, status_code=303)

    # -- live approvals ---------------------------------------------------------------
    async def _stream(self, request: Request, _session: access.Session) -> Response:
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def on_event(event: Any) -> None:
            if type(event).__name__ == "PermissionRequest":
                loop.call_soon_threadsafe(wake.set)

        sub = self._subscribe(on_event) if self._subscribe is not None else None

        async def events() -> AsyncIterator[str]:
            last: tuple[str, ...] | None = None
            waited = 0.0
            try:
                yield "retry: 1000\n\n"
                while True:
                    ids = await self._pending_ids()
                    if ids != last:
                        last = ids
                        yield f"event: approvals\ndata: {len(ids)}\n\n"
                        waited = 0.0
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), SSE_RECHECK)
                    wake.clear()
                    waited += SSE_RECHECK
                    if waited >= SSE_KEEPALIVE:
                        waited = 0.0
                        yield ": keepalive\n\n"
            finally:
                if sub is not None:
                    sub.close()

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def _pending_ids(self) -> tuple[str, ...]:
        try:
            found = await self.call(BY_NAME["approvals"], None, api.Empty())
        except Exception:
            return ()
        return tuple(a.request_id for a in found)


def _timed(
    endpoint: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint, its answer carrying the server's own time for the request
    (``Server-Timing``), what the benchmark reads."""

    async def timed(request: Request) -> Response:
        started = time.perf_counter()
        response = await endpoint(request)
        response.headers["server-timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.2f}"
        return response

    return timed


def _form_value(value: Any) -> Any:
    if isinstance(value, list):
        return [v for v in value if v.strip()]
    if value in ("true", "on"):
        return True
    if value == "false":
        return False
    return value

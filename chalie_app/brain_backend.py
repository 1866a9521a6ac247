"""The Brain's backend: each REST operation (chalie.brain.operations) done against the running tree.

It reaches the tree's children through restart-proof refs (as the control commands do) and
the same stores the CLI uses: a policy change goes to the PolicyActor, an MCP connection
change to the store and then ``McpConnections.reload``, a token to the token store. Every
method is synchronous and runs on the web server's thread pool, never on the event loop.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import difflib
import io
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

import msgspec
import pykka

import chalie
from actors.child_ref import ChildRef, ChildUnavailable
from actors.conversation.conversations import Conversations
from actors.conversation.port import ActorConversations
from actors.gate.policy import PolicyActor
from actors.host import Host
from actors.mcp.connections import McpConnections
from chalie.accounts.store import AccountStore
from chalie.brain import api
from chalie.brain.access import DashboardSessions
from chalie.brain.operations import ApiProblem
from chalie.calls.trail import Trail, TrailRow
from chalie.gate.policy import PolicyError
from chalie.gate.tokens import TokenError, TokenInfo, TokenStore
from chalie.memory.whose import AGENT_PREFIX, OWNER, is_agent
from chalie.process import control
from chalie.process.config import ChatConfig, Config, ConfigError
from chalie.process.control import NoArgs
from chalie.process.routing import Route
from chalie.store.sql import open_connection
from chalie.wire.bus import EventBus
from chalie.wire.messages import CHANNELS, ControlReply, ToolCall
from chalie.wire.principals import LOCAL_ID, Principal

A = TypeVar("A", bound=pykka.Actor)
V = TypeVar("V", bound=msgspec.Struct)

ACTOR_TIMEOUT: Final = 10.0
EXPORT_PAGE: Final = 500
RECENT_ERRORS: Final = 10
# Seconds a call from the dashboard is waited for; then it answers "waiting" (the gate is
# asking: the request is in Approvals) and the result lands on the trail.
TOOL_CALL_WAIT: Final = 10.0


def _rss() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return 0


def view(kind: type[V], source: Any, **given: Any) -> V:
    """An answer of type ``kind`` from ``source``'s attributes of the same names (validated,
    tuples as lists); ``given`` are the fields worked out here instead."""
    if given:
        source = {
            **{f: getattr(source, f) for f in kind.__struct_fields__ if hasattr(source, f)},
            **given,
        }
    return msgspec.convert(source, kind, from_attributes=True)


@contextlib.contextmanager
def refused(kind: type[Exception], status: int, code: str | None = None) -> Iterator[None]:
    """An exception of ``kind`` raised inside is the refusal ``status`` with its message:
    its own stable code (``exc.code``), or ``code`` when given."""
    try:
        yield
    except kind as exc:
        raise ApiProblem(status, code or exc.code, str(exc)) from None  # type: ignore[attr-defined]


@contextlib.contextmanager
def coded_refusals() -> Iterator[None]:
    """A ValueError that carries a stable code (a conversation request refused) is a 400."""
    try:
        yield
    except ValueError as exc:
        code = getattr(exc, "code", None)
        if isinstance(code, str):
            raise ApiProblem(400, code, str(exc)) from None
        raise


def unknown_conversation(conversation_id: str) -> ApiProblem:
    return ApiProblem(404, "unknown-conversation", f"no conversation {conversation_id!r}")


def agent_name(names: dict[str, str], key: str) -> str:
    """The agent token's name for an agent's memory key ("?" if unknown); "" for the owner."""
    return names.get(key, "?") if is_agent(key) else ""


def token_view(info: TokenInfo) -> api.TokenView:
    return view(api.TokenView, info)


def client_configs(url: str, secret: str) -> api.ClientConfigs:
    """Ready-to-paste client configuration for the three clients the dashboard names."""
    server = {"type": "http", "url": url, "headers": {"Authorization": f"Bearer {secret}"}}
    desktop = {
        "mcpServers": {
            "chalie": {
                "command": "npx",
                "args": ["mcp-remote", url, "--header", f"Authorization: Bearer {secret}"],
            }
        }
    }
    code = f'claude mcp add --transport http chalie {url} --header "Authorization: Bearer {secret}"'
    return api.ClientConfigs(
        claude_desktop=json.dumps(desktop, indent=2),
        claude_code=code,
        cursor=json.dumps({"mcpServers": {"chalie": server}}, indent=2),
    )


def quarantine_diff(row: Any) -> str:
    """A readable diff of what changed in a quarantined tool: description, then schema."""
    pending = getattr(row, "pending", None)
    if pending is None:
        return ""
    old = [row.description, *json.dumps(row.schema, indent=2, sort_keys=True).splitlines()]
    new_schema = getattr(pending, "schema", None) or getattr(pending, "input_schema", {})
    new = [
        str(getattr(pending, "description", "")),
        *json.dumps(new_schema, indent=2, sort_keys=True).splitlines(),
    ]
    return "\n".join(difflib.unified_diff(old, new, "approved", "offered", lineterm="", n=2))[
        :20_000
    ]


class RuntimeBackend:
    """One instance a web server; safe from several threads."""

    def __init__(self, host: Host, sessions: DashboardSessions, mcp_url: str | None = None) -> None:
        self._host = host
        self.sessions = sessions
        self._lock = threading.Lock()
        self._trail: Trail | None = None
        self._tokens: TokenStore | None = None
        self._admin: Any = None
        self._admin_lock = threading.Lock()
        self._config_lock = threading.Lock()
        self._conn: Any = None

    def close(self) -> None:
        with self._lock:
            if self._trail is not None:
                self._trail.close()
            if self._tokens is not None:
                self._tokens.close()
            if self._conn is not None:
                self._conn.close()
            self._trail = self._tokens = self._conn = None
        with self._admin_lock:
            if self._admin is not None:
                self._admin.close()
                self._admin = None

    # -- shared handles --------------------------------------------------------------
    @property
    def token_store(self) -> TokenStore:
        with self._lock:
            if self._tokens is None:
                self._tokens = TokenStore(self._host.db_path)
            return self._tokens

    def _book(self) -> Trail:
        with self._lock:
            if self._trail is None:
                self._trail = Trail(self._host.db_path)
            return self._trail

    def _read(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        with self._lock:
            if self._conn is None:
                self._conn = open_connection(self._host.db_path)
            return list(self._conn.execute(sql, args).fetchall())

    def _policy(self) -> ChildRef[Any]:
        return self._host.child("policy", PolicyActor).within(ACTOR_TIMEOUT)

    def _conversations(self) -> ChildRef[Any]:
        return self._host.child("conversations", Conversations).within(ACTOR_TIMEOUT)

    def _mcp_admin(self) -> Any:
        from chalie.mcp.admin import McpAdmin

        if self._admin is None:
            self._admin = McpAdmin(
                self._host.db_path, self._host.config.home, on_change=self._reload
            )
        return self._admin

    def _reload(self) -> None:
        with contextlib.suppress(ChildUnavailable, pykka.ActorDeadError, pykka.Timeout):
            self._host.child("mcp", McpConnections).within(60).call(McpConnections.reload)

    def _admin_do(self, op: str, *args: Any, **kw: Any) -> Any:
        from chalie.mcp.admin import McpAdminError

        with self._admin_lock:
            try:
                return getattr(self._mcp_admin(), op)(*args, **kw)
            except McpAdminError as exc:
                text = str(exc)
                status = 404 if "no MCP server" in text or " has no tool " in text else 409
                if "already exists" in text:
                    status = 409
                raise ApiProblem(status, "mcp-admin", text) from None

    # -- overview ---------------------------------------------------------------------
    def overview(self, _path: Any, _args: api.Empty) -> api.Overview:
        status = self._host.status()
        actors = msgspec.convert(status.get("actors", []), list[api.ActorView])
        remotes = [view(api.RemoteSummary, r) for r in self.remotes(None, api.Empty())]
        errors = self._book().query(status="error", limit=RECENT_ERRORS)
        try:
            pending = len(self._policy().call(PolicyActor.pending))
        except (ChildUnavailable, pykka.ActorDeadError, pykka.Timeout):
            pending = 0
        return api.Overview(
            pid=int(status.get("pid", os.getpid())),
            version=str(status.get("version", chalie.__version__)),
            uptime=float(status.get("uptime", 0.0)),
            memory_rss_bytes=_rss(),
            actors=actors,
            workers=status.get("workers"),
            mcp_server=status.get("mcp_server"),
            remote_servers=remotes,
            pending_approvals=pending,
            recent_errors=[view(api.ErrorRow, r) for r in errors],
            sessions=self.sessions.count(),
        )

    # -- approvals --------------------------------------------------------------------
    def approvals(self, _path: Any, _args: api.Empty) -> list[api.Approval]:
        found = self._policy().call(PolicyActor.pending)
        origins: dict[str, str] = {}
        for req in found:
            if req.conversation_id not in origins:
                rows = self._read(
                    "SELECT origin FROM conversations WHERE id = ?", (req.conversation_id,)
                )
                origins[req.conversation_id] = rows[0][0] if rows else ""
        return [
            view(
                api.Approval,
                r,
                channel=r.channel or "",
                params=dict(r.params),
                asked_by=r.asked_by or origins.get(r.conversation_id, ""),
            )
            for r in found
        ]

    def answer(self, path: api.RequestPath, args: api.AnswerBody, who: Principal) -> api.Answered:
        """Answer as ``who``, the signed-in caller (the bearer token's principal, the
        session's token's, or the local owner for a one-time-link session)."""
        try:
            done = self._policy().call(
                PolicyActor.answer, path.request_id, args.answer, who, args.content
            )
        except PolicyError as exc:
            if exc.code == "forbidden":
                raise ApiProblem(403, "forbidden", str(exc)) from None
            raise ApiProblem(400, "invalid-args", str(exc)) from None
        if done is False:
            raise ApiProblem(404, "not-found", f"no pending permission request {path.request_id!r}")
        return api.Answered(request_id=path.request_id, answer=args.answer)

    def approval_history(self, _path: Any, args: api.HistoryQuery) -> list[api.HistoryRow]:
        rows = self._book().query(decided_by="human", limit=args.limit)
        if not rows:
            return []
        # Who answered each: the request of that conversation and permission settled while
        # the call waited (one request a call), from the stored requests.
        settled = self._read(
            "SELECT conversation_id, permission, answered_by, settled_at FROM permission_requests "
            "WHERE settled_at >= ? AND answered_by IS NOT NULL",
            (min(r.started_at for r in rows),),
        )
        names = {t.id: t.name for t in self.token_store.list()}

        def who(row: TrailRow) -> str:
            end = row.ended_at if row.ended_at is not None else time.time()
            for conversation, permission, by, at in settled:
                if (conversation, permission) == (row.conversation_id, row.permission) and (
                    row.started_at <= at <= end
                ):
                    return "the owner (local)" if by == LOCAL_ID else names.get(by, str(by))
            return ""

        return [view(api.HistoryRow, r, decided_by=who(r)) for r in rows]

    def agent_exchanges(self, _path: Any, args: api.ExchangeQuery) -> list[api.ExchangeRow]:
        from chalie.mcp_server.exchange import summary
        from chalie.mcp_server.kept import KeptExchanges

        book = KeptExchanges(self._host.db_path)
        try:
            kept = book.recent(args.limit)
        finally:
            book.close()
        return [
            api.ExchangeRow(
                kept=k.exchange.kept,
                ts=k.exchange.ts,
                conversation_id=k.exchange.conversation_id,
                phase=k.exchange.phase,
                summary=summary(k.exchange),
                request_id=k.exchange.request_id,
                seen=k.seen,
            )
            for k in kept
        ]

    # -- policy -----------------------------------------------------------------------
    def policy(self, _path: Any, args: api.PolicyQuery) -> api.PolicyPage:
        rows = self._policy().call(PolicyActor.list, True)
        needle = args.q.strip().lower()
        matched = [
            r
            for r in rows
            if (not needle or needle in r.permission.lower())
            and (args.channel is None or r.channel == args.channel)
            and (args.setting is None or r.decision == args.setting)
            and (args.origin is None or r.origin == args.origin)
        ]
        internal = args.internal or args.setting == "internal"
        shown = [
            view(api.PolicyRowView, r, read_only=r.decision == "internal")
            for r in matched
            if internal or r.decision != "internal"
        ]
        known = {r.permission for r in rows}
        unconfigured = sorted(
            e.name
            for e in self._host.registry
            if not e.cls.internal
            and e.name not in known
            and (not needle or needle in e.name.lower())
        )
        return api.PolicyPage(
            channels=list(CHANNELS),
            rows=shown,
            unconfigured=unconfigured,
            hidden_internal=len(matched) - len(shown),
        )

    def policy_set(self, _path: Any, args: api.PolicySet) -> api.PolicyRowView:
        with refused(PolicyError, 400, "invalid-args"):
            row = self._policy().call(PolicyActor.set, args.channel, args.permission, args.decision)
        return view(api.PolicyRowView, row)

    def policy_reset(self, _path: Any, args: api.PolicyReset) -> api.Removed:
        with refused(PolicyError, 400, "invalid-args"):
            removed = self._policy().call(
                PolicyActor.reset, channel=args.channel, permission=args.permission
            )
        return api.Removed(removed=int(removed))

    # -- the inbound MCP server and tokens --------------------------------------------
    def mcp_url(self) -> str | None:
        status = self._host.status().get("mcp_server") or {}
        url = status.get("url")
        return url if isinstance(url, str) else None

    def mcp_server(self, _path: Any, _args: api.Empty) -> api.McpServerView:
        cfg = self._host.config.mcp_server
        status = self._host.status().get("mcp_server") or {}
        return api.McpServerView(
            enabled=cfg.enabled,
            host=cfg.host,
            port=cfg.port,
            path="/mcp",
            url=status.get("url"),
            running=status.get("state") == "serving",
            gateway=cfg.gateway,
            limits={
                "max_concurrent_turns": cfg.max_concurrent_turns,
                "requests_per_minute": cfg.requests_per_minute,
                "max_body_bytes": cfg.max_body_bytes,
                "max_sessions": cfg.max_sessions,
                "session_idle_timeout": cfg.session_idle_timeout,
                "turn_wait": cfg.turn_wait,
                "loop_in_human_asks": cfg.loop_in_human_asks,
            },
        )

    def mcp_server_change(self, _path: Any, args: api.McpServerChange) -> api.McpServerView:
        """Write the change to config.toml, then restart the MCP server's actor with it."""
        from chalie.process import config_file

        values = {
            k: getattr(args, k)
            for k in ("enabled", "host", "port", "gateway")
            if getattr(args, k) is not None
        }
        if values:
            with self._config_lock:
                with (
                    refused(ConfigError, 400, "invalid-config"),
                    refused(OSError, 409, "config-not-written"),
                ):
                    new = config_file.change(
                        self._host.config.home, "mcp_server", values, check=_bindable
                    )
                self._host.config = msgspec.structs.replace(
                    self._host.config, mcp_server=new.mcp_server
                )
                supervisor = self._host.supervisor
                if supervisor is None:
                    raise ApiProblem(503, "unavailable", "the supervisor is not running")
                supervisor.proxy().restart_child("mcp_server").get(timeout=60)
        return self.mcp_server(None, api.Empty())

    def tokens(self, _path: Any, _args: api.Empty) -> list[api.TokenView]:
        return [token_view(t) for t in self.token_store.list()]

    def token_create(self, _path: Any, args: api.TokenCreate) -> api.CreatedToken:
        try:
            secret = self.token_store.create(args.name, scope=args.scope)
        except TokenError as exc:
            raise ApiProblem(
                409 if exc.code == "token-exists" else 400, exc.code, str(exc)
            ) from None
        return self._created(args.name, secret)

    def token_regenerate(self, path: api.NamePath, _args: api.Empty) -> api.CreatedToken:
        with refused(TokenError, 400):
            secret = self.token_store.regenerate(path.name)
        if secret is None:
            raise ApiProblem(404, "not-found", f"no active token named {path.name!r}")
        return self._created(path.name, secret)

    def _created(self, name: str, secret: str) -> api.CreatedToken:
        """The active token ``name`` with its new secret and the client snippets using it."""
        info = next(t for t in self.token_store.list() if t.name == name and t.active)
        url = self.mcp_url() or (
            f"http://{self._host.config.mcp_server.host}:{self._host.config.mcp_server.port}/mcp"
        )
        view = token_view(info)
        return api.CreatedToken(token=view, secret=secret, configs=client_configs(url, secret))

    def token_revoke(self, path: api.NamePath, _args: api.Empty) -> api.TokenView:
        with refused(TokenError, 400):
            done = self.token_store.revoke(path.name)
        if not done:
            raise ApiProblem(404, "not-found", f"no active token named {path.name!r}")
        # Its dashboard sessions end at their next request (the book checks the token).
        info = next(t for t in self.token_store.list() if t.name == path.name)
        return token_view(info)

    # -- calling a tool -----------------------------------------------------------------
    def tools(self, _path: Any, _args: api.Empty) -> list[api.ToolInfo]:
        """Every tool a person may call from the dashboard: all but the runtime's own."""
        return [
            api.ToolInfo(
                name=e.name,
                tooltip=e.cls.tooltip,
                input_schema=e.cls.input_schema(),
            )
            for e in sorted(self._host.registry, key=lambda e: e.name)
            if not e.cls.internal
        ]

    def tool_call(
        self, path: api.NamePath, args: api.ToolCallBody, who: Principal
    ) -> api.ToolCallResult:
        """Call a tool as ``who`` (the owner) on the chat channel, through the gate and the
        dispatcher as every call goes; the answer once it ends, or ``waiting`` while the
        gate asks (the request is in Approvals, the result will be on the trail)."""
        from chalie.calls.typed_text import TypedTextError, typed
        from chalie.wire.messages import TurnContext

        entry = self._host.registry.get(path.name)
        if entry is None or entry.cls.internal:
            raise ApiProblem(404, "not-found", f"no tool {path.name!r} to call")
        schema = entry.cls.input_schema()
        arguments: dict[str, Any] = {}
        try:
            for key, value in args.arguments.items():
                text = isinstance(value, str) and key != "act_summary"
                arguments[key] = typed(schema, key, value) if text else value
        except TypedTextError as exc:
            raise ApiProblem(400, "invalid-args", str(exc)) from None
        arguments.setdefault("act_summary", f"{path.name} called from the Brain")
        stamp = uuid.uuid4().hex[:20]
        context = TurnContext(
            conversation_id=f"brain-{stamp}",
            turn_id=f"brain-{stamp}",
            channel="chat",
            scope="unrestricted",
            principal=who,
        )
        call = ToolCall(
            call_id=f"brain-{stamp}", tool=path.name, arguments=arguments, context=context
        )
        outcome = self._host.dispatch(call)
        try:
            done = outcome.result(TOOL_CALL_WAIT)
        except concurrent.futures.TimeoutError:
            return api.ToolCallResult(
                call_id=call.call_id, conversation_id=context.conversation_id, state="waiting"
            )
        rows = self._book().query(conversation_id=context.conversation_id, limit=1)
        return api.ToolCallResult(
            call_id=call.call_id,
            conversation_id=context.conversation_id,
            state="done",
            status=done.status,
            code=done.code,
            envelope=done.envelope,
            trail=view(api.TrailEntry, rows[0]) if rows else None,
        )

    # -- remote MCP servers -----------------------------------------------------------
    def remotes(self, _path: Any, _args: api.Empty) -> list[api.RemoteView]:
        rows = self._admin_do("list")
        return [msgspec.convert(r, api.RemoteView) for r in rows]

    def _remote(self, name: str) -> api.RemoteView:
        for r in self.remotes(None, api.Empty()):
            if r.name == name:
                return r
        raise ApiProblem(404, "not-found", f"no MCP server named {name!r}")

    def remote_add(self, _path: Any, args: api.RemoteAdd) -> api.RemoteView:
        from chalie.mcp.spec import ServerSpec

        spec = ServerSpec(
            name=args.name,
            transport=args.transport,
            url=args.url,
            command=args.command,
            args=tuple(args.args),
            enabled=args.enabled,
        )
        self._admin_do("add", spec)
        return self._remote(args.name)

    def remote_import(self, _path: Any, args: api.RemoteImport) -> api.Imported:
        found = self._admin_do("import_text", args.text, replace=args.replace)
        return msgspec.convert(found, api.Imported)

    def remote_test(self, path: api.NamePath, _args: api.Empty) -> api.RemoteDone:
        from chalie.mcp.probe import test_server
        from chalie.mcp.secrets import MissingSecret, resolve

        spec = self._admin_do("spec", path.name)
        with self._admin_lock, refused(MissingSecret, 409, "missing-secret"):
            resolved = resolve(spec, self._mcp_admin().secrets)
        report = self._host.loop.submit(test_server(resolved, timeout=20.0)).result(30)
        return api.RemoteDone(name=path.name, detail=report)

    def _remote_done(self, op: str, name: str, *args: Any) -> api.RemoteDone:
        return api.RemoteDone(name=name, detail=self._admin_do(op, name, *args))

    def remote_enable(self, path: api.NamePath, _args: api.Empty) -> api.RemoteDone:
        return self._remote_done("set_enabled", path.name, True)

    def remote_disable(self, path: api.NamePath, _args: api.Empty) -> api.RemoteDone:
        return self._remote_done("set_enabled", path.name, False)

    def remote_remove(self, path: api.NamePath, _args: api.Empty) -> api.RemoteDone:
        return self._remote_done("remove", path.name)

    def remote_log(self, path: api.NamePath, args: api.LogQuery) -> api.RemoteLog:
        from chalie.mcp import server_log

        self._admin_do("spec", path.name)  # 404 for an unknown server
        logs = self._host.config.home / "logs"
        return api.RemoteLog(name=path.name, lines=server_log.tail(logs, path.name, args.lines))

    def remote_tools(self, path: api.NamePath, _args: api.Empty) -> list[api.RemoteToolView]:
        self._admin_do("spec", path.name)  # 404 for an unknown server
        with self._admin_lock:
            rows = self._mcp_admin().store.tools(path.name)
        return [
            view(
                api.RemoteToolView,
                r,
                description=r.description[:500],
                diff=quarantine_diff(r) if r.state == "quarantined" else "",
            )
            for r in rows
        ]

    def remote_approve(self, path: api.NamePath, args: api.ApproveBody) -> api.ApprovedTools:
        done = self._admin_do("approve", path.name, args.tool)
        return api.ApprovedTools(name=done["name"], approved=list(done["approved"]))

    # -- trail ------------------------------------------------------------------------
    def _trail_query(
        self, args: api.TrailFilter, *, limit: int, before: int | None
    ) -> list[TrailRow]:
        with refused(ValueError, 400, "invalid-args"):
            return self._book().query(
                tool=args.tool,
                status=args.status,
                code=args.code,
                channel=args.channel,
                conversation_id=args.conversation,
                principal=args.principal,
                since=args.since,
                until=args.until,
                before=before,
                limit=limit,
            )

    def usage(self, _path: Any, args: api.UsageQuery) -> api.UsageView:
        from chalie.calls import usage

        since = time.time() - usage.WINDOWS[args.window]
        rows = self._book().ended_since(since)

        def shown(found: list[usage.Usage]) -> list[api.UsageRow]:
            return [view(api.UsageRow, u) for u in found]  # error_rate: Usage's property

        return api.UsageView(
            window=args.window,
            since=since,
            tools=shown(usage.summarize(rows, usage.by_tool)),
            servers=shown(usage.summarize(rows, usage.by_server)),
        )

    def trail(self, _path: Any, args: api.TrailQuery) -> api.TrailPage:
        rows = self._trail_query(args, limit=args.limit + 1, before=args.before)
        more = len(rows) > args.limit
        rows = rows[: args.limit]
        return api.TrailPage(
            rows=[view(api.TrailEntry, r) for r in rows],
            next_before=rows[-1].id if more and rows else None,
        )

    def trail_export(self, _path: Any, args: api.TrailExportQuery) -> Iterator[str]:
        """The rows, page by page (keyset), as JSONL lines or CSV."""
        self._trail_query(args, limit=1, before=None)  # a refusal is a 400, before any byte
        return self._export(args)

    def _export(self, args: api.TrailExportQuery) -> Iterator[str]:
        fields = list(api.TrailEntry.__struct_fields__)
        if args.format == "csv":
            buf = io.StringIO()
            writer = csv.writer(buf)
            writer.writerow(fields)
            yield buf.getvalue()
        before: int | None = None
        while True:
            rows = self._trail_query(args, limit=EXPORT_PAGE, before=before)
            if not rows:
                return
            out = io.StringIO()
            if args.format == "csv":
                writer = csv.writer(out)
                for r in rows:
                    writer.writerow([_cell(getattr(r, f)) for f in fields])
            else:
                for r in rows:
                    out.write(msgspec.json.encode(r).decode() + "\n")
            yield out.getvalue()
            before = rows[-1].id

    # -- accounts ---------------------------------------------------------------------
    def accounts(self, _path: Any, _args: api.Empty) -> list[api.AccountRow]:
        """The accounts as :meth:`Account.shown` shows them; the secrets file is never read."""
        book = AccountStore(self._host.db_path, self._host.config.home)
        try:
            found = book.list()
        finally:
            book.close()
        rows = []
        for a in found:
            shown = a.shown()
            rows.append(
                view(
                    api.AccountRow,
                    a,
                    server=str(shown.get("url") or f"{a.host}:{a.effective_port}"),
                    security="" if "url" in shown else a.security,
                    password_stored=a.has_password,
                )
            )
        return rows

    # -- conversations ----------------------------------------------------------------
    def conversations(self, _path: Any, args: api.ConversationsQuery) -> list[api.ConversationRow]:
        rows = self._conversations().call(Conversations.list, args.limit)
        return [view(api.ConversationRow, r) for r in rows]

    def conversation(self, path: api.ConversationPath, _args: api.Empty) -> api.ConversationView:
        with coded_refusals():
            found = self._conversations().call(Conversations.show, path.conversation_id)
        if found is None:
            raise unknown_conversation(path.conversation_id)
        return api.ConversationView(
            conversation_id=path.conversation_id, detail=msgspec.to_builtins(found)
        )

    def conversation_delete(self, path: api.ConversationPath, _args: api.Empty) -> api.Deleted:
        # Through the one conversations port, as every other client deletes.
        port = ActorConversations(
            self._host.child("conversations", Conversations), self._host.events
        )
        with coded_refusals():
            existed = self._host.loop.submit(port.delete(path.conversation_id)).result(60)
        if not existed:
            raise unknown_conversation(path.conversation_id)
        return api.Deleted(conversation_id=path.conversation_id, deleted=True)

    # -- discovery --------------------------------------------------------------------
    def _discovery(self) -> Any:
        found = self._host.services.discovery
        if found is None:
            raise ApiProblem(503, "unavailable", "discovery is not running")
        return found

    def discovery_try(self, _path: Any, args: api.DiscoveryTry) -> api.DiscoveryAnswer:
        from chalie.discovery.cascade import QueryError

        # An entry with nothing printable in it finds nothing (find_tools would refuse it).
        usable = [q for q in args.queries if any(c.isprintable() and not c.isspace() for c in q)]
        blank = [
            api.DiscoveryEntry(query=q, rung="none", hits=[])
            for q in args.queries
            if q not in usable
        ]
        if not usable:
            return api.DiscoveryAnswer(entries=blank, injected=[])
        with refused(QueryError, 400, "invalid-args"):
            found = self._discovery().find(usable)
        entries = []
        for e in found.entries:
            distances = list(e.distances) + [None] * (len(e.names) - len(e.distances))
            entries.append(
                api.DiscoveryEntry(
                    query=e.query,
                    rung=e.rung,
                    hits=[
                        api.DiscoveryHit(name=n, distance=d)
                        for n, d in zip(e.names, distances, strict=True)
                    ],
                    candidates=list(e.candidates),
                )
            )
        return api.DiscoveryAnswer(
            entries=entries + blank, injected=[d.name for d in found.injected]
        )

    def examples(self, _path: Any, args: api.ExamplesQuery) -> list[api.ExampleView]:
        from actors.discovery import example_view

        found = self._discovery().examples(args.tool)
        return [msgspec.convert(example_view(e), api.ExampleView) for e in found]

    def example_forget(self, path: api.ExamplePath, _args: api.Empty) -> api.Forgotten:
        gone = self._discovery().forget(path.id)
        if not gone:
            raise ApiProblem(404, "not-found", f"no learned example {path.id}")
        return api.Forgotten(forgotten=int(gone))

    # -- memory -----------------------------------------------------------------------
    def _memory(self) -> Any:
        desk = self._host.services.memory
        if desk is None:
            raise ApiProblem(503, "unavailable", "memory is not running")
        return desk.book

    def _agent_names(self) -> dict[str, str]:
        """Memory key -> the agent token's name (a revoked token keeps its name)."""
        return {AGENT_PREFIX + t.id: t.name for t in self.token_store.list() if t.id}

    def _memory_view(
        self, memory: Any, names: dict[str, str], score: float | None = None
    ) -> api.MemoryView:
        return view(api.MemoryView, memory, agent=agent_name(names, memory.principal), score=score)

    def memories(self, _path: Any, args: api.MemoriesQuery) -> api.MemoriesPage:
        book = self._memory()
        names = self._agent_names()
        keys = [args.principal] if args.principal else book.store.principals()
        # The owner's first, then the agents' by name.
        keys.sort(key=lambda k: (k != OWNER, names.get(k, k)))
        counts = book.store.counts()
        groups = []
        for key in keys:
            rows = book.recent([key], args.limit)
            groups.append(
                api.MemoryGroup(
                    principal=key,
                    agent=agent_name(names, key),
                    count=counts.get(key, 0),
                    memories=[self._memory_view(m, names) for m in rows],
                )
            )
        return api.MemoriesPage(groups=groups)

    def memory_search(self, _path: Any, args: api.MemorySearch) -> list[api.MemoryView]:
        from chalie.memory.book import MemoryRequestError

        with refused(MemoryRequestError, 400):
            hits = self._memory().recall(
                [args.principal], query=args.query, location=args.location, k=args.limit
            )
        names = self._agent_names()
        return [self._memory_view(h.memory, names, h.score) for h in hits]

    def memory_forget(self, path: api.MemoryPath, _args: api.Empty) -> api.MemoryForgotten:
        from chalie.memory.book import MemoryRequestError

        book = self._memory()
        memory = book.get(path.id)
        if memory is None:
            raise ApiProblem(404, "memory-not-found", f"no memory {path.id}")
        with refused(MemoryRequestError, 404):
            book.forget([memory.principal], path.id)
        return api.MemoryForgotten(id=path.id, forgotten=True)

    def memories_forgotten(self, _path: Any, args: api.ForgottenQuery) -> list[api.MemoryView]:
        names = self._agent_names()
        return [self._memory_view(m, names) for m in self._memory().forgotten(None, args.limit)]

    def memory_restore(self, path: api.MemoryPath, _args: api.Empty) -> api.MemoryView:
        from chalie.memory.book import MemoryRequestError

        with refused(MemoryRequestError, 404):
            restored = self._memory().restore(None, path.id)
        return self._memory_view(restored, self._agent_names())

    def memory_promote(self, path: api.MemoryPath, _args: api.Empty) -> api.MemoryView:
        from chalie.memory.book import MemoryRequestError

        with refused(MemoryRequestError, 404):
            promoted = self._memory().promote(path.id)
        return self._memory_view(promoted, {})

    # -- reminders --------------------------------------------------------------------
    def _scheduler(self) -> ChildRef[Any]:
        from actors.scheduler import Scheduler

        return self._host.child("scheduler", Scheduler).within(ACTOR_TIMEOUT)

    def _reminder_view(self, r: Any, names: dict[str, str]) -> api.ReminderView:
        return view(api.ReminderView, r, agent=agent_name(names, r.principal))

    def reminders(self, _path: Any, args: api.RemindersQuery) -> list[api.ReminderView]:
        from actors.scheduler import Scheduler

        rows = self._scheduler().call(Scheduler.shown, args.view, args.limit)
        names = self._agent_names()
        return [self._reminder_view(r, names) for r in rows]

    def reminder_cancel(self, path: api.ReminderPath, _args: api.Empty) -> api.ReminderView:
        from actors.scheduler import Scheduler

        ref = self._scheduler()
        if not ref.call(Scheduler.cancel, path.id, None):
            raise ApiProblem(404, "reminder-not-found", f"no pending reminder {path.id}")
        found = ref.call(Scheduler.get, path.id)
        return self._reminder_view(found, self._agent_names())


def _bindable(config: Config) -> None:
    """The MCP server's own rule, checked before anything is written."""
    from chalie.net.loopback import is_loopback

    cfg = config.mcp_server
    if not is_loopback(cfg.host) and not cfg.allow_remote:
        raise ConfigError(
            f"[mcp_server] host {cfg.host!r} is not loopback: set allow_remote = true "
            "in config.toml first"
        )


# A spreadsheet reads a cell starting with one of these as a formula (CSV injection).
_FORMULA_START: Final = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    """A CSV cell: model-written text (an act_summary, parameters) that a spreadsheet would
    run as a formula is neutralised with a leading quote, as OWASP advises."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


__all__ = ["Host", "RuntimeBackend", "client_configs", "quarantine_diff"]


def unavailable(exc: BaseException) -> bool:
    """Whether a failure means a child of the tree is restarting (503: try again)."""
    return isinstance(exc, ChildUnavailable | pykka.ActorDeadError | pykka.Timeout | TimeoutError)


def brain_factory(
    host: Host, sessions: DashboardSessions, events: EventBus, chat: ChatConfig
) -> Callable[[tuple[str, int], TokenStore], tuple[list[Any], Callable[[], None]]]:
    """What the chat bridge calls once its port is bound: the Brain's routes and their closer."""
    from chalie.brain.access import allowed_hosts, allowed_origins
    from chalie.brain.web import Brain

    def make(address: tuple[str, int], tokens: TokenStore) -> tuple[list[Any], Callable[[], None]]:
        backend = RuntimeBackend(host, sessions)
        hosts = allowed_hosts(chat.host, address[1])
        brain = Brain(
            backend,
            sessions,
            tokens.verify,
            tokens.active_hash,
            hosts=hosts,
            origins=allowed_origins(hosts, chat.origins),
            subscribe_approvals=lambda callback: events.subscribe(None, callback),
            unavailable=unavailable,
        )
        return brain.routes(), backend.close

    return make


def link_url(address: str | None, code: str) -> str | None:
    """The one-time sign-in link for the chat server's address (``ws://host:port/chat``)."""
    if not address:
        return None
    rest = address.split("://", 1)[-1]
    hostport = rest.split("/", 1)[0]
    return f"http://{hostport}/brain/link?code={code}"


def brain_routes(host: Host, sessions: DashboardSessions) -> list[Route[Any]]:
    """The control commands of the Brain: ``brain.link`` (``chalie brain open``) and
    ``brain.sign_out`` (``chalie brain sign-out``)."""
    from actors.conversation.chat_bridge import ChatBridge

    def link(_args: NoArgs) -> ControlReply:
        try:
            addresses = host.child("chat", ChatBridge).within(5).call(ChatBridge.addresses)
        except (ChildUnavailable, pykka.ActorDeadError, pykka.Timeout) as exc:
            return control.failure(control.UNAVAILABLE, f"the web server is not running: {exc}")
        url = link_url(addresses.get("websocket"), sessions.new_link())
        if url is None:
            return control.failure(control.UNAVAILABLE, "the web server is not listening")
        return control.success({"url": url, "expires_in": sessions.link_ttl})

    def sign_out(_args: NoArgs) -> ControlReply:
        return control.success({"sessions": sessions.close_all()})

    return [Route("brain.link", NoArgs, link), Route("brain.sign_out", NoArgs, sign_out)]

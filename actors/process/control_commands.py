"""The daemon's control commands: one routing-table row each (name, argument type, handler).

A new command is one handler method on :class:`ControlCommands` and one
:class:`~chalie.process.routing.Route` row in :meth:`ControlCommands.routes`. Handlers
run on the endpoint's thread pool; they reach the tree's children through
restart-proof refs and answer with :func:`chalie.process.control.success` or
:func:`chalie.process.control.failure`.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Final, TypeVar

import msgspec
import pykka

from actors.calls.dispatcher import DispatcherActor
from actors.child_ref import ChildRef, ChildUnavailable
from actors.discovery import examples_command
from actors.gate.policy import PolicyActor
from actors.host import Host
from chalie.calls.direct_calls import DirectCalls, UnknownCall
from chalie.calls.trail import Trail
from chalie.gate.policy import PolicyError, check_channel, check_decision, check_permission
from chalie.process import control
from chalie.process.control import (
    DiscoveryExamplesArgs,
    IndexRebuildArgs,
    McpAnswerArgs,
    NoArgs,
    PolicyAnswerArgs,
    PolicyResetArgs,
    PolicySetArgs,
    ToolsCallArgs,
    ToolsCancelArgs,
    ToolsPollArgs,
    ToolsSchemaArgs,
    TrailArgs,
)
from chalie.process.routing import Route
from chalie.services import DiscoveryService
from chalie.wire.messages import ControlReply
from chalie.wire.principals import LOCAL_OWNER

log = logging.getLogger("chalie.process.control")

ACTOR_TIMEOUT: Final = 10.0

A = TypeVar("A", bound=pykka.Actor)


class ControlCommands:
    """The daemon's side of every control command, bound to the running tree."""

    def __init__(self, host: Host, desk: DirectCalls) -> None:
        self._host = host
        self.desk = desk
        self._book: Trail | None = None
        self._book_lock = threading.Lock()

    def routes(self) -> list[Route[Any]]:
        """The routing table: one row a command."""
        rows: list[Route[Any]] = [
            Route("status", NoArgs, self.status),
            Route("stop", NoArgs, self.stop),
            Route("tools.call", ToolsCallArgs, self.tools_call),
            Route("tools.poll", ToolsPollArgs, self.tools_poll),
            Route("tools.cancel", ToolsCancelArgs, self.tools_cancel),
            Route("tools.schema", ToolsSchemaArgs, self.tools_schema),
            Route("trail", TrailArgs, self.trail),
            Route("policy.list", NoArgs, self.policy_list),
            Route("policy.set", PolicySetArgs, self.policy_set),
            Route("policy.reset", PolicyResetArgs, self.policy_reset),
            Route("policy.pending", NoArgs, self.policy_pending),
            Route("policy.answer", PolicyAnswerArgs, self.policy_answer),
            Route("index.rebuild", IndexRebuildArgs, self.index_rebuild),
            Route("discovery.examples", DiscoveryExamplesArgs, self.discovery_examples),
            Route("mcp.reload", NoArgs, self.mcp_reload),
            Route("mcp.answer", McpAnswerArgs, self.mcp_answer),
        ]
        return [answer_errors(row) for row in rows]

    def close(self) -> None:
        self.desk.close()
        with self._book_lock:
            if self._book is not None:
                self._book.close()
                self._book = None

    # -- MCP connections ------------------------------------------------------------------
    def mcp_reload(self, _args: NoArgs) -> ControlReply:
        """Reconcile the MCP connection actors with chalie.db (after a ``chalie mcp`` change)."""
        from actors.mcp.connections import McpConnections

        mcp = self._host.child("mcp", McpConnections).within(60)
        return control.success(mcp.call(McpConnections.reload))

    def mcp_answer(self, args: McpAnswerArgs) -> ControlReply:
        """The owner answers a server's elicitation: its fields (checked against the form by
        the gate, whose durable request it is), or none to decline."""
        answer = "deny" if args.content is None else "allow_once"
        found = self._policy().call(
            PolicyActor.answer, args.request_id, answer, LOCAL_OWNER, args.content
        )
        if found is False:
            return control.failure(control.NOT_FOUND, f"no pending elicitation {args.request_id!r}")
        return control.success({"request_id": args.request_id, "answered": True})

    # -- the daemon ---------------------------------------------------------------------
    def status(self, _args: NoArgs) -> ControlReply:
        return control.success(self._host.status())

    def stop(self, _args: NoArgs) -> ControlReply:
        log.info("stop requested over the control socket")
        self._host.request_stop()
        return control.success({"stopping": True, "pid": os.getpid()})

    # -- tool calls ---------------------------------------------------------------------
    def tools_call(self, args: ToolsCallArgs) -> ControlReply:
        try:
            started = self.desk.start(args.tool, args.arguments, args.conversation_id)
        except ChildUnavailable as exc:
            return control.failure(control.UNAVAILABLE, str(exc))
        return control.success(
            {"call_id": started.call_id, "conversation_id": started.conversation_id}
        )

    def tools_poll(self, args: ToolsPollArgs) -> ControlReply:
        try:
            news = self.desk.poll(args.call_id, args.wait)
        except UnknownCall:
            return control.failure(control.NOT_FOUND, f"no call {args.call_id!r} in progress")
        except Exception as exc:
            log.error("tools.call %s failed in the runtime: %s", args.call_id, exc)
            return control.failure(control.UNAVAILABLE, f"the call failed in the runtime: {exc}")
        shown = [msgspec.to_builtins(r) for r in news.permission_requests]
        progress = msgspec.to_builtins(news.progress) if news.progress is not None else None
        if news.outcome is None:
            return control.success(
                {"state": "pending", "permission_requests": shown, "progress": progress}
            )
        return control.success(
            {
                "state": "done",
                "permission_requests": shown,
                "progress": progress,
                "outcome": msgspec.to_builtins(news.outcome),
            }
        )

    def tools_cancel(self, args: ToolsCancelArgs) -> ControlReply:
        cancelled = self._dispatcher().call(DispatcherActor.cancel_call, args.call_id)
        return control.success({"call_id": args.call_id, "cancelled": cancelled})

    def tools_schema(self, args: ToolsSchemaArgs) -> ControlReply:
        schema = self._host.input_schema(args.tool)
        if schema is None:
            return control.failure(control.NOT_FOUND, f"no tool {args.tool!r}")
        return control.success({"tool": args.tool, "input_schema": schema})

    # -- the trail ----------------------------------------------------------------------
    def _trail(self) -> Trail:
        # Opened on first use, from a handler thread: the Trail serialises its connection.
        with self._book_lock:
            if self._book is None:
                self._book = Trail(self._host.db_path)
            return self._book

    def trail(self, args: TrailArgs) -> ControlReply:
        rows = self._trail().query(
            tool=args.tool,
            status=args.status,
            code=args.code,
            conversation_id=args.conversation,
            limit=args.limit,
        )
        return control.success(msgspec.to_builtins(rows))

    # -- the permission table -----------------------------------------------------------
    def policy_list(self, _args: NoArgs) -> ControlReply:
        rules = self._policy().call(PolicyActor.list)
        pending = self._policy().call(PolicyActor.pending)
        return control.success(
            {"rules": msgspec.to_builtins(rules), "pending": msgspec.to_builtins(pending)}
        )

    def policy_pending(self, _args: NoArgs) -> ControlReply:
        return control.success(msgspec.to_builtins(self._policy().call(PolicyActor.pending)))

    def policy_set(self, args: PolicySetArgs) -> ControlReply:
        # Checked here, by the policy's own rules, so a bad request is a one-line
        # invalid-args reply rather than an exception raised inside the actor.
        try:
            check_channel(args.channel)
            check_permission(args.permission)
            check_decision(args.decision)
        except PolicyError as exc:
            return control.failure(control.INVALID_ARGS, str(exc))
        self._policy().call(PolicyActor.set, args.channel, args.permission, args.decision)
        return control.success(msgspec.to_builtins(args))

    def policy_reset(self, args: PolicyResetArgs) -> ControlReply:
        if args.permission is not None:
            try:
                check_permission(args.permission)
            except PolicyError as exc:
                return control.failure(control.INVALID_ARGS, str(exc))
        removed = self._policy().call(
            PolicyActor.reset, channel=args.channel, permission=args.permission
        )
        return control.success({"removed": msgspec.to_builtins(removed)})

    def policy_answer(self, args: PolicyAnswerArgs) -> ControlReply:
        # The control socket is 0600: whoever reaches it is the OS user, the owner.
        found = self._policy().call(
            PolicyActor.answer, args.request_id, args.answer, LOCAL_OWNER, args.content
        )
        if found is False:
            return control.failure(
                control.NOT_FOUND, f"no pending permission request {args.request_id!r}"
            )
        return control.success({"request_id": args.request_id, "answer": args.answer})

    # -- discovery ----------------------------------------------------------------------
    def index_rebuild(self, args: IndexRebuildArgs) -> ControlReply:
        discovery = self._discovery()
        job = discovery.start_rebuild(args.reuse) if args.start else discovery.state.job()
        return control.success({"job": job, "index": discovery.snapshot()})

    def discovery_examples(self, args: DiscoveryExamplesArgs) -> ControlReply:
        return control.success(examples_command(self._discovery(), args))

    def _discovery(self) -> DiscoveryService:
        discovery = self._host.services.discovery
        if discovery is None:
            raise ChildUnavailable("discovery", "the daemon runs no discovery index")
        return discovery

    # -- reaching the children ----------------------------------------------------------
    # ChildUnavailable and PolicyError raised through these become replies (answer_errors).
    def _policy(self) -> ChildRef[PolicyActor]:
        return self._host.child("policy", PolicyActor).within(ACTOR_TIMEOUT)

    def _dispatcher(self) -> ChildRef[DispatcherActor]:
        return self._host.child("dispatcher", DispatcherActor).within(ACTOR_TIMEOUT)


def answer_errors(route: Route[Any]) -> Route[Any]:
    """The route with ChildUnavailable and PolicyError answered as structured replies."""
    handler = route.handler

    def run(args: Any) -> ControlReply:
        try:
            return handler(args)
        except ChildUnavailable as exc:
            return control.failure(control.UNAVAILABLE, str(exc))
        except PolicyError as exc:
            if exc.code == "forbidden":
                return control.failure("forbidden", str(exc))
            return control.failure(control.INVALID_ARGS, str(exc))

    return Route(route.name, route.args, run)

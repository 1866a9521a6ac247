"""``talk_to_chalie``: one inbound agent message run as a turn on the ``external_agent`` channel.

Lifecycle of one call (all on the event-loop thread):

1. The arguments are checked (every bad field named) and a continued
   ``conversation_id`` must belong to the calling token.
2. The message goes to the conversation through the conversations port with the token's name
   as its ``origin``; the call follows the conversation's events (live, plus a
   backfill for a conversation created by this very send).
3. Each ``tool_started`` of the turn becomes an MCP progress notification
   carrying its ``act_summary``, and so does each ``tool_progress`` (a remote
   tool's own progress); ``tool_finished`` outcomes are collected, and
   ``rich_payload`` items become the answer's images, audio and resources.
   With ``loop_in_human`` and ``asks`` on (``[mcp_server] loop_in_human_asks``)
   while a chat client is connected, the turn runs with ``human_present`` (that
   turn only; :func:`chalie.gate.policy.decide` then asks instead of denying) and
   each ``permission_request`` is shown to the people as an
   :class:`AgentExchange` naming the agent; the call waits, reporting progress,
   until it is answered or expires.
4. ``turn_finished`` ends the call: the answer, the conversation id, and a
   line for every tool Chalie was not allowed to run, and why.
5. A cancelled request or a client that went away cancels the turn.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Final

from mcp.server.mcpserver import Context
from mcp_types import CallToolResult, TextContent

from chalie.conversation.follow import BACKFILL_LIMIT, TurnFollower
from chalie.conversation.port import ConversationsPort, ConversationsUnavailable
from chalie.conversation.requests import ConversationError, SendMessage
from chalie.gate.approvals import ApprovalStore
from chalie.gate.display import one_line
from chalie.mcp_server.exchange import AgentExchange, HumansPort
from chalie.mcp_server.gate import CALLER_KEY, Caller
from chalie.mcp_server.owners import ConversationOwners
from chalie.mcp_server.rich import blocks
from chalie.mcp_server.turns import CHANNEL, origin
from chalie.mcp_server.validation import InvalidArguments, TalkRequest, call_signature, check
from chalie.process import telemetry
from chalie.wire.events import (
    ErrorEvent,
    PermissionRequest,
    PermissionSettled,
    RichPayload,
    ToolFinished,
    ToolProgress,
    ToolStarted,
    TurnFinished,
)
from chalie.wire.messages import Accepted

log = logging.getLogger("chalie.mcp_server")

_GONE: Final = object()

DENY_WHY: Final = {
    "permission-denied": (
        "it needs a person's approval and no human is present on the external_agent channel"
    ),
    "approval-expired": "the person asked to approve it did not answer in time",
    "approval-pending": (
        "it waits for the owner's approval; once they have answered, ask again in this conversation"
    ),
}
# A permission-denied whose request a person answered "deny" (not "no human is present").
DECLINED_WHY: Final = "the person asked to approve it said no"
# How an owner's answer to a parked request is told to the agent's next turn.
OUTCOME_WORDS: Final = {
    "allow_once": "allowed once (make the call again now)",
    "allow_always": "allowed (make the call again now)",
    "deny": "refused",
    "expired": "not answered in time (refused)",
    "withdrawn": "withdrawn",
}


@dataclass
class TalkStats:
    calls: int = 0
    invalid: int = 0
    finished: int = 0
    cancelled: int = 0
    failed: int = 0


class ToolCallError(Exception):
    """A call that ends with a structured error result (not a protocol error)."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = data or {}


def error_result(code: str, message: str, data: dict[str, Any] | None = None) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=f"{code}: {message}")],
        structured_content={"error": {"code": code, "message": message, **(data or {})}},
        is_error=True,
    )


def framed(req: TalkRequest, told: list[tuple[str, str, str]] | None = None) -> str:
    """The user message of the turn: who asks, for what, the owner's answers to its parked
    requests (park_asks), then their words."""
    head = f"[agent: {req.agent_name} · project: {req.project_or_task_name}]"
    for request_id, permission, state in told or ():
        words = OUTCOME_WORDS.get(state, state)
        head += f"\n[the owner answered request {request_id} ({permission}): {words}]"
    return f"{head}\n{req.message}"


class TalkToChalie:
    """The tool body; one instance serves every call of the server."""

    def __init__(
        self,
        port: ConversationsPort,
        owners: ConversationOwners,
        desk: HumansPort,
        *,
        turn_wait: float,
        asks: bool = False,
        approvals: ApprovalStore | None = None,
    ) -> None:
        self.port = port
        self.asks = asks
        # park_asks: the store of parked requests, to tell the agent their outcomes.
        self.approvals = approvals
        self.owners = owners
        self.desk = desk
        self.turn_wait = turn_wait
        self.stats = TalkStats()
        self._pending: set[asyncio.Task[bool]] = set()
        # The ownership table is SQLite: read and written off the loop.
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="mcp-owners")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def __call__(self, ctx: Context, **arguments: Any) -> CallToolResult:
        """One call; its parameters are TalkRequest's fields (the signature below)."""
        self.stats.calls += 1
        caller = _caller(ctx)
        if caller is None:  # only a request the gate admitted carries one
            return error_result("unauthorized", "no authenticated caller")
        try:
            req = check(arguments)
        except InvalidArguments as exc:
            self.stats.invalid += 1
            fields = [{"field": e.field, "problem": e.problem} for e in exc.errors]
            return error_result(exc.code, str(exc).split(": ", 1)[1], {"fields": fields})
        try:
            return await self._run(ctx, caller, req)
        except ToolCallError as exc:
            self.stats.failed += 1
            return error_result(exc.code, str(exc), exc.data)

    async def _run(self, ctx: Context, caller: Caller, req: TalkRequest) -> CallToolResult:
        loop = asyncio.get_running_loop()
        if req.conversation_id is not None:
            owner = self.owners.known(req.conversation_id)
            if owner is None:  # not seen since start: one read, off the loop
                owner = await loop.run_in_executor(
                    self._pool, self.owners.owner, req.conversation_id
                )
            if owner != caller.token_id:
                raise ToolCallError(
                    "unknown-conversation",
                    f"no conversation {req.conversation_id!r} belongs to this token; "
                    "omit conversation_id to start a new one",
                )
        follow = _Follow(loop, uuid.uuid4().hex)
        human = bool(req.loop_in_human and self.asks and self._humans() > 0)
        park = self.approvals is not None and not human
        told: list[tuple[str, str, str]] = []
        if park and req.conversation_id is not None and self.approvals is not None:
            # The owner's answers since the agent's last message in this conversation.
            told = await loop.run_in_executor(
                self._pool, self.approvals.outcomes, req.conversation_id
            )
        follow.park = park
        follow.told = [
            {"request_id": r, "permission": perm, "outcome": state} for r, perm, state in told
        ]
        sub = None
        if req.conversation_id is not None:
            sub = self.port.subscribe(req.conversation_id, follow.push)
        try:
            sending = asyncio.ensure_future(
                self.port.send(
                    SendMessage(
                        conversation_id=req.conversation_id,
                        channel=CHANNEL,
                        text=framed(req, told),
                        client_msg_id=follow.client_msg_id,
                        origin=origin(caller.token_name),
                        principal=caller.principal,
                        human_present=human,
                        park_asks=park,
                        traceparent=telemetry.current_traceparent(),  # the SDK's server span
                    )
                )
            )
            try:
                # Shielded: a request cancelled while the message is being stored
                # still cancels the turn that message starts.
                sent = await asyncio.shield(sending)
            except asyncio.CancelledError:
                self.stats.cancelled += 1
                sending.add_done_callback(self._cancel_once_sent)
                raise
            except ConversationError as exc:
                raise ToolCallError(exc.code, str(exc)) from None
            except ConversationsUnavailable as exc:
                raise ToolCallError("internal-error", f"{exc}; retry later") from None
            except Exception as exc:
                log.warning("conversations refused an inbound message: %s", exc)
                raise ToolCallError(
                    "internal-error", "Chalie could not start the turn; retry later"
                ) from None
            cid = sent.conversation_id
            follow.turn_id = sent.turn_id
            if req.conversation_id is None:
                try:
                    await loop.run_in_executor(
                        self._pool,
                        self.owners.record,
                        cid,
                        caller.token_id,
                        req.agent_name,
                        req.project_or_task_name,
                        caller.token_name,
                    )
                    sub = self.port.subscribe(cid, follow.push)
                    follow.backfill(await self.port.events(cid, 0, BACKFILL_LIMIT))
                except asyncio.CancelledError:
                    self.stats.cancelled += 1
                    self._cancel_later(cid)
                    raise
            if req.loop_in_human:
                self._surface(cid, caller, req, "asked")
            return await self._follow(ctx, caller, req, cid, follow)
        finally:
            if sub is not None:
                sub.close()

    async def _follow(
        self, ctx: Context, caller: Caller, req: TalkRequest, cid: str, follow: _Follow
    ) -> CallToolResult:
        gone = asyncio.get_running_loop().create_task(_when_gone(caller, follow))
        try:
            async with asyncio.timeout(self.turn_wait):
                finished = await self._until_finished(ctx, follow, caller, req, cid)
        except asyncio.CancelledError:
            # The client cancelled the request (or, on 2026-07-28, dropped it): so does the turn.
            self.stats.cancelled += 1
            self._cancel_later(cid)
            raise
        except _Gone:
            # A legacy client whose response stream closed: nobody reads this answer.
            self.stats.cancelled += 1
            self._cancel_later(cid)
            raise ToolCallError(
                "cancelled", "the client went away; the turn was cancelled"
            ) from None
        except TimeoutError:
            with contextlib.suppress(Exception):
                await self.port.cancel(cid)
            raise ToolCallError(
                "tool-timeout",
                f"the turn did not finish within {self.turn_wait:.0f} s and was cancelled",
                {"conversation_id": cid},
            ) from None
        finally:
            gone.cancel()
        self.stats.finished += 1
        answer = finished.text or ""
        reason = finished.reason or "final"
        if req.loop_in_human:
            calls = tuple(f"{t.tool}: {t.status}" for t in follow.tools)
            self._surface(cid, caller, req, "answered", answer=answer, reason=reason, calls=calls)
        return _answer(cid, follow, answer, reason)

    async def _until_finished(
        self, ctx: Context, follow: _Follow, caller: Caller, req: TalkRequest, cid: str
    ) -> TurnFinished:
        sent = 0  # MCP progress must increase: one count per notification

        async def progress(message: str) -> None:
            nonlocal sent
            sent += 1
            await ctx.report_progress(sent, None, message)

        while True:
            event = await follow.next()
            if event is _GONE:
                raise _Gone
            if isinstance(event, RichPayload):
                follow.rich.append(event.payload)
            elif isinstance(event, ToolStarted):
                summary = event.act_summary or ""
                await progress(f"{event.tool}: {summary}" if summary else str(event.tool))
            elif isinstance(event, ToolProgress):
                detail = event.message or ""
                done, total = event.progress, event.total
                shown = f"{done:g}/{total:g}" if total is not None else f"{done:g}"
                await progress(
                    f"{event.tool}: {detail} ({shown})" if detail else f"{event.tool}: {shown}"
                )
            elif isinstance(event, ToolFinished):
                follow.tools.append(event)
            elif isinstance(event, PermissionSettled):
                if event.answer == "deny" and event.request_id in follow.asked:
                    follow.declined.add(follow.asked[event.request_id])
            elif isinstance(event, PermissionRequest):
                follow.asked[event.request_id] = event.tool
                if follow.park:
                    # Parked: the call has ended; the owner answers later, anywhere.
                    follow.parked.append(
                        {
                            "request_id": event.request_id,
                            "tool": event.tool,
                            "permission": event.permission,
                            "question": event.prompt,
                        }
                    )
                if req.loop_in_human or follow.park:
                    self._ask_people(cid, caller, req, event)
                await progress(f"waiting for a person to approve {event.tool}")
            elif isinstance(event, ErrorEvent):
                follow.errors.append(event)
                await progress(f"{event.code}: {event.message}")
            elif isinstance(event, TurnFinished):
                return event

    def _humans(self) -> int:
        try:
            return self.desk.humans_connected()
        except Exception:
            log.exception("could not count the connected people")
            return 0  # fail closed: nobody to ask, so ask is deny

    def _ask_people(
        self, cid: str, caller: Caller, req: TalkRequest, event: PermissionRequest
    ) -> None:
        what = one_line(event.act_summary or event.tool or "an action")
        prompt = (
            f"Agent {one_line(req.agent_name, 128)!r} (token {caller.token_name}, project "
            f"{one_line(req.project_or_task_name, 128)!r}) asked Chalie to do something that "
            f"needs your approval: {what} ({event.permission or event.tool}). Allow it?"
        )
        if event.prompt:
            prompt += "\n" + event.prompt
        exchange = AgentExchange(
            conversation_id=cid,
            phase="permission",
            token_name=caller.token_name,
            agent_name=req.agent_name,
            project=req.project_or_task_name,
            message=req.message,
            request_id=event.request_id or "",
            tool=event.tool or "",
            permission=event.permission or "",
            act_summary=event.act_summary or "",
            expires_at=event.expires_at or 0.0,
            prompt=prompt,
            form=event.form,
        )
        try:
            self.desk.surface(exchange)
        except Exception:
            log.exception("could not show a permission request to the people")

    def _cancel_once_sent(self, sending: asyncio.Future[Accepted]) -> None:
        if not sending.cancelled() and sending.exception() is None:
            self._cancel_later(sending.result().conversation_id)

    def _cancel_later(self, cid: str) -> None:
        task = asyncio.get_running_loop().create_task(self.port.cancel(cid))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _surface(
        self,
        cid: str,
        caller: Caller,
        req: TalkRequest,
        phase: str,
        *,
        answer: str = "",
        reason: str = "",
        calls: tuple[str, ...] = (),
    ) -> None:
        exchange = AgentExchange(
            calls=calls,
            conversation_id=cid,
            phase="asked" if phase == "asked" else "answered",
            token_name=caller.token_name,
            agent_name=req.agent_name,
            project=req.project_or_task_name,
            message=req.message,
            answer=answer,
            reason=reason,
        )
        try:
            self.desk.surface(exchange)
        except Exception:
            log.exception("could not surface an agent exchange")


# The SDK reads the tool's parameters from the handler's signature: made from TalkRequest,
# so the parameters are written once (chalie.mcp_server.validation).
TalkToChalie.__call__.__signature__ = call_signature(Context, CallToolResult)  # type: ignore[attr-defined]


class _Gone(Exception):
    """The client of this call went away."""


async def _when_gone(caller: Caller, follow: _Follow) -> None:
    await caller.gone.wait()
    follow.queue.put_nowait(_GONE)


class _Follow(TurnFollower):
    """One call's turn, and what its tools and errors said."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client_msg_id: str) -> None:
        super().__init__(loop, client_msg_id)
        self.tools: list[ToolFinished] = []
        self.errors: list[ErrorEvent] = []
        self.rich: list[dict[str, Any]] = []  # the turn's rich payloads, in order
        self.parked: list[dict[str, Any]] = []  # park_asks: requests waiting for the owner
        self.told: list[dict[str, Any]] = []  # the owner's answers told to this turn
        self.park = False
        self.asked: dict[str, str] = {}  # request id -> tool, the turn's permission requests
        self.declined: set[str] = set()  # tools whose request a person answered "deny"

    def accept(self, item: object) -> Any:
        """The turn's events, and how each of its permission requests ended (a settlement
        names its request, not the turn)."""
        if isinstance(item, PermissionSettled) and item.recorded and item.request_id in self.asked:
            return item
        return super().accept(item)


def _answer(cid: str, follow: _Follow, answer: str, reason: str) -> CallToolResult:
    could_not = [
        {
            "tool": t.tool,
            "code": t.code,
            "why": (
                DECLINED_WHY
                if t.code == "permission-denied" and t.tool in follow.declined
                else DENY_WHY.get(t.code or "", f"it failed ({t.code})")
            ),
        }
        for t in follow.tools
        if t.status != "success" and t.code in DENY_WHY
    ]
    lines = [answer.strip() or "(Chalie gave no text answer.)"]
    if reason != "final":
        lines.append(f"(The turn ended early: {reason}.)")
    for item in could_not:
        lines.append(f"(Chalie could not run {item['tool']}: {item['why']}.)")
    for parked in follow.parked:
        lines.append(
            f"(Waiting for the owner: request {parked['request_id']}, "
            f"{parked['permission']}. Ask again in this conversation after they answer.)"
        )
    lines.append(f"[conversation_id: {cid}]")
    return CallToolResult(
        content=[TextContent(type="text", text="\n\n".join(lines)), *blocks(follow.rich)],
        structured_content={
            "conversation_id": cid,
            "turn_id": follow.turn_id,
            "answer": answer,
            "finish_reason": reason,
            "tools": [{"tool": t.tool, "status": t.status, "code": t.code} for t in follow.tools],
            "could_not": could_not,
            "errors": [{"code": e.code, "message": e.message} for e in follow.errors],
            "waiting_for_owner": follow.parked,
            "owner_answers": follow.told,
        },
        is_error=reason == "model-error",
    )


def _caller(ctx: Context) -> Caller | None:
    request = ctx.request_context.request
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict):
        return None
    found = scope.get("state", {}).get(CALLER_KEY)
    return found if isinstance(found, Caller) else None

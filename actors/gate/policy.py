"""PolicyActor: the permission gate. Owns the policy table, gate decisions and pending approvals.

Lifecycle of one gate request (:meth:`PolicyActor.gate`):

1. ``internal`` abilities are allowed at once (decided by ``internal``).
2. The operator's setting is resolved (:func:`chalie.gate.policy.resolve`); a
   permission nobody configured is recorded as ``ask`` (origin ``seen``).
3. ``allow``/``internal`` allow, ``deny`` denies; ``ask`` denies where no
   human can answer (subconscious, or ``human_present`` false: see
   :func:`chalie.gate.policy.decide`), and elsewhere publishes a :class:`PermissionRequest` to the
   conversation and returns a future that is completed later by
   :meth:`answer` or by the expiry timer. The actor never waits for it. A
   request nobody is subscribed to still waits: the operator sees it in
   :meth:`pending` (``chalie policy list``) and may answer it there.
4. Any exception inside the gate is a deny (``fail-closed``), logged. A request
   is stored in ``chalie.db`` before it is published (:mod:`chalie.gate.approvals`):
   one a stop or a crash leaves open is pending again at the next start, still
   answerable (by the owner only) and still expiring to a denial.
5. A request ends once, here: answered, expired, or withdrawn (its call was
   cancelled, or the gate stops). The actor publishes a :class:`RequestSettled`
   to the conversation first, then completes the caller's future, so the turn
   records how its request ended before the call it held can report.
   This actor is the request's one owner: nobody else keeps or infers it.

The reply is a ``concurrent.futures.Future[GateDecision]``: through a proxy,
``proxy.gate(...).get()`` returns that future at once and ``.result()`` waits
for the decision. A caller that must not wait at all (the dispatcher) sends a
:class:`GateAsk` with ``tell`` and adds a done-callback to its own future.

:meth:`view` hands out a :class:`PolicyView`, a lock-free read of the
operator's table for the dispatcher's fast path; only ``ask`` and unseen
permissions need the actor.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import msgspec
import pykka

from actors.actor import SupervisedActor
from chalie.calls.dispatch import render_outcome
from chalie.calls.trail import process_writer
from chalie.gate import policy as rules
from chalie.gate.approvals import SETTLED, ApprovalStore
from chalie.gate.policy import PolicyError, PolicyRow, PolicyStore
from chalie.result import ToolResult
from chalie.store.sql import Follower, follow
from chalie.store.store_place import Place
from chalie.wire.actor_messages import ExpireRequest, GateAsk, ViewRequest, Withdraw
from chalie.wire.bus import EventBus
from chalie.wire.events import BackgroundResult, PermissionRequest
from chalie.wire.messages import (
    Decision,
    GateDecision,
    RequestSettled,
    Settlement,
    ToolCall,
    TurnContext,
)
from chalie.wire.principals import Principal, may_answer

__all__ = ["GateAsk", "PolicyActor", "PolicyView", "ViewCache", "ViewRequest", "Withdraw"]

log = logging.getLogger("chalie.gate.policy")


class PolicyView:
    """Read-only access to the operator's current table, safe from any thread."""

    def __init__(self, store: PolicyStore) -> None:
        self._store = store

    def setting(self, channel: str, permission: str, *, sensitive: bool = False) -> Decision | None:
        return rules.resolve(self._store.table, channel, permission, sensitive=sensitive)


class ViewCache:
    """The current PolicyActor's :class:`PolicyView`, fetched once per incarnation without
    waiting for it (a gate fast path: the dispatcher's, the MCP server asks'). One owner
    thread (or loop) each; None until the actor has answered."""

    def __init__(self) -> None:
        self._urn: str | None = None
        self._view: PolicyView | None = None
        self._future: Any = None

    def get(self, ref: Any) -> PolicyView | None:
        if ref.actor_urn != self._urn:
            self._urn, self._view = ref.actor_urn, None
            self._future = ref.ask(ViewRequest(), block=False)
        if self._view is None and self._future is not None:
            try:
                found = self._future.get(timeout=0)
            except pykka.Timeout:
                return None
            except Exception:
                self._future = None
                return None
            self._view = found if isinstance(found, PolicyView) else None
        return self._view


@dataclass
class _Pending:
    request: PermissionRequest
    reply: Future[GateDecision]
    timer: int  # the expiry, in this actor's inbox
    # False for a request a previous run left open: its call ended with that run.
    waiting: bool = True
    # Raised by another daemon on a shared store, answered here: its call waits there.
    elsewhere: bool = False


@dataclass(frozen=True)
class _SettledElsewhere:
    """A request was settled on the store (by this daemon or another)."""

    request_id: str


def _complete(reply: Future[GateDecision], decision: GateDecision) -> None:
    if not reply.done():
        try:
            reply.set_result(decision)
        except Exception:  # a concurrent set or a cancelled future: first one wins
            pass


class PolicyActor(SupervisedActor):
    """The permission gate; see the module docstring for the order of a decision."""

    def __init__(
        self,
        db_path: Place,
        events: EventBus,
        *,
        approval_expiry: float = 300.0,
        resume: Callable[[ToolCall], None] | None = None,
        gate_id: str | None = None,
    ) -> None:
        """``resume``: hands a stored call to the dispatcher (a tell), to run it on the
        owner's answer after a restart (chalie.gate.approvals); None: such calls end with a
        result that says the answer was recorded. ``gate_id``: whose requests this gate
        raises on a shared store (default: this process's; tests play two daemons)."""
        super().__init__()
        self._gate_id = gate_id or process_writer()
        self._resume = resume
        if not isinstance(approval_expiry, int | float) or approval_expiry <= 0:
            raise ValueError("approval_expiry must be a positive number of seconds")
        self._db_path = db_path
        self._events = events
        self._expiry = float(approval_expiry)
        self._store: PolicyStore | None = None
        self._approvals: ApprovalStore | None = None
        self._pending: dict[str, _Pending] = {}
        self._follower: Follower | None = None

    # -- lifecycle -----------------------------------------------------------
    def on_start(self) -> None:
        self._store = PolicyStore(self._db_path)
        self._view = PolicyView(self._store)
        self._approvals = ApprovalStore(self._db_path, gate=self._gate_id)
        me = self.actor_ref

        def settled(request_id: str) -> None:
            with contextlib.suppress(pykka.ActorDeadError):  # stopping: nothing waits here
                me.tell(_SettledElsewhere(request_id))

        self._follower = follow(self._db_path, SETTLED, settled)
        self._reopen()

    def _reopen(self) -> None:
        """Requests a previous run (or this actor before a restart) left open stay answerable
        until their expiry; those past it end expired now (chalie.gate.approvals)."""
        assert self._approvals is not None
        now = time.time()
        for request in self._approvals.left_open():
            if request.request_id in self._pending:
                continue
            if request.expires_at <= now:
                self._approvals.settle(request.request_id, "expired")
                log.info("permission request %s expired while Chalie was down", request.request_id)
                continue
            timer = self.schedule(request.expires_at - now, ExpireRequest(request.request_id))
            self._pending[request.request_id] = _Pending(request, Future(), timer, waiting=False)
        if self._pending:
            log.warning(
                "permission requests left open by the last run are pending again",
                extra={"count": len(self._pending)},
            )

    def on_stop(self) -> None:
        if self._follower is not None:
            self._follower.close()
        self._drop_pending("the permission gate stopped while waiting for the answer")
        if self._store is not None:
            self._store.close()
        if self._approvals is not None:
            self._approvals.close()

    def on_failure(self, *exc: Any) -> None:
        if self._follower is not None:
            self._follower.close()  # a restart follows anew
        self._drop_pending("the permission gate failed while waiting for the answer")

    def _drop_pending(self, reason: str) -> None:
        """The gate stops: the waiting calls end denied; the stored requests stay pending,
        for the next start (chalie.gate.approvals)."""
        pending_now, self._pending = self._pending, {}
        for pending in pending_now.values():
            self.unschedule(pending.timer)
            self._settle(pending, "withdrawn", rules.failed_closed(reason), durable=False)

    def _settle(
        self,
        pending: _Pending,
        answer: Settlement,
        decision: GateDecision,
        *,
        by: Principal | None = None,
        durable: bool = True,
    ) -> None:
        """End one request: stored as ended, its conversation hears how, then its caller
        gets the decision.

        Published first, so the turn records the settlement before the call it held
        can run and report (the request has this one owner; nobody infers it).
        """
        request = pending.request
        if durable and self._approvals is not None:
            try:
                self._approvals.settle(request.request_id, answer, None if by is None else by.id)
            except Exception:
                log.exception("could not store how request %s ended", request.request_id)
        settled = RequestSettled(
            request_id=request.request_id, conversation_id=request.conversation_id, answer=answer
        )
        try:
            self._events.publish(request.conversation_id, settled)
        finally:
            _complete(pending.reply, decision)

    @property
    def store(self) -> PolicyStore:
        if self._store is None:
            raise RuntimeError("the policy store is not open")
        return self._store

    # -- messages ------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, GateAsk):
            return self._gate(message)
        if isinstance(message, ViewRequest):
            return self._view
        if isinstance(message, ExpireRequest):
            self._expire(message.request_id)
            return None
        if isinstance(message, Withdraw):
            self._withdraw(message.reply)
            return None
        if isinstance(message, _SettledElsewhere):
            self._settled_elsewhere(message.request_id)
            return None
        return super().on_receive(message)

    def _settled_elsewhere(self, request_id: str) -> None:
        """A request this gate holds was settled on the store by another daemon (an owner
        answered it there): the call waiting here gets that answer."""
        pending = self._pending.get(request_id)
        if pending is None or self._approvals is None:
            return
        found = self._approvals.state(request_id)
        if found is None or found[0] == "pending":
            return  # this gate's own settle (it popped the request first), or not yet
        state = found[0]
        permission = pending.request.permission
        if state in ("allow_once", "allow_always", "deny"):
            decision = rules.answer_decision(state, permission, None, None)
        elif state == "expired":
            decision = rules.approval_expired(permission, self._expiry)
        else:
            decision = rules.denied_by_human(permission)
        del self._pending[request_id]
        self.unschedule(pending.timer)
        log.info("permission request %s was answered on another daemon: %s", request_id, state)
        self._settle(pending, state, decision, durable=False)  # type: ignore[arg-type]
        if not pending.waiting:
            self._after_restart(pending.request, state, decision)

    # -- the gate ------------------------------------------------------------
    def gate(
        self,
        call_id: str,
        context: TurnContext,
        tool: str,
        permission: str,
        internal: bool,
        act_summary: str,
        params_redacted: dict[str, Any],
        *,
        reply: Future[GateDecision] | None = None,
        reach: str | None = None,
        resume: bytes | None = None,
        form: dict[str, Any] | None = None,
        expires_in: float | None = None,
        binding: str | None = None,
    ) -> Future[GateDecision]:
        """Decide one call; the returned future completes now, or when a human answers.

        The fields are a :class:`~chalie.wire.actor_messages.GateAsk`'s (what the dispatcher tells
        this
        actor); this is the same ask made through a proxy. ``form``: a question whose
        answer fills it (a server's elicitation); it is put to a person whatever the
        setting, unless the setting is deny or nobody is there, and it expires after
        ``expires_in`` seconds (default: the approval expiry) to a denial.
        """
        return self._gate(
            GateAsk(
                call_id=call_id,
                context=context,
                tool=tool,
                permission=permission,
                internal=internal,
                act_summary=act_summary,
                params_redacted=params_redacted,
                reply=reply if reply is not None else Future(),
                reach=reach,
                resume=resume,
                form=form,
                expires_in=expires_in,
                binding=binding,
            )
        )

    def _gate(self, ask: GateAsk) -> Future[GateDecision]:
        try:
            decision = self._decide(ask)
        except Exception as exc:
            log.exception("the permission gate failed for call %r; denying", ask.call_id)
            decision = rules.failed_closed(type(exc).__name__)
        if decision is not None:
            _complete(ask.reply, decision)
        return ask.reply

    def _decide(self, ask: GateAsk) -> GateDecision | None:
        context, permission, internal = ask.context, ask.permission, ask.internal is True
        channel = str(context.channel)
        setting: Decision | None = None
        if not internal:
            channel = rules.check_channel(context.channel)
            rules.check_permission(permission)
            setting = rules.resolve(
                self.store.table, channel, permission, sensitive=ask.reach is not None
            )
            if setting is None and self.store.record_seen(channel, permission):
                log.info("unseen permission %s on %s recorded as ask", permission, channel)
        decision = rules.gate_rule(
            setting,
            permission=permission,
            channel=channel,
            human_present=context.human_present,
            internal=internal,
        )
        if ask.form is not None:
            # A form is filled by a person or not at all: deny, or nobody to ask, declines;
            # an allow does not answer it (never on the owner's behalf), so it is asked.
            if decision is not None and not decision.allowed:
                return decision
            self._ask_human(ask, resume=None)
            return None
        if (
            decision is not None
            and decision.decision == "deny"
            and context.park_asks
            and not internal
            and setting in (None, "ask")
        ):
            # No human now: the owner answers later (park_asks), and the agent's next call
            # after an allow_once runs on that answer.
            # The answer covers exactly the call the owner saw: any other call parks anew.
            assert self._approvals is not None
            granted = (
                None
                if ask.binding is None
                else self._approvals.take_grant(context.conversation_id, permission, ask.binding)
            )
            if granted is not None:
                log.info("call %s runs on the owner's answer to request %s", ask.call_id, granted)
                return rules.allowed("human")
            return self._park(ask)
        if (
            context.resumes
            and not internal
            and setting in (None, "ask")
            and self._approvals is not None
            and ask.binding is not None
            and self._approvals.take_resume(context.resumes, permission, ask.binding)
        ):
            # A stored call run again on the owner's answer to its request, once.
            log.info(
                "call %s runs on the owner's answer to request %s", ask.call_id, context.resumes
            )
            return rules.allowed("human")
        if decision is not None:
            return decision
        self._ask_human(ask, resume=ask.resume)
        return None

    def _ask_human(self, ask: GateAsk, *, resume: bytes | None) -> None:
        """Put the call to a person; ``resume``: the call stored with the request, if any.
        A form's request expires after its own ``expires_in``, any other after the gate's."""
        expires_in = ask.expires_in if ask.form is not None else None
        expiry = self._expiry if expires_in is None else max(0.001, float(expires_in))
        request = self._request(ask, expiry)
        request_id = request.request_id
        # Durable before anyone is asked: a request nobody could find later is never raised
        # (a failed write fails the gate closed). The call is stored with it, to be run
        # again if the owner answers after a restart (chalie.gate.approvals).
        if self._approvals is not None:
            self._approvals.put(request, call=resume, binding=ask.binding)
        timer = self.schedule(expiry, ExpireRequest(request_id))
        self._pending[request_id] = _Pending(request, ask.reply, timer)
        log.info(
            "asking conversation %s to allow %s (request %s, call %s)",
            ask.context.conversation_id,
            ask.permission,
            request_id,
            ask.call_id,
        )
        self._events.publish(ask.context.conversation_id, request)

    def _park(self, ask: GateAsk) -> GateDecision:
        """A durable request for the owner; the call itself ends now, saying it waits."""
        request = self._request(ask)
        assert self._approvals is not None
        self._approvals.put(request, parked=True, binding=ask.binding)
        timer = self.schedule(self._expiry, ExpireRequest(request.request_id))
        self._pending[request.request_id] = _Pending(request, Future(), timer, waiting=False)
        log.info(
            "parked %s for the owner (request %s, call %s)",
            ask.permission,
            request.request_id,
            ask.call_id,
        )
        self._events.publish(ask.context.conversation_id, request)
        return rules.parked(ask.permission, request.request_id)

    def _request(self, ask: GateAsk, expiry: float | None = None) -> PermissionRequest:
        context, tool, permission = ask.context, ask.tool, ask.permission
        act_summary, params, reach = ask.act_summary, ask.params_redacted, ask.reach
        asked_by = rules.asked_by(context.principal, context.channel)
        return PermissionRequest(
            request_id=uuid.uuid4().hex,
            conversation_id=context.conversation_id,
            channel=context.channel,
            permission=permission,
            tool=tool,
            act_summary=act_summary[:200],
            params=params,
            expires_at=time.time() + (self._expiry if expiry is None else expiry),
            ts=time.time(),
            principal=context.principal,
            asked_by=asked_by,
            reach=reach,
            notes=ask.notes,
            prompt=rules.prompt(
                tool,
                permission,
                act_summary,
                params,
                asked_by,
                reach,
                notes=ask.notes,
                form=ask.form is not None,
            ),
            form=ask.form,
        )

    def _expire(self, request_id: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            log.info("permission request %s for %s expired", request_id, pending.request.permission)
            permission = pending.request.permission
            self._settle(pending, "expired", rules.approval_expired(permission, self._expiry))

    def _withdraw(self, reply: Future[GateDecision]) -> None:
        for request_id, pending in list(self._pending.items()):
            if pending.reply is reply:
                del self._pending[request_id]
                self.unschedule(pending.timer)
                self._settle(
                    pending, "withdrawn", rules.denied_by_human(pending.request.permission)
                )
                log.info("permission request %s withdrawn by its caller", request_id)

    def answer(
        self, request_id: str, answer: str, by: Principal | None, content: Any = None
    ) -> bool:
        """Apply ``by``'s answer; False when no such request is pending (answered or expired).

        Only an owner answers, and never the principal whose turn raised the
        request (:func:`chalie.wire.principals.may_answer`): anyone else gets
        :class:`~chalie.gate.policy.PolicyError` ``forbidden`` and the request stays.
        A request with a form is answered with ``content``, its fields; one that does
        not fit the form is a PolicyError and the request stays pending
        (:func:`chalie.gate.policy.answer_decision`). The content is handed to the caller
        only: never stored, logged or published.
        """
        if answer not in rules.ANSWERS:
            raise PolicyError(f"unknown answer {answer!r}; answers are {', '.join(rules.ANSWERS)}")
        found = self._pending.get(request_id) if isinstance(request_id, str) else None
        if found is None and isinstance(request_id, str) and self._approvals is not None:
            # Raised by another daemon on the shared store: answered here, it is settled in
            # the store, and the daemon whose call waits hears of it (_settled_elsewhere).
            stored = self._approvals.request(request_id)
            if stored is not None and self._approvals.raised_live_elsewhere(request_id):
                if stored.form is None:  # a form's content stays local
                    found = _Pending(stored, Future(), -1, waiting=False, elsewhere=True)
            elif stored is not None:
                # Its gate is gone (a daemon that stopped or died): answered as left open.
                found = _Pending(stored, Future(), -1, waiting=False)
        if found is None:
            return False
        if not may_answer(by, found.request.principal):
            log.warning(
                "a permission answer was refused: only the owner answers",
                extra={
                    "request_id": request_id,
                    "principal": None if by is None else by.id,
                    "scope": None if by is None else by.scope,
                },
            )
            raise PolicyError("only the owner answers a permission request", code="forbidden")
        form = found.request.form
        # A bad answer (content that does not fit the form...) raises here: the request stays.
        decision = rules.answer_decision(answer, found.request.permission, form, content)
        pending = self._pending.pop(request_id, found)
        self.unschedule(pending.timer)
        request = pending.request
        try:
            if answer == "allow_always" and form is None:
                if request.channel is None:  # never so for a request this gate raised
                    raise ValueError("the request names no channel")
                self.store.set(request.channel, request.permission, "allow")
        except Exception as exc:
            log.exception("applying the answer to %s failed; denying", request_id)
            decision = rules.failed_closed(type(exc).__name__)
        self._settle(pending, answer, decision, by=by)  # type: ignore[arg-type]  # checked above
        if not pending.waiting and not pending.elsewhere:
            self._after_restart(request, answer, decision)
        return True

    def _after_restart(
        self, request: PermissionRequest, answer: str, decision: GateDecision
    ) -> None:
        """A request a previous run left open is answered: its stored call runs again in the
        background on that answer, or its conversation hears why not (chalie.gate.approvals)."""
        assert self._approvals is not None
        parked, call = self._approvals.waiting_call(request.request_id)
        if parked:
            return  # park_asks: the agent's next call takes the answer
        if decision.allowed and call is not None and self._resume is not None:
            context = msgspec.structs.replace(
                call.context,
                resumes=request.request_id,
                allow_async=True,
                scope="unrestricted",  # the tool the owner allowed, whatever the turn had
                turn_id=f"resumed-{request.request_id}",
            )
            arguments = {**call.arguments, "act_summary": call.act_summary, "async": True}
            resumed = ToolCall(
                call_id=f"{call.call_id}-resumed"[:128],
                tool=call.tool,
                arguments=arguments,
                context=context,
            )
            log.info(
                "request %s answered after a restart: its call runs again as %s",
                request.request_id,
                resumed.call_id,
            )
            try:
                self._resume(resumed)
                return
            except Exception:
                log.exception("the call of request %s could not be resumed", request.request_id)
        if decision.allowed:
            result = ToolResult.error(
                "interrupted",
                f"The owner allowed {request.permission} after Chalie restarted, but the call "
                "that waited could not be run again"
                + (
                    " (its arguments held a secret, which is never stored)."
                    if call is None
                    else "."
                )
                + (" It is allowed from now on." if answer == "allow_always" else ""),
                hint="make the call again if it is still wanted.",
            )
        else:
            result = ToolResult.error(
                decision.code or "permission-denied",
                f"The owner declined {request.permission} after Chalie restarted; the call "
                "that waited did not run.",
                hint="do not retry this call; ask the person what they want instead.",
            )
        log.info("request %s answered after a restart: %s", request.request_id, result.code)
        tool = call.tool if call is not None else request.tool
        self._events.publish(
            request.conversation_id,
            BackgroundResult(
                call_id=f"{call.call_id if call else request.request_id}-resumed"[:128],
                conversation_id=request.conversation_id,
                tool=tool,
                envelope=render_outcome(tool, result),
                status=result.status,
                code=result.code,
            ),
        )

    # -- the operator's surface --------------------------------------------------
    def view(self) -> PolicyView:
        return self._view

    def list(self, include_internal: bool = False) -> builtins.list[PolicyRow]:
        return self.store.rows(include_internal=include_internal)

    def set(self, channel: str, permission: str, decision: str) -> PolicyRow:
        return self.store.set(channel, permission, decision)

    def reset(self, channel: str | None = None, permission: str | None = None) -> int:
        return self.store.reset(channel, permission)

    def pending(self) -> builtins.list[PermissionRequest]:
        """The requests this gate holds, then the others pending on a shared store: raised
        by another live daemon (answered here, its call resumes there) or left open by one
        that is gone (answered here as left open)."""
        own = [p.request for p in self._pending.values()]
        if self._approvals is None:
            return own
        seen = {r.request_id for r in own}
        return own + [r for r in self._approvals.still_pending() if r.request_id not in seen]

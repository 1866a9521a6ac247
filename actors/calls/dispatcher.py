"""DispatcherActor: the single chokepoint from a turn to an ability.

Lifecycle of one call (the pure steps live in :mod:`chalie.calls.dispatch`; this
actor sequences them and owns the calls in flight, on its own thread only):

1. :class:`~chalie.wire.actor_messages.Dispatch`: check the call's shape, resolve a
   fresh per-call instance bound to the turn, split off ``act_summary`` /
   ``async``, pre-validate (defaults applied, action map, JSON Schema,
   Params), derive the permission with the ability's ``classify`` from those
   validated params, and prepare the trail row.
2. Gate: the one rule (:func:`chalie.gate.policy.gate_rule`) applied to the
   operator's setting, read from the PolicyActor's lock-free view; a call
   that needs the PolicyActor (``ask``, or a permission never seen) is sent
   there with ``tell`` and its decision comes back as a
   :class:`~chalie.wire.actor_messages.GateAnswered` message.
3. Execute: a :class:`~chalie.calls.execution.Job` (exactly the params the gate
   saw) goes to the executor registered for the ability's ``isolation``
   (:data:`actors.calls.executors.EXECUTORS`); its result comes back as an
   :class:`~chalie.wire.actor_messages.Executed` message (or, reported on this actor's own
   thread by the worker pool it hosts, is handled at once) and its deadline as
   a :class:`~chalie.wire.actor_messages.Deadline` message. With ``async`` on a channel
   that allows it, the turn gets an immediate success envelope naming the
   call id; the final envelope goes to the outbox (stored until a consumer
   acknowledges it) and is published to the conversation.
4. Finish, exactly once, here: render the one envelope, complete the trail
   row, then reply (the trail is written before the reply, so an outcome the
   turn saw is on disk). A late result of a call that already ended (timed
   out, cancelled) is ignored.

The trail row of a call decided at once is written ``running`` about
:data:`START_ROW_DELAY` (2 ms) after the handler that started it, in a batch
(a :class:`~chalie.wire.actor_messages.FlushTrail` timer message); a call that ends sooner
(most do) is written as one complete row. Calls waiting for a human are
written ``running`` before they are asked, and background calls before their
conversation is told the result will come: that promise is kept after a
SIGKILL only through the row (the next start gives the conversation an
``interrupted`` result). So a SIGKILL loses no call whose outcome or promise
was returned, and every call in flight for more than a few ms is marked
``interrupted`` at the next start.

Timeouts and cancellation: the per-ability timeout runs from the gate's
allow; on expiry (or on ``cancel_turn``) the call ends with ``tool-timeout``
(or ``cancelled``) at once, the instance's ``cancelled`` event is set and the
executor is asked to cancel the job.

Replies are ``concurrent.futures.Future[ToolOutcome]`` (a cheap one,
:class:`actors.future.Reply`): ``submit(ref, call)``
sends the call with ``tell`` and returns the future; through a proxy,
``proxy.dispatch(call).get()`` returns the same kind of future. Nothing raises
out of dispatch: every failure is an error envelope.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec
import pykka

from actors.actor import SupervisedActor, tell_quietly
from actors.calls.executors import EXECUTORS, ExecutorEnv, Factory, build
from actors.calls.executors.inline import DEFAULT_LANE_QUEUE, InlineExecutor
from actors.calls.executors.process import WorkerPool
from actors.child_ref import ChildRef, ChildUnavailable
from actors.directory import Directory
from actors.future import Reply
from actors.gate.policy import PolicyActor, PolicyView, ViewCache
from actors.timers import Ready, TimerInbox
from chalie.ability import Ability, gate_internal
from chalie.calls import dispatch as steps
from chalie.calls.execution import Executor, Job
from chalie.calls.faults import FAULTS
from chalie.calls.outbox import DEFAULT_MAX_AGE, DEFAULT_MAX_ROWS, Outbox, check_limits
from chalie.calls.registry import Entry
from chalie.calls.trail import CallRecord, Trail, TrailRow, params_json, redact
from chalie.gate import policy as rules
from chalie.gate.approvals import ResumableCall, call_binding, encode_call
from chalie.process import telemetry
from chalie.process.config import WorkersConfig
from chalie.result import ToolResult
from chalie.store.store_place import Place
from chalie.wire.actor_messages import (
    Deadline,
    Dispatch,
    Executed,
    FlushTrail,
    GateAnswered,
    GateAsk,
    RecordAsk,
    SettleTrail,
    Suggested,
    Withdraw,
)
from chalie.wire.bus import EventBus
from chalie.wire.events import BackgroundResult
from chalie.wire.messages import CancelTurn, GateDecision, ToolCall, ToolOutcome, TurnContext
from chalie.wire.principals import principal_id

if TYPE_CHECKING:
    from actors.workers.worker_pool import HostedPool

__all__ = ["DEFAULT_LANE_QUEUE", "DispatcherActor", "WorkerPool", "submit"]

log = logging.getLogger("chalie.calls.dispatch")

# Unknown-tool lookups waiting at most; past this the plain error is answered.
MAX_SUGGESTING: Final = 64
# How long a call may run before its ``running`` trail row must be on disk.
START_ROW_DELAY: Final = 0.002
# How soon, when no other trail write comes, the store's answers to the ends sent without
# waiting (PostgreSQL) are read: a row not confirmed is written again then.
SETTLE_DELAY: Final = 0.02
SETTLE_RETRY: Final = 1.0  # after a failure to write them again (the store is away)


class _Call(msgspec.Struct, eq=False):
    """One call in flight; touched only on the dispatcher's thread (a Struct: cheap to make)."""

    seq: int
    call: ToolCall
    entry: Entry
    instance: Ability
    pre: steps.Prevalidated
    permission: str
    act_summary: str
    redacted: dict[str, Any]
    given: dict[str, Any]  # what a person asked is shown: the redacted params the call gave
    background: bool
    reply: Future[ToolOutcome]
    rec: CallRecord
    reach: str | None = None  # set: a sensitive call (chalie.ability.Ability.reach)
    gate: GateDecision | None = None
    job: Job | None = None
    executor: Executor | None = None
    timer: int | None = None
    ask: GateAsk | None = None
    replied: bool = False

    @property
    def tool(self) -> str:
        return self.entry.name


def _resolved(outcome: ToolOutcome) -> Future[ToolOutcome]:
    fut: Future[ToolOutcome] = Reply()
    fut.set_result(outcome)
    return fut


def _error_outcome(call: object, result: ToolResult) -> ToolOutcome:
    tool = getattr(call, "tool", "")
    name = steps.envelope_name(tool)
    call_id = getattr(call, "call_id", "")
    return ToolOutcome(
        call_id=call_id if isinstance(call_id, str) else "",
        tool=str(tool)[:200],
        status="error",
        envelope=steps.render_outcome(name, result),
        code=result.code,
    )


def submit(ref: pykka.ActorRef[Any], call: ToolCall) -> Future[ToolOutcome]:
    """Send one call to the dispatcher; the future resolves to its ToolOutcome, never raises."""
    reply: Future[ToolOutcome] = Reply()
    try:
        ref.tell(Dispatch(call, reply))
    except pykka.ActorDeadError:
        return _resolved(_error_outcome(call, FAULTS.dispatcher_restarting()))
    return reply


class DispatcherClient:
    """What a caller of tools holds: one handle on the dispatcher child, kept once.

    A call goes in and an outcome comes out, never an exception: a dispatcher that
    is restarting or gone answers the call with the error outcome that says so
    (``internal-error``, safe to retry). The Conversations actor's turns and the MCP
    server's gateway both call through one of these.
    """

    def __init__(self, dispatcher: ChildRef[DispatcherActor]) -> None:
        self._dispatcher = dispatcher

    def submit(self, call: ToolCall) -> Future[ToolOutcome]:
        """The call's outcome, as a future that never raises; this never blocks."""
        try:
            ref = self._dispatcher.current()
        except ChildUnavailable as exc:
            return _resolved(_error_outcome(call, exc.result()))
        return submit(ref, call)

    async def call(self, call: ToolCall) -> ToolOutcome:
        """:meth:`submit`, awaited on an event loop."""
        return await asyncio.wrap_future(self.submit(call))

    def cancel_turn(self, turn_id: str) -> None:
        """Cancel a turn's calls (a tell; with no dispatcher there is nothing to cancel)."""
        with contextlib.suppress(ChildUnavailable):
            self._dispatcher.tell(CancelTurn(turn_id=turn_id))


class DispatcherActor(SupervisedActor):
    """The only path from a turn to an ability; see the module docstring for the steps."""

    def __init__(
        self,
        registry: Any,
        services: Any,
        trail_db_path: Place,
        policy: ChildRef[PolicyActor] | pykka.ActorRef[PolicyActor],
        workers: WorkerPool | None,
        events: EventBus,
        *,
        inline_threads: int = 16,
        lane_limit: int | None = None,
        lane_queue: int = DEFAULT_LANE_QUEUE,
        executors: Mapping[str, Factory] | None = None,
        parts: Mapping[str, Any] | None = None,
        children: Directory | None = None,
        outbox_max_age: float = DEFAULT_MAX_AGE,
        outbox_max_rows: int = DEFAULT_MAX_ROWS,
        pool: HostedPool | None = None,
        worker_settings: WorkersConfig | None = None,
        dropins: Path | None = None,
    ) -> None:
        super().__init__()
        self._registry = registry
        self._services = services
        self._trail_path = trail_db_path
        self._policy = policy if isinstance(policy, ChildRef) else ChildRef.to(policy, "policy")
        self._events = events
        env = ExecutorEnv(
            inline_threads=inline_threads,
            lane_limit=lane_limit,
            lane_queue=lane_queue,
            workers=workers,
            services=services,
            parts=dict(parts or {}),
            children=children if children is not None else Directory(),
            worker_settings=worker_settings or WorkersConfig(),
            dropins=dropins,
        )
        # Built here so bad settings fail the start; the inline threads start on first use.
        self._executors: dict[str, Executor] = build(env, executors or EXECUTORS)
        self._inflight: dict[int, _Call] = {}
        self._seq = itertools.count(1)
        # Job ids: unique per call across restarts and processes, without a uuid per call.
        self._job_prefix = f"{os.getpid():x}-{os.urandom(6).hex()}"
        self._views = ViewCache()
        self._timers: TimerInbox = self.timers  # deadlines and the trail flush, on this thread
        self._flush_timer: int | None = None  # the pending FlushTrail, if any
        self._settle_timer: int | None = None  # the pending SettleTrail, if any
        # Unknown tool names are looked up in discovery on this one thread (it blocks).
        self._suggester: ThreadPoolExecutor | None = None
        self._suggesting = 0
        self._trail: Trail | None = None
        self._outbox: Outbox | None = None
        check_limits(outbox_max_age, outbox_max_rows)
        self._outbox_max_age = outbox_max_age
        self._outbox_max_rows = outbox_max_rows
        self._thread: int | None = None  # this actor's thread, from on_start
        self._starting = False  # inside an executor's start (see _reporter)
        # The worker pool, when this actor hosts it (``workers`` is then its handle):
        # begun on this thread in on_start, its sockets watched by this actor's inbox.
        self._pool = pool

    # -- lifecycle -----------------------------------------------------------
    def on_start(self) -> None:
        self._thread = threading.get_ident()
        self._trail = Trail(self._trail_path)
        interrupted = self._trail.recover()
        if interrupted:
            log.warning(
                "marked %d call(s) left running by a previous run as interrupted", interrupted
            )
        self._outbox = Outbox(
            self._trail_path, max_age=self._outbox_max_age, max_rows=self._outbox_max_rows
        )
        if self._pool is not None:
            self._pool.begin(self._timers)

    def on_stop(self) -> None:
        self._shutdown("the dispatcher stopped during the call")

    def on_failure(self, *exc: Any) -> None:
        self._shutdown("the dispatcher failed during the call")

    def _shutdown(self, reason: str) -> None:
        for state in list(self._inflight.values()):
            self._abort(state, FAULTS.stopped(reason))
        if self._suggester is not None:
            self._suggester.shutdown(wait=False, cancel_futures=True)
        for executor in self._executors.values():
            try:
                executor.close()
            except Exception:
                log.exception("closing an executor failed")
        if self._pool is not None:
            try:  # after the calls were aborted: their jobs need no answer any more
                self._pool.end()
            except Exception:
                log.exception("stopping the worker pool failed")
        if self._trail is not None:
            self._trail.close()
        if self._outbox is not None:
            self._outbox.close()

    # -- messages: one table, type -> handler -------------------------------------------
    def on_receive(self, message: Any) -> Any:
        handler = _HANDLERS.get(type(message))
        if handler is None:
            return super().on_receive(message)
        return handler(self, message)

    def _on_dispatch(self, message: Dispatch) -> None:
        self._dispatch(message.call, message.reply)

    def _on_executed(self, message: Executed) -> None:
        state = self._inflight.get(message.seq)
        if state is not None:  # else the call already ended (timeout, cancel): ignored
            self._finish(state, message.result)

    def _on_gate_answered(self, message: GateAnswered) -> None:
        state = self._inflight.get(message.seq)
        if state is not None and state.gate is None:
            self._after_gate(state, _answer(state, message.answer))

    def _on_deadline(self, message: Deadline) -> None:
        state = self._inflight.get(message.seq)
        if state is not None:
            state.timer = None
            self._abort(state, FAULTS.timeout(state.tool, state.entry.cls.timeout))

    def _on_flush(self, message: FlushTrail) -> None:
        self._flush_starts()

    def _on_settle(self, message: SettleTrail) -> None:
        """Read the answers to the trail's ends sent without waiting; look again later
        while some are on their way (this thread never waits for them)."""
        self._settle_timer = None
        try:
            assert self._trail is not None
            if not self._trail.settle(wait=False):
                self._settle_timer = self._timers.add(SETTLE_DELAY, SettleTrail())
        except Exception:  # the store is away: the rows are kept, tried again in a while
            log.exception("confirming the trail's rows failed")
            self._settle_timer = self._timers.add(SETTLE_RETRY, SettleTrail())

    def _on_record_ask(self, message: RecordAsk) -> None:
        """A server's sampling or elicitation request as the gate decided it (one row)."""
        if self._trail is None:
            return
        ctx = message.context
        try:
            rec = self._trail.record_for(
                call_id=message.call_id,
                turn_id=ctx.turn_id,
                conversation_id=ctx.conversation_id,
                channel=ctx.channel,
                tool=message.permission,
                permission=message.permission,
                params=params_json(redact(message.params)),
                act_summary=message.act_summary,
                principal=principal_id(ctx.principal, str(ctx.channel)),
            )
            allowed = message.decision == "allow"
            self._trail.finish(
                rec,
                status="success" if allowed else "error",
                code=None if allowed else (message.code or "permission-denied"),
                decision=message.decision,
                decided_by=message.decided_by,
                started=False,
            )
        except Exception:
            log.exception("recording %s on the trail failed", message.permission)

    def _on_ready(self, message: Ready) -> None:
        if self._pool is not None:
            self._pool.on_events(message.events)

    def _on_suggested(self, message: Suggested) -> None:
        self._suggesting -= 1
        self._end_early(message.call, message.reply, message.result)

    def _suggest(self, call: ToolCall, reply: Future[ToolOutcome]) -> bool:
        """Look the closest real tools up for a model's unknown name, off this thread.

        False when there is no discovery to ask or too many lookups wait already
        (the plain unknown-tool error is answered at once).
        """
        discovery = getattr(self._services, "discovery", None)
        if call.context.initiator != "model" or discovery is None:
            return False
        if self._suggesting >= MAX_SUGGESTING:
            return False
        if self._suggester is None:
            self._suggester = ThreadPoolExecutor(1, thread_name_prefix="dispatch-suggest")
        me = self.actor_ref
        turns = getattr(self._services, "turns", None)

        def lookup() -> None:
            try:
                result = steps.closest_tools(discovery, turns, self._registry, call)
            except Exception:
                log.exception("looking up the closest tools failed")
                result = steps.unknown_tool(
                    call.tool, (), can_find="find_tools" in call.context.injected
                )
            _tell(me, Suggested(call, reply, result))

        self._suggesting += 1
        try:
            self._suggester.submit(lookup)
        except RuntimeError:  # shutting down
            self._suggesting -= 1
            return False
        return True

    def _on_tool_call(self, message: ToolCall) -> Future[ToolOutcome]:
        return self.dispatch(message)

    def _on_cancel_turn(self, message: CancelTurn) -> int:
        return self.cancel_turn(message.turn_id)

    # -- the public surface ------------------------------------------------------
    def dispatch(self, call: ToolCall) -> Future[ToolOutcome]:
        """Start one call; the returned future resolves to its ToolOutcome."""
        reply: Future[ToolOutcome] = Reply()
        self._dispatch(call, reply)
        return reply

    def cancel_turn(self, turn_id: str) -> int:
        """Cancel the turn's foreground calls in flight; returns how many were cancelled.

        Background calls belong to the conversation, not the turn: they outlive
        it and are cancelled only with :meth:`cancel_call`.
        """
        calls = [
            s
            for s in self._inflight.values()
            if s.call.context.turn_id == turn_id and not s.replied
        ]
        return sum(self._abort(s, FAULTS.cancelled(s.tool)) for s in calls)

    def cancel_call(self, call_id: str) -> int:
        """Cancel every call in flight with this call id (foreground or background)."""
        calls = [s for s in self._inflight.values() if s.call.call_id == call_id]
        return sum(self._abort(s, FAULTS.cancelled(s.tool)) for s in calls)

    def in_flight(self) -> dict[str, Any]:
        """Counts of the calls in flight; ``running``: inside the ability (or its worker) now."""
        calls = list(self._inflight.values())
        inline = self._executors.get("inline")
        in_run = inline.in_run() if isinstance(inline, InlineExecutor) else frozenset()
        return {
            "calls": len(calls),
            "background": sum(1 for c in calls if c.replied),
            "awaiting_gate": sum(1 for c in calls if c.gate is None),
            "running": sum(
                1
                for c in calls
                if c.job is not None and (c.executor is not inline or c.job.job_id in in_run)
            ),
            "lanes": inline.busy() if isinstance(inline, InlineExecutor) else {},
            "timers": len(self._timers),  # live: deadlines of calls running, a pending flush
        }

    def workers_status(self) -> dict[str, Any] | None:
        """The hosted worker pool's status (WorkerPool.status); without one, the status of
        the executor the process abilities run on, when it keeps one (another engine's)."""
        if self._pool is not None:
            return self._pool.status()
        status = getattr(self._executors.get("process"), "status", None)
        return status() if callable(status) else None

    def trail(self, **filters: Any) -> list[TrailRow]:
        """Recent trail rows (see :meth:`chalie.calls.trail.Trail.query` for the filters)."""
        assert self._trail is not None
        return self._trail.query(**filters)

    # -- step 1: check, resolve, pre-validate, classify --------------------------------
    def _dispatch(self, call: ToolCall, reply: Future[ToolOutcome]) -> None:
        try:
            self._begin(call, reply)
        except Exception:
            log.exception(
                "dispatching call %r failed in the runtime", getattr(call, "call_id", "?")
            )
            if not reply.done():
                reply.set_result(_error_outcome(call, FAULTS.dispatch_failed()))

    def _begin(self, call: ToolCall, reply: Future[ToolOutcome]) -> None:
        if not isinstance(call, ToolCall):
            reply.set_result(
                _error_outcome(
                    call,
                    ToolResult.error(
                        "invalid-param",
                        "a dispatch needs a ToolCall.",
                        hint="fault in the caller.",
                    ),
                )
            )
            return
        telemetry.tool_started(call)
        ready = steps.prepare(call, self._registry, self._services, self._services.turns)
        if isinstance(ready, steps.Refused):
            if not ready.suggest or not self._suggest(call, reply):
                self._end_early(
                    call,
                    reply,
                    ready.result,
                    act_summary=ready.act_summary,
                    params=ready.params,
                    cls=ready.cls,
                    healed=ready.healed,
                )
            return
        gate = None
        if ready.failed_closed is not None:
            gate = rules.failed_closed(ready.failed_closed)
        assert self._trail is not None
        ctx = call.context
        background = ready.run_async and ctx.allow_async
        rec = self._trail.record_for(
            call_id=call.call_id,
            turn_id=ctx.turn_id,
            conversation_id=ctx.conversation_id,
            channel=ctx.channel,
            tool=ready.entry.cls.name,
            permission=ready.permission,
            params=params_json(ready.redacted),
            act_summary=ready.act_summary,
            background=background,
            healed=ready.healed,
            parent_call_id=ctx.parent_call,
            principal=principal_id(ctx.principal, str(ctx.channel)),
        )
        state = _Call(
            seq=next(self._seq),
            call=call,
            entry=ready.entry,
            instance=ready.instance,
            pre=ready.pre,
            permission=ready.permission,
            act_summary=ready.act_summary,
            redacted=ready.redacted,
            given=steps.given(ready.redacted, ready.params),
            background=background,
            reply=reply,
            rec=rec,
            reach=ready.reach,
        )
        self._inflight[state.seq] = state
        if gate is None:
            gate = self._gate_now(state)
        if gate is not None:
            # Decided without waiting: the running row is written within
            # START_ROW_DELAY, or as one whole row if the call ends first (an
            # immediate call ends inside _after_gate: then no flush is armed).
            # Not a background call's: it is promised a result inside _after_gate,
            # before the executor's start (which may hold this thread a while).
            self._trail_start(rec, defer=not background)
            self._after_gate(state, gate)
            if self._flush_timer is None and self._trail.deferred():
                self._flush_timer = self._timers.add(START_ROW_DELAY, FlushTrail())
        else:
            self._trail_start(rec, defer=False)
            self._ask_policy(state)

    def _trail_start(self, rec: CallRecord, *, defer: bool) -> None:
        assert self._trail is not None
        try:
            if not defer:
                self._trail.start(rec)
                return
            self._trail.defer_start(rec)  # the flush is armed once the call is started
        except Exception:
            log.exception("writing trail row %d failed", rec.id)

    def _flush_starts(self) -> None:
        """Write the running rows of calls older than START_ROW_DELAY; re-arm for the rest."""
        self._flush_timer = None
        try:
            assert self._trail is not None
            _, wait = self._trail.flush_starts(START_ROW_DELAY)
            if wait is not None:
                self._flush_timer = self._timers.add(wait, FlushTrail())
        except Exception:
            log.exception("writing deferred trail rows failed")

    def _end_early(
        self,
        call: ToolCall,
        reply: Future[ToolOutcome],
        result: ToolResult,
        *,
        act_summary: str = "",
        params: dict[str, Any] | None = None,
        cls: type[Ability] | None = None,
        healed: str = "",
    ) -> None:
        """A call that failed before the gate: one complete trail row, then the reply."""
        outcome = _error_outcome(call, result)
        ctx = call.context
        try:
            assert self._trail is not None
            rec = self._trail.record_for(
                call_id=str(call.call_id),
                turn_id=str(ctx.turn_id),
                conversation_id=str(ctx.conversation_id),
                channel=str(ctx.channel)[:40],
                tool=str(call.tool),
                permission=None,
                params=params_json(redact(params, cls.sensitive if cls else ()))
                if params
                else "{}",
                act_summary=act_summary,
                healed=healed,
                parent_call_id=str(ctx.parent_call),
                principal=principal_id(ctx.principal, str(ctx.channel)),
            )
            self._trail.finish(
                rec, status="error", code=result.code, decision=None, decided_by=None, started=False
            )
        except Exception:
            log.exception("recording a refused call on the trail failed")
        telemetry.tool_ended(outcome.call_id, "error", result.code, outcome.envelope)
        reply.set_result(outcome)

    # -- step 2: the gate --------------------------------------------------------------
    def _gate_now(self, state: _Call) -> GateDecision | None:
        """The decision when it needs no PolicyActor round trip, else None."""
        cls = state.entry.cls
        ctx = state.call.context
        try:
            setting = None
            internal = gate_internal(cls, state.permission)
            if not internal:
                try:
                    ref = self._policy.current()
                except ChildUnavailable:
                    return rules.failed_closed("the policy actor is not running")
                view = self._policy_view(ref)
                if view is None:
                    return None
                setting = view.setting(
                    ctx.channel, state.permission, sensitive=state.reach is not None
                )
                if setting is None:
                    return None  # never seen: the PolicyActor records it, then decides
            return rules.gate_rule(
                setting,
                permission=state.permission,
                channel=ctx.channel,
                human_present=ctx.human_present,
                internal=internal,
            )
        except Exception as exc:
            log.exception("gating call %r failed; denying", state.call.call_id)
            return rules.failed_closed(type(exc).__name__)

    def _ask_policy(self, state: _Call) -> None:
        """Send the call to the PolicyActor; its decision comes back as a GateAnswered message."""
        ctx = state.call.context
        try:
            ask = GateAsk(
                call_id=state.call.call_id,
                context=ctx,
                tool=state.tool,
                permission=state.permission,
                internal=False,
                act_summary=state.act_summary,
                params_redacted=state.given,
                reach=state.reach,
                notes=steps.notes(state.instance, state.pre.params, self._untrusted_read(ctx)),
                resume=_resumable(state),
                binding=call_binding(state.tool, state.permission, state.pre.params, state.reach),
            )
            state.ask = ask
            self._policy.tell(ask)
        except Exception as exc:
            log.exception("gating call %r failed; denying", state.call.call_id)
            self._after_gate(state, rules.failed_closed(type(exc).__name__))
            return
        me, seq = self.actor_ref, state.seq
        ask.reply.add_done_callback(lambda fut: _tell(me, GateAnswered(seq, fut)))

    def _untrusted_read(self, ctx: TurnContext) -> tuple[str, ...]:
        """The untrusted sources the call's conversation has read (the memory's own rule,
        chalie.memory.turns), for the person asked; () when there is no memory service."""
        memory = getattr(self._services, "memory", None)
        if memory is None:
            return ()
        try:
            return tuple(memory.untrusted_in(ctx.conversation_id))
        except Exception:
            log.exception("reading what conversation %s has read failed", ctx.conversation_id)
            return ("(could not be determined)",)

    def _policy_view(self, ref: pykka.ActorRef[PolicyActor]) -> PolicyView | None:
        """The current PolicyActor's view, fetched once per incarnation without waiting for it."""
        return self._views.get(ref)

    # -- step 3: execution ---------------------------------------------------------------
    def _after_gate(self, state: _Call, decision: GateDecision) -> None:
        state.gate = decision
        telemetry.tool_gated(
            state.call.call_id,
            state.tool,
            state.permission,
            decision.decision,
            decision.decided_by,
            state.rec.params,
        )
        if not decision.allowed:
            self._finish(state, steps.denial(decision))
            return
        try:
            self._execute(state)
        except Exception:
            log.exception("starting call %r failed", state.call.call_id)
            self._finish(state, FAULTS.start_failed())

    def _execute(self, state: _Call) -> None:
        cls = state.entry.cls
        executor = self._executors.get(cls.isolation)
        if executor is None:
            self._finish(state, FAULTS.no_executor(state.tool, cls.isolation))
            return
        if state.background:
            state.replied = True
            result = steps.accepted(state.call.call_id)
            state.reply.set_result(
                ToolOutcome(
                    call_id=state.call.call_id,
                    tool=state.tool,
                    status="success",
                    envelope=steps.render_outcome(state.tool, result),
                    background=True,
                )
            )
        job = Job(
            job_id=f"{self._job_prefix}-{state.seq}",
            call_id=state.call.call_id,
            entry=state.entry,
            instance=state.instance,
            params=state.pre.params,
            value=state.pre.value,
            context=state.call.context,
            timeout=cls.timeout,
        )
        state.job, state.executor = job, executor
        telemetry.tool_executing(state.call.call_id, cls.isolation)
        # The executor may wake another thread, which then wants the GIL this one holds;
        # the deadline's timer is set after (no report is handled before this handler ends).
        self._starting = True
        try:
            ended = executor.start(job, self._reporter(state.seq))
        finally:
            self._starting = False
        if ended is not None:  # ended inside start (the immediate executor)
            self._finish(state, ended)
            return
        state.timer = self._timers.add(cls.timeout, Deadline(state.seq))

    def _reporter(self, seq: int) -> Callable[[ToolResult], None]:
        """The ``done`` an executor calls with the job's result, on any thread.

        From another thread (a lane, an MCP connection) the result comes back as an
        :class:`~chalie.wire.actor_messages.Executed` message. On this actor's own thread, in a
        later
        handler (the worker pool hosted here answers while this actor handles its
        socket's Ready), it is handled at once: the message would only come back to
        this same thread. Never inside ``executor.start``: a result known there is
        ``start``'s return value, and one reported there waits for the handler's end.
        """
        me = self.actor_ref

        def done(result: ToolResult) -> None:
            if threading.get_ident() == self._thread and not self._starting:
                self._on_executed(Executed(seq, result))
            else:
                _tell(me, Executed(seq, result))

        return done

    # -- timeouts and cancellation -----------------------------------------------------------
    def _abort(self, state: _Call, result: ToolResult) -> int:
        """End a call from outside its execution, then signal the ability and stop its job."""
        if not self._finish(state, result):
            return 0
        if state.gate is None and state.ask is not None:
            try:  # nobody should be asked about a call that no longer exists
                self._policy.tell(Withdraw(state.ask.reply))
            except Exception:
                log.info("could not withdraw the permission request of %r", state.call.call_id)
        state.instance.cancelled.set()
        if state.job is not None and state.executor is not None:
            try:
                state.executor.cancel(state.job.job_id)
            except Exception:
                log.exception("cancelling job %s failed", state.job.job_id)
        return 1

    # -- step 4: the one envelope -------------------------------------------------------------
    def _finish(self, state: _Call, result: ToolResult) -> bool:
        """Render, record, reply; only the first end of a call does anything."""
        if self._inflight.pop(state.seq, None) is None:
            return False
        if state.timer is not None:
            self._timers.cancel(state.timer)
            state.timer = None
        result, rich = steps.carried_rich(state.tool, result)
        try:
            envelope = steps.render_outcome(state.tool, result, state.pre.action)
        except Exception:
            log.exception("rendering the result of %s failed", state.tool)
            result = FAULTS.render_failed(state.tool)
            envelope = steps.render_outcome(state.tool, result)
        gate = state.gate
        telemetry.tool_ended(state.call.call_id, result.status, result.code, envelope)
        try:
            assert self._trail is not None
            self._trail.finish(
                state.rec,
                status=result.status,
                code=result.code,
                decision=gate.decision if gate else None,
                decided_by=gate.decided_by if gate else None,
            )
            if self._settle_timer is None and self._trail.unsettled():
                # its end was sent, its commit not confirmed yet (PostgreSQL): read the
                # store's answer then if no other write comes first
                self._settle_timer = self._timers.add(SETTLE_DELAY, SettleTrail())
            if self._flush_timer is not None and not self._trail.deferred():
                # the calls that were held ended as whole rows: nothing left to flush
                self._timers.cancel(self._flush_timer)
                self._flush_timer = None
        except Exception:
            log.exception("completing the trail row of call %r failed", state.call.call_id)
        if state.replied:
            self._deliver_background(state, result, envelope, rich)
        else:
            state.replied = True
            if not state.reply.done():
                state.reply.set_result(
                    ToolOutcome(
                        call_id=state.call.call_id,
                        tool=state.tool,
                        status=result.status,
                        envelope=envelope,
                        code=result.code,
                        rich=rich,
                    )
                )
        return True

    def _deliver_background(
        self, state: _Call, result: ToolResult, envelope: str, rich: dict[str, Any] | None
    ) -> None:
        """Store the final envelope in the outbox, then publish it to the conversation."""
        ctx = state.call.context
        event = BackgroundResult(
            call_id=state.call.call_id,
            conversation_id=ctx.conversation_id,
            tool=state.tool,
            envelope=envelope,
            status=result.status,
            code=result.code,
            rich=rich,
        )
        try:
            assert self._outbox is not None
            event = self._outbox.put(event)
        except Exception:
            log.exception("storing background result %r in the outbox failed", state.call.call_id)
        if not self._events.publish(ctx.conversation_id, event):
            log.info(
                "background call %r ended with nobody listening to conversation %r; "
                "it waits in the outbox",
                state.call.call_id,
                ctx.conversation_id,
            )


_HANDLERS: Final[dict[type, Callable[[DispatcherActor, Any], Any]]] = {
    Dispatch: DispatcherActor._on_dispatch,
    Executed: DispatcherActor._on_executed,
    GateAnswered: DispatcherActor._on_gate_answered,
    Deadline: DispatcherActor._on_deadline,
    FlushTrail: DispatcherActor._on_flush,
    SettleTrail: DispatcherActor._on_settle,
    RecordAsk: DispatcherActor._on_record_ask,
    ToolCall: DispatcherActor._on_tool_call,
    Suggested: DispatcherActor._on_suggested,
    Ready: DispatcherActor._on_ready,
    CancelTurn: DispatcherActor._on_cancel_turn,
}


def _resumable(state: _Call) -> bytes | None:
    """The call as it can run again after a restart (chalie.gate.approvals), or None: a call
    whose arguments hold a redacted secret is never stored, nor is a resumed call again."""
    ctx = state.call.context
    if ctx.resumes or state.redacted != state.pre.params:
        return None
    return encode_call(
        ResumableCall(
            call_id=state.call.call_id,
            tool=state.tool,
            arguments=dict(state.pre.params),
            act_summary=state.act_summary,
            context=ctx,
        )
    )


def _answer(state: _Call, fut: Future[GateDecision]) -> GateDecision:
    try:
        decision = fut.result(timeout=0)
        if not isinstance(decision, GateDecision):
            raise TypeError(f"the gate answered {type(decision).__name__}")
    except Exception as exc:
        log.exception("the gate's answer for call %r is unusable; denying", state.call.call_id)
        decision = rules.failed_closed(type(exc).__name__)
    return decision


def _tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    tell_quietly(ref, message)

"""DispatcherActor: the single chokepoint from a turn to an ability.

Lifecycle of one call (the steps live in :mod:`chalie.dispatch`; this actor
only sequences them and owns the calls in flight):

1. On the actor's thread: check the call's shape, resolve a fresh per-call
   instance bound to the turn, split off ``act_summary``/``async``,
   pre-validate (action map, JSON Schema, Params), derive the permission with
   the ability's ``classify``, and write the trail row (``running``).
2. Gate: internal abilities bypass it; an ``allow``/``deny``/``internal``
   setting is read from the PolicyActor's lock-free :class:`PolicyView`;
   everything else (``ask``, unseen) goes to the PolicyActor with ``tell``,
   and its decision arrives on a future callback, so a pending approval
   holds up nothing.
3. Execute: inline on a bounded thread pool, in per-tool lanes (one tool may
   use at most ``lane_limit`` threads, so 50 slow calls to one tool cannot
   starve another tool); ``isolation="process"`` through the worker pool;
   with ``async`` on a channel that allows it, the turn gets an immediate
   success envelope naming the call id and the final envelope is published
   as a :class:`BackgroundResult` to the conversation.
4. Finish, exactly once, from whichever thread gets there first (the pool
   thread, the worker future, the deadline thread, a cancel): render the one
   envelope, complete the trail row, then reply. The trail is written before
   the reply, so an outcome the turn saw is on disk.

The trail row of a call decided at once is written ``running`` at most
:data:`START_ROW_DELAY` (2 ms) after the call starts, in a batch, by the
deadline thread; a call that ends sooner (most do) is written as one complete
row. Calls waiting for a human are written ``running`` before they are asked.
So a SIGKILL loses no call whose outcome was returned, and every call in
flight for more than 2 ms is marked ``interrupted`` at the next start; a call
killed in its first 2 ms, which returned nothing, may leave no row. The
benchmark (tools/bench/bench_dispatch.py) shows why: a separate start write
on the hot path roughly doubled the dispatcher's overhead.

Timeouts and cancellation: the per-ability timeout runs from the gate's
allow; on expiry (or on ``cancel_turn``) the call ends with ``tool-timeout``
(or ``cancelled``) at once and the instance's ``cancelled`` event is set.
Python threads cannot be killed, so an inline ability stops only when it
checks ``self.cancelled``; its pool thread stays counted in its lane until
then. A worker-process call is cancelled in the worker pool.

Replies are ``concurrent.futures.Future[ToolOutcome]``: ``submit(ref, call)``
sends the call with ``tell`` and returns the future; through a proxy,
``proxy.dispatch(call).get()`` returns the same kind of future (it never
resolves to the outcome itself, because the actor does not wait for it).
Nothing raises out of dispatch: every failure is an error envelope.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pykka

from actors.policy import GateAsk, PolicyView, ViewRequest, Withdraw
from actors.supervisor import SupervisedActor
from chalie import dispatch as steps
from chalie import policy as rules
from chalie.ability import Ability, split_framework_fields
from chalie.events import EventBus
from chalie.invoke import invoke
from chalie.messages import (
    BackgroundResult,
    CancelTurn,
    ToolCall,
    ToolOutcome,
    WorkerJob,
    WorkerResult,
)
from chalie.policy import GateDecision
from chalie.registry import Entry
from chalie.result import ToolResult
from chalie.trail import CallRecord, Trail, TrailRow, params_json, redact

log = logging.getLogger("chalie.dispatch")

DEFAULT_LANE_QUEUE = 1000
# How long a call may run before its ``running`` trail row must be on disk.
START_ROW_DELAY = 0.002
FLUSH = 0
# A worker-process call is timed out by the pool; ours is only a backstop.
PROCESS_BACKSTOP = 5.0


class WorkerPool(Protocol):
    """What the dispatcher needs from the worker pool (actors/worker_pool.py)."""

    def submit(self, job: WorkerJob, *, timeout: float) -> Future[WorkerResult]: ...

    def cancel(self, job_id: str) -> Any: ...


@dataclass(frozen=True)
class _Dispatch:
    call: ToolCall
    reply: Future[ToolOutcome]


@dataclass(eq=False)
class _Call:
    """One call in flight; ``done`` flips once, under the dispatcher's lock."""

    seq: int
    call: ToolCall
    entry: Entry
    instance: Ability
    pre: steps.Prevalidated
    permission: str
    act_summary: str
    redacted: dict[str, Any]
    background: bool
    reply: Future[ToolOutcome]
    rec: CallRecord | None = None
    gate: GateDecision | None = None
    job_id: str | None = None
    ask: GateAsk | None = None
    replied: bool = False
    running: bool = False
    done: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tool(self) -> str:
        return self.entry.name


class _Deadlines:
    """One thread that fires timed work: a heap of (when, seq), checked lazily.

    A positive seq is a call's timeout; :data:`FLUSH` asks for the trail's
    deferred start rows to be written.
    """

    COMPACT_EVERY = 8192

    def __init__(self, fire: Callable[[int], None], pending: Callable[[int], bool]) -> None:
        self._fire = fire
        self._pending = pending
        self._heap: list[tuple[float, int]] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._adds = 0

    def add(self, seconds: float, seq: int) -> None:
        entry = (time.monotonic() + seconds, seq)
        with self._cond:
            self._adds += 1
            if self._adds % self.COMPACT_EVERY == 0:
                # Entries of calls that already ended would otherwise stay for a
                # whole timeout (60 s by default): thousands at a high call rate.
                self._heap = [e for e in self._heap if e[1] == FLUSH or self._pending(e[1])]
                heapq.heapify(self._heap)
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                self._cond.notify()

    def __len__(self) -> int:
        return len(self._heap)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    if not self._heap:
                        self._cond.wait()
                        continue
                    delay = self._heap[0][0] - time.monotonic()
                    if delay <= 0:
                        _, seq = heapq.heappop(self._heap)
                        break
                    self._cond.wait(delay)
            self._fire(seq)


class _InlinePool:
    """A bounded pool of threads shared fairly: each tool runs at most ``limit`` calls at once.

    The threads are daemon threads on purpose: a Python thread cannot be
    killed, and an ability that ignores its ``cancelled`` event must not keep
    the daemon from exiting (ThreadPoolExecutor joins its threads at exit).
    """

    def __init__(self, size: int, limit: int, queue_limit: int) -> None:
        self._limit = limit
        self._queue_limit = queue_limit
        self._lock = threading.Lock()
        self._running: dict[str, int] = {}
        self._waiting: dict[str, deque[Callable[[], None]]] = {}
        self._queue: queue.SimpleQueue[tuple[str, Callable[[], None]] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._serve, name=f"chalie-inline-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, tool: str, work: Callable[[], None]) -> bool:
        """Queue work in the tool's lane; False when the lane is full (overloaded)."""
        with self._lock:
            running = self._running.get(tool, 0)
            if running >= self._limit:
                waiting = self._waiting.setdefault(tool, deque())
                if len(waiting) >= self._queue_limit:
                    return False
                waiting.append(work)
                return True
            self._running[tool] = running + 1
        self._queue.put((tool, work))
        return True

    def shutdown(self) -> None:
        for _ in self._threads:
            self._queue.put(None)

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._run(*item)

    def _run(self, tool: str, work: Callable[[], None]) -> None:
        while True:
            try:
                work()
            except Exception:
                log.exception("inline call in lane %s failed outside the ability", tool)
            with self._lock:
                waiting = self._waiting.get(tool)
                if not waiting:
                    self._waiting.pop(tool, None)
                    self._running[tool] -= 1
                    if not self._running[tool]:
                        del self._running[tool]
                    return
                work = waiting.popleft()

    def busy(self) -> dict[str, int]:
        with self._lock:
            return dict(self._running)


def _resolved(outcome: ToolOutcome) -> Future[ToolOutcome]:
    fut: Future[ToolOutcome] = Future()
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
    reply: Future[ToolOutcome] = Future()
    try:
        ref.tell(_Dispatch(call, reply))
    except pykka.ActorDeadError:
        return _resolved(_error_outcome(call, ToolResult.error(
            "internal-error", "The dispatcher is restarting; the call did not run.",
            hint="it is safe to retry the call.",
        )))
    return reply


class DispatcherActor(SupervisedActor):
    """The only path from a turn to an ability; see the module docstring for the steps."""

    def __init__(
        self,
        registry: Any,
        services: Any,
        trail_db_path: Path,
        policy: Callable[[], Any] | Any,
        workers: WorkerPool | None,
        events: EventBus,
        *,
        inline_threads: int = 16,
        lane_limit: int | None = None,
        lane_queue: int = DEFAULT_LANE_QUEUE,
    ) -> None:
        super().__init__()
        if not isinstance(inline_threads, int) or inline_threads < 1:
            raise ValueError("inline_threads must be a positive integer")
        if lane_limit is not None and (not isinstance(lane_limit, int) or lane_limit < 1):
            raise ValueError("lane_limit must be a positive integer")
        if not isinstance(lane_queue, int) or lane_queue < 0:
            raise ValueError("lane_queue must be a non-negative integer")
        self._registry = registry
        self._services = services
        self._trail_path = Path(trail_db_path)
        # A ChildRef (actors.supervisor), a callable returning the current ref, or a ref.
        current = getattr(policy, "current", None)
        if isinstance(policy, pykka.ActorRef):
            self._policy_ref: Callable[[], Any] = lambda: policy
        elif callable(current):
            self._policy_ref = current
        else:
            self._policy_ref = policy
        self._workers = workers
        self._events = events
        self._threads = inline_threads
        self._lane_limit = lane_limit if lane_limit is not None else max(1, inline_threads // 2)
        self._lane_queue = lane_queue
        self._lock = threading.Lock()
        self._inflight: dict[int, _Call] = {}
        self._seq = itertools.count(1)
        self._view_urn: str | None = None
        self._view: PolicyView | None = None
        self._view_future: pykka.Future[Any] | None = None
        self._flush_due = False
        self._trail: Trail | None = None
        self._pool: _InlinePool | None = None

    # -- lifecycle -----------------------------------------------------------
    def on_start(self) -> None:
        self._trail = Trail(self._trail_path)
        interrupted = self._trail.recover()
        if interrupted:
            log.warning("marked %d call(s) left running by a previous run as interrupted",
                        interrupted)
        self._pool = _InlinePool(self._threads, self._lane_limit, self._lane_queue)
        self._deadlines = _Deadlines(self._on_deadline, self._inflight.__contains__)
        self.spawn_thread(self._deadlines.run, "dispatch-deadlines")

    def on_stop(self) -> None:
        self._shutdown("the dispatcher stopped during the call")

    def on_failure(self, *exc: Any) -> None:
        self._shutdown("the dispatcher failed during the call")

    def _shutdown(self, reason: str) -> None:
        with self._lock:
            calls = list(self._inflight.values())
        for state in calls:
            self._abort(state, ToolResult.error(
                "internal-error", f"{reason[:1].upper()}{reason[1:]}.",
                hint="the call did not complete; it is safe to retry it.",
            ))
        if getattr(self, "_deadlines", None) is not None:
            self._deadlines.stop()
        if self._pool is not None:
            self._pool.shutdown()
        if self._trail is not None:
            self._trail.close()

    # -- messages ------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Dispatch):
            self._dispatch(message.call, message.reply)
            return None
        if isinstance(message, ToolCall):
            return self.dispatch(message)
        if isinstance(message, CancelTurn):
            return self.cancel_turn(message.turn_id)
        return super().on_receive(message)

    # -- the public surface ------------------------------------------------------
    def dispatch(self, call: ToolCall) -> Future[ToolOutcome]:
        """Start one call; the returned future resolves to its ToolOutcome."""
        reply: Future[ToolOutcome] = Future()
        self._dispatch(call, reply)
        return reply

    def cancel_turn(self, turn_id: str) -> int:
        """Cancel the turn's foreground calls in flight; returns how many were cancelled.

        Background calls belong to the conversation, not the turn: they outlive
        it and are cancelled only with :meth:`cancel_call`.
        """
        with self._lock:
            calls = [s for s in self._inflight.values()
                     if s.call.context.turn_id == turn_id and not s.replied]
        return sum(self._cancel(state) for state in calls)

    def cancel_call(self, call_id: str) -> int:
        """Cancel every call in flight with this call id (foreground or background)."""
        with self._lock:
            calls = [s for s in self._inflight.values() if s.call.call_id == call_id]
        return sum(self._cancel(state) for state in calls)

    def in_flight(self) -> dict[str, Any]:
        with self._lock:
            calls = list(self._inflight.values())
        return {
            "calls": len(calls),
            "background": sum(1 for c in calls if c.replied),
            "awaiting_gate": sum(1 for c in calls if c.gate is None),
            "running": sum(1 for c in calls if c.running),
            "lanes": self._pool.busy() if self._pool else {},
        }

    def trail(self, **filters: Any) -> list[TrailRow]:
        """Recent trail rows (see :meth:`chalie.trail.Trail.query` for the filters)."""
        assert self._trail is not None
        return self._trail.query(**filters)

    # -- step 1: on the actor's thread ---------------------------------------------
    def _dispatch(self, call: ToolCall, reply: Future[ToolOutcome]) -> None:
        try:
            self._begin(call, reply)
        except Exception:
            log.exception("dispatching call %r failed in the runtime",
                          getattr(call, "call_id", "?"))
            if not reply.done():
                reply.set_result(_error_outcome(call, ToolResult.error(
                    "internal-error", "The runtime failed while dispatching the call.",
                    hint="this is a fault in the runtime, not in your call; try again.",
                )))

    def _begin(self, call: ToolCall, reply: Future[ToolOutcome]) -> None:
        if not isinstance(call, ToolCall):
            reply.set_result(_error_outcome(call, ToolResult.error(
                "invalid-param", "a dispatch needs a ToolCall.", hint="fault in the caller.",
            )))
            return
        bad = steps.check_call(call)
        if bad is not None:
            self._end_early(call, reply, bad)
            return
        entry = steps.resolve(self._registry, call.tool, call.context,
                              getattr(self._services, "turns", None))
        if isinstance(entry, ToolResult):
            self._end_early(call, reply, entry)
            return
        cls = entry.cls
        params, act_summary, run_async = split_framework_fields(call.arguments)
        try:
            instance = cls(call.context, self._services)
        except Exception as exc:
            log.exception("constructing %s failed", cls.name)
            self._end_early(call, reply, ToolResult.error(
                "unhandled-exception", f"{cls.name} failed to start ({type(exc).__name__}).",
                hint="This is a fault in the tool, not in your call; try another way or report it.",
            ), act_summary=act_summary, params=params, cls=cls)
            return
        pre = steps.prevalidate(cls, params)
        if isinstance(pre, ToolResult):
            self._end_early(call, reply, pre, act_summary=act_summary, params=params, cls=cls)
            return
        redacted = redact(params, cls.sensitive)
        gate: GateDecision | None = None
        try:
            permission = steps.permission(instance, pre.params)
        except Exception as exc:
            log.exception("classify() of %s failed; the gate fails closed", cls.name)
            permission = cls.name
            gate = rules.failed_closed(f"classify raised {type(exc).__name__}")
        state = _Call(
            seq=next(self._seq), call=call, entry=entry, instance=instance, pre=pre,
            permission=permission, act_summary=act_summary, redacted=redacted,
            background=run_async and call.context.allow_async, reply=reply,
        )
        assert self._trail is not None
        rec = state.rec = self._trail.record_for(
            call_id=call.call_id, turn_id=call.context.turn_id,
            conversation_id=call.context.conversation_id, channel=call.context.channel,
            tool=cls.name, permission=permission, params=params_json(redacted),
            act_summary=act_summary, background=state.background,
        )
        with self._lock:
            self._inflight[state.seq] = state
        if gate is None:
            gate = self._gate_now(state)
        if gate is not None:
            # Decided without waiting: start the work, and let the trail write the
            # running row within START_ROW_DELAY, or one whole row if the call
            # ends first (most do, in microseconds). Either way the end is on
            # disk before the reply.
            self._trail_start(rec, defer=True)
            # Last, so this thread goes back to its mailbox as the pool thread wakes.
            self._after_gate(state, gate)
        else:
            self._trail_start(rec, defer=False)
            self._ask_policy(state)

    def _trail_start(self, rec: CallRecord, *, defer: bool) -> None:
        try:
            assert self._trail is not None
            if not defer:
                self._trail.start(rec)
                return
            self._trail.defer_start(rec)
            with self._lock:
                if self._flush_due:
                    return
                self._flush_due = True
            self._deadlines.add(START_ROW_DELAY, FLUSH)
        except Exception:
            log.exception("writing trail row %d failed", rec.id)

    def _flush_starts(self) -> None:
        with self._lock:
            self._flush_due = False
        try:
            assert self._trail is not None
            self._trail.flush_starts()
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
    ) -> None:
        """A call that failed before the gate: one complete trail row, then the reply."""
        outcome = _error_outcome(call, result)
        ctx = call.context
        try:
            assert self._trail is not None
            rec = self._trail.record_for(
                call_id=str(call.call_id), turn_id=str(ctx.turn_id),
                conversation_id=str(ctx.conversation_id), channel=str(ctx.channel)[:40],
                tool=str(call.tool), permission=None,
                params=params_json(redact(params, cls.sensitive if cls else ())) if params
                else "{}",
                act_summary=act_summary,
            )
            self._trail.finish(rec, status="error", code=result.code, decision=None,
                               decided_by=None, started=False)
        except Exception:
            log.exception("recording a refused call on the trail failed")
        reply.set_result(outcome)

    # -- step 2: the gate --------------------------------------------------------------
    def _gate_now(self, state: _Call) -> GateDecision | None:
        """The decision when it needs no PolicyActor round trip, else None."""
        if state.entry.cls.internal:
            return rules.allowed("internal")
        ctx = state.call.context
        try:
            ref = self._policy_ref()
            if ref is None or not ref.is_alive():
                return rules.failed_closed("the policy actor is not running")
            view = self._policy_view(ref)
            if view is not None:
                setting = view.setting(ctx.channel, state.permission)
                if setting in ("allow", "internal"):
                    return rules.allowed("internal" if setting == "internal" else "policy")
                if setting == "deny":
                    return rules.denied_by_policy(state.permission, ctx.channel)
        except Exception as exc:
            log.exception("gating call %r failed; denying", state.call.call_id)
            return rules.failed_closed(type(exc).__name__)
        return None

    def _ask_policy(self, state: _Call) -> None:
        """Send the call to the PolicyActor; its decision arrives on a future callback."""
        ctx = state.call.context
        try:
            ref = self._policy_ref()
            ask = GateAsk(
                call_id=state.call.call_id, context=ctx, tool=state.tool,
                permission=state.permission, internal=False, act_summary=state.act_summary,
                params_redacted=state.redacted,
            )
            state.ask = ask
            ref.tell(ask)
        except Exception as exc:
            log.exception("gating call %r failed; denying", state.call.call_id)
            self._after_gate(state, rules.failed_closed(type(exc).__name__))
            return
        ask.reply.add_done_callback(lambda fut: self._gate_answered(state, fut))

    def _policy_view(self, ref: Any) -> PolicyView | None:
        """The current PolicyActor's view, fetched once per incarnation without waiting for it."""
        if ref.actor_urn != self._view_urn:
            self._view_urn, self._view = ref.actor_urn, None
            self._view_future = ref.ask(ViewRequest(), block=False)
        if self._view is None and self._view_future is not None:
            try:
                found = self._view_future.get(timeout=0)
            except pykka.Timeout:
                return None
            except Exception:
                self._view_future = None
                return None
            self._view = found if isinstance(found, PolicyView) else None
        return self._view

    def _gate_answered(self, state: _Call, fut: Future[GateDecision]) -> None:
        try:
            decision = fut.result()
            if not isinstance(decision, GateDecision):
                raise TypeError(f"the gate answered {type(decision).__name__}")
        except Exception as exc:
            log.exception("the gate's answer for call %r is unusable; denying", state.call.call_id)
            decision = rules.failed_closed(type(exc).__name__)
        self._after_gate(state, decision)

    # -- step 3: execution ---------------------------------------------------------------
    def _after_gate(self, state: _Call, decision: GateDecision) -> None:
        state.gate = decision
        if state.done:
            return
        if not decision.allowed:
            self._finish(state, steps.denial(decision))
            return
        try:
            self._execute(state)
        except Exception:
            log.exception("starting call %r failed", state.call.call_id)
            self._finish(state, ToolResult.error(
                "internal-error", "The runtime could not start the call.",
                hint="this is a fault in the runtime, not in your call; try again.",
            ))

    def _execute(self, state: _Call) -> None:
        cls = state.entry.cls
        if state.background:
            state.replied = True
            result = steps.accepted(state.call.call_id)
            state.reply.set_result(ToolOutcome(
                call_id=state.call.call_id, tool=state.tool, status="success",
                envelope=steps.render_outcome(state.tool, result), background=True,
            ))
        if cls.isolation == "process":
            self._execute_in_worker(state)
            return
        self._deadlines.add(cls.timeout, state.seq)
        assert self._pool is not None
        if not self._pool.submit(state.tool, lambda: self._run_inline(state)):
            self._finish(state, ToolResult.error(
                "overloaded", f"Too many calls to {state.tool} are waiting.",
                hint="wait for earlier calls to finish before calling it again.",
            ))

    def _run_inline(self, state: _Call) -> None:
        if state.done:
            return
        state.running = True
        self._finish(state, invoke(state.instance, state.pre.value))

    def _execute_in_worker(self, state: _Call) -> None:
        cls = state.entry.cls
        if self._workers is None:
            self._finish(state, ToolResult.error(
                "internal-error", f"{state.tool} runs in a worker process and none is available.",
                hint="this is a fault in the runtime's set-up, not in your call.",
            ))
            return
        state.job_id = uuid.uuid4().hex
        job = WorkerJob(
            job_id=state.job_id, ability=state.entry.ref, params=state.pre.params,
            context=state.call.context, deadline=time.time() + cls.timeout,
        )
        self._deadlines.add(cls.timeout + PROCESS_BACKSTOP, state.seq)
        state.running = True
        fut = self._workers.submit(job, timeout=cls.timeout)
        fut.add_done_callback(lambda f: self._worker_done(state, f))

    def _worker_done(self, state: _Call, fut: Future[WorkerResult]) -> None:
        try:
            result = steps.worker_result(fut.result())
        except Exception as exc:
            log.exception("the worker pool failed call %r", state.call.call_id)
            result = ToolResult.error(
                "internal-error", f"The worker pool failed the call ({type(exc).__name__}).",
                hint="this is a fault in the runtime, not in your call; try again.",
            )
        self._finish(state, result)

    # -- timeouts and cancellation -----------------------------------------------------------
    def _on_deadline(self, seq: int) -> None:
        if seq == FLUSH:
            self._flush_starts()
            return
        with self._lock:
            state = self._inflight.get(seq)
        if state is None or state.done:
            return
        timeout = state.entry.cls.timeout
        self._abort(state, ToolResult.error(
            "tool-timeout", f"{state.tool} did not finish within {timeout:g} s.",
            hint="try a smaller request, or do without this tool.",
        ))

    def _cancel(self, state: _Call) -> int:
        return self._abort(state, ToolResult.error(
            "cancelled", f"The call to {state.tool} was cancelled.",
            hint="the turn was cancelled; do not continue with this call's result.",
        ))

    def _abort(self, state: _Call, result: ToolResult) -> int:
        """End a call from outside its execution, then signal the ability and stop its job.

        The outcome is settled first: a worker pool may resolve the job's future
        synchronously inside ``cancel``, and that must not win the race.
        """
        if not self._finish(state, result):
            return 0
        if state.gate is None and state.ask is not None:
            try:  # nobody should be asked about a call that no longer exists
                self._policy_ref().tell(Withdraw(state.ask.reply))
            except Exception:
                log.info("could not withdraw the permission request of %r", state.call.call_id)
        state.instance.cancelled.set()
        if state.job_id is not None and self._workers is not None:
            try:
                self._workers.cancel(state.job_id)
            except Exception:
                log.exception("cancelling worker job %s failed", state.job_id)
        return 1

    # -- step 4: the one envelope -------------------------------------------------------------
    def _finish(self, state: _Call, result: ToolResult) -> bool:
        """Render, record, reply; only the first caller for a call does anything."""
        with self._lock:
            if state.done:
                return False
            state.done = True
            self._inflight.pop(state.seq, None)
        try:
            envelope = steps.render_outcome(state.tool, result, state.pre.action)
        except Exception:
            log.exception("rendering the result of %s failed", state.tool)
            result = ToolResult.error(
                "internal-error", f"The result of {state.tool} could not be rendered.",
                hint="this is a fault in the tool or the runtime; try another way.",
            )
            envelope = steps.render_outcome(state.tool, result)
        gate = state.gate
        try:
            assert self._trail is not None and state.rec is not None
            self._trail.finish(
                state.rec, status=result.status, code=result.code,
                decision=gate.decision if gate else None,
                decided_by=gate.decided_by if gate else None,
            )
        except Exception:
            log.exception("completing the trail row of call %r failed", state.call.call_id)
        ctx = state.call.context
        if state.replied:
            delivered = self._events.publish(ctx.conversation_id, BackgroundResult(
                call_id=state.call.call_id, conversation_id=ctx.conversation_id, tool=state.tool,
                envelope=envelope, status=result.status,
            ))
            if not delivered:
                log.info("background call %r ended with nobody listening to conversation %r; "
                         "its outcome is on the trail", state.call.call_id, ctx.conversation_id)
        else:
            state.replied = True
            if not state.reply.done():
                state.reply.set_result(ToolOutcome(
                    call_id=state.call.call_id, tool=state.tool, status=result.status,
                    envelope=envelope, code=result.code,
                ))
        return True

"""TurnActor: one conversation's turns, interpreting the pure state machine.

The turn's logic is :mod:`chalie.conversation.turn`: ``on(state, message, now)``
returns effects. This actor owns the state, feeds it every message (its own
timers, the model stream, tool outcomes, the bus's permission requests, what
its parent sends) and carries out the effects in order (:data:`_EFFECTS`):
writes to the store, events on the bus, model requests on the daemon's event
loop, calls through the dispatcher, timers in its own inbox.

Lifecycle, in order:

1. ``on_start``: subscribe to the conversation's permission requests, close
   what a crash left running (``store.recover``), load the history, queued
   turns and undelivered background results, then :class:`~turn.Resume`.
2. Messages (:data:`_RECEIVE`): each becomes one :func:`turn.on` call; a
   message of an older step or turn is dropped there.
3. ``on_stop``: the running turn ends ``interrupted``.
4. ``on_failure``: the turn ends from storage with an ``internal-error`` event
   (what is in memory may be what broke); the supervisor applies its rule.

The actor never blocks on I/O: model requests run on the loop, tool calls in
the dispatcher, and SQLite writes are a few hundred microseconds.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, TypeVar

import pykka

from actors.actor import SupervisedActor, tell_quietly
from actors.calls.dispatcher import DispatcherClient
from actors.loop import EventLoopThread
from chalie.calls.delegate import parent_of
from chalie.calls.outbox import Outbox
from chalie.conversation import compaction, submission
from chalie.conversation import turn as core
from chalie.conversation.catalogue import ToolCatalogue
from chalie.conversation.channels import Channel
from chalie.conversation.store import FAILED_LINE, ConversationStore
from chalie.conversation.stream import answer
from chalie.process import telemetry
from chalie.process.config import ModelConfig
from chalie.providers.client import ModelClient
from chalie.providers.types import ModelResponse, ProviderError
from chalie.wire.actor_messages import (
    CancelRunningTurn,
    DeliverBackground,
    EvictIfIdle,
    HandOff,
    StartTurn,
    TurnActorIdle,
)
from chalie.wire.bus import EventBus, Subscription
from chalie.wire.events import (
    BackgroundResult,
    ConversationEvent,
    PermissionRequest,
    TurnFinished,
    TurnStarted,
)
from chalie.wire.messages import Accepted, RequestSettled, ToolOutcome, TurnContext

log = logging.getLogger("chalie.turn")
T = TypeVar("T")

CANCELLED_LINE = core.CANCELLED_LINE


class Models:
    """The model clients of the daemon's turns, one per configured model, and the event
    loop their requests run on (a request is a coroutine submitted there)."""

    def __init__(self, configs: Mapping[str, ModelConfig], loop: EventLoopThread) -> None:
        self._configs = dict(configs)
        self._clients: dict[str, ModelClient] = {}
        self.loop = loop

    def client(self, name: str) -> ModelClient:
        """The named model's client (``default``'s settings for a name not configured).

        Called from TurnActor threads: a dict read, and a benign race on first use.
        """
        client = self._clients.get(name)
        if client is None:
            config = self._configs.get(name) or self._configs.get("default")
            client = self._clients.setdefault(name, ModelClient(name, config or ModelConfig()))
        return client

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run a request on the loop (RuntimeError when the loop is gone)."""
        return self.loop.submit(work)

    def close(self) -> None:
        """Close every client's connections, on the loop."""
        clients, self._clients = self._clients, {}
        for client in clients.values():
            with contextlib.suppress(Exception):
                self.loop.submit(client.aclose()).result(5)


class TurnHooks(Protocol):
    """What a turn tells the rest of the daemon, and the one thing it reads from it.

    Each is called on the TurnActor's thread and must not block.
    """

    def brief(self, context: TurnContext, message: str) -> str:
        """What the memory remembers that bears on a message, for a turn with a human
        (chalie.memory.briefing.for_turn; '' when nothing does). Reads only."""
        ...

    def learn(self, turn_id: str, channel: str, used: frozenset[str]) -> None:
        """A turn ended: its id, its policy channel, the tools it used with success and no
        denial (empty when it did not end with an answer)."""
        ...

    def follow_up(self, conversation_id: str, result: BackgroundResult) -> None:
        """A background result reached the conversation while no turn ran: start a turn
        that tells the person (chalie/conversation/background.py)."""
        ...


class NoHooks:
    """Hooks that tell nobody and brief nothing."""

    def brief(self, context: TurnContext, message: str) -> str:
        return ""

    def learn(self, turn_id: str, channel: str, used: frozenset[str]) -> None:
        return None

    def follow_up(self, conversation_id: str, result: BackgroundResult) -> None:
        return None


@dataclass(frozen=True)
class TurnStorage:
    """Where a conversation's turns are kept."""

    store: ConversationStore
    outbox: Outbox  # background results not yet in a history (after a restart), acked once stored
    # Where summaries of compacted histories are kept (None: histories are only trimmed).
    summaries: compaction.SummaryStore | None = None


@dataclass(frozen=True)
class TurnSettings:
    """The daemon's settings every turn runs by."""

    channels: dict[str, Channel]
    idle_stop: float = 600.0  # [conversations] idle_stop: an idle actor reports it after this
    max_queued: int = 16  # [conversations] max_queued
    # The person's time zone ([accounts] zone): the system prompt says what day it is there.
    zone: str = "UTC"


@dataclass(frozen=True)
class TurnDeps:
    """What every TurnActor of the daemon shares: one port a concern."""

    storage: TurnStorage
    bus: EventBus
    models: Models
    dispatcher: DispatcherClient  # a call in, an outcome out; cancels a turn's calls
    tools: ToolCatalogue  # descriptors, scoped remote tools, injections (and their release)
    settings: TurnSettings
    hooks: TurnHooks = field(default_factory=NoHooks)


@dataclass(frozen=True)
class _Heard:
    """From the bus: a permission request of this conversation, or how one ended."""

    event: PermissionRequest | RequestSettled


class _Crash:
    """Tests: a fault inside the actor."""


CRASH = _Crash()


class TurnActor(SupervisedActor):
    """The turns of one conversation; a transient child of the Conversations supervisor.

    ``parent`` hears when the actor is idle; ``send_no`` is the last message the
    parent sent this conversation before this actor started (a restarted actor has
    every earlier one from storage).
    """

    def __init__(
        self,
        conversation_id: str,
        deps: TurnDeps,
        parent: pykka.ActorRef[Any] | None = None,
        send_no: int = 0,
        asks: Mapping[str, tuple[bool, bool]] | None = None,
    ) -> None:
        super().__init__()
        self.conversation_id = conversation_id
        # Queued turns' (human_present, park_asks) known to the parent (a message it took
        # while another daemon held the conversation); any other queued turn has neither.
        self._asks = dict(asks or {})
        self._deps = deps
        self._parent = parent
        self._send_no = send_no
        self._state: core.Conversation | None = None
        self._taken: dict[str, concurrent.futures.Future[Accepted]] = {}  # senders waiting
        self._model: concurrent.futures.Future[Any] | None = None  # the outstanding request
        self._timers: dict[core.Timer, int] = {}
        self._requests: Subscription | None = None
        self._handing_off = False  # another daemon waits: idle as soon as turns are done

    # -- lifecycle ------------------------------------------------------------------
    def on_start(self) -> None:
        deps = self._deps
        ref = self.actor_ref

        def heard(event: Any) -> None:  # on the PolicyActor's thread
            if isinstance(event, PermissionRequest) and event.recorded:
                return  # this actor's own record of a request, back from the bus
            tell_quietly(ref, _Heard(event))

        # The PolicyActor owns this conversation's permission requests; the turn hears
        # them and how each ended, and records both in the conversation's events.
        self._requests = deps.bus.subscribe(
            self.conversation_id, heard, kinds=(PermissionRequest, RequestSettled)
        )
        for event in deps.storage.store.recover(self.conversation_id):
            deps.bus.publish(self.conversation_id, event)
        loaded = deps.storage.store.load(self.conversation_id)
        if loaded is None:
            # Deleted meanwhile: nothing to run, and nothing failed (a normal exit).
            log.info("no conversation to run", extra={"conversation_id": self.conversation_id})
            self.actor_ref.stop(block=False)
            return
        channel = (
            deps.settings.channels.get(loaded.info.channel)
            or deps.settings.channels["subconscious"]
        )
        self._state = core.opened(
            self.conversation_id,
            channel=channel,
            config=deps.models.client(channel.model).config,
            tools=deps.tools,
            messages=loaded.messages,
            seq=loaded.info.last_seq,
            queued=[
                core.Start(
                    turn_id=r.turn_id,
                    client_msg_id=r.client_msg_id,
                    text=r.text,
                    human_present=self._asks.get(r.turn_id, (False, False))[0],
                    park_asks=self._asks.get(r.turn_id, (False, False))[1],
                )
                for r in loaded.queued
            ],
            zone=deps.settings.zone,
            idle_stop=deps.settings.idle_stop,
            max_queued=deps.settings.max_queued,
            summaries=deps.storage.summaries is not None,
            summary=deps.storage.summaries.get(self.conversation_id)
            if deps.storage.summaries
            else None,
            parent_call=parent_of(loaded.info.origin),
            principal=loaded.info.principal,
        )
        for result in deps.storage.outbox.pending(self.conversation_id):
            self._on(core.Background(result))
        self._on(core.Resume())

    def on_stop(self) -> None:
        self._close_requests()
        self._disarm("idle")
        if self._state is not None and self._state.turn is not None:
            self._on(core.Cancel("interrupted"))

    def _close_requests(self) -> None:
        if self._requests is not None:
            self._requests.close()
            self._requests = None

    def on_failure(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """A fault in a handler: the turn ends now, from storage (what is in memory may be
        what broke), with an ``internal-error`` event and a line saying so. The
        supervisor then applies its rule (:data:`chalie_app.root.TURNS`)."""
        self._close_requests()
        state = self._state
        turn = state.turn if state is not None else None
        if state is not None:
            state.gen += 1
            state.turn = None
        if turn is not None:
            telemetry.turn_ended(turn.turn_id, "internal-error")
            if self._model is not None:
                self._model.cancel()
            with contextlib.suppress(Exception):
                self._deps.dispatcher.cancel_turn(turn.turn_id)
            with contextlib.suppress(Exception):
                self._deps.tools.forget(turn.turn_id)
        try:
            events = self._deps.storage.store.recover(
                self.conversation_id,
                line=FAILED_LINE,
                # The kind of fault only: its text may hold anything (the log has it).
                error=("internal-error", f"the turn failed ({type(exc).__name__})"),
            )
        except Exception:
            log.exception(
                "a failed turn could not be closed; the next start closes it",
                extra={"conversation_id": self.conversation_id},
            )
            return
        self._publish(events)

    # -- the mailbox ----------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, core.Message):  # the state machine's own (timers, streams)
            if isinstance(message, core.Replied | core.ModelFailed):
                self._trace_model(message)
            self._on(message)
            return None
        handler = _RECEIVE.get(type(message))
        if handler is None:
            return None
        return handler(self, message)

    def _trace_model(self, message: core.Replied | core.ModelFailed) -> None:
        state = self._state
        if state is None or state.turn is None or message.gen != state.gen:
            return
        replied = message if isinstance(message, core.Replied) else None
        failed = message if isinstance(message, core.ModelFailed) else None
        telemetry.model_ended(
            state.turn.turn_id,
            state.config.model,
            replied.response if replied is not None else None,
            failed.error if failed is not None else None,
        )

    def _start_turn(self, message: StartTurn) -> bool:
        self._send_no = max(self._send_no, message.send_no)
        if message.taken is not None:
            self._taken[message.turn_id] = message.taken
        start = core.Start(
            turn_id=message.turn_id,
            client_msg_id=message.client_msg_id,
            text=message.text,
            busy=message.busy,
            human_present=message.human_present,
            park_asks=message.park_asks,
        )
        effects = self._on(start)
        # The last word on this message's own turn: queued, or not (started, refused, ran).
        said = [e for e in effects if isinstance(e, core.Taken) and e.turn_id == message.turn_id]
        queued = said[-1].queued if said else False
        self._taken_now(core.Taken(message.turn_id, queued))  # if the machine has not already
        return queued

    def _cancel(self, _message: CancelRunningTurn) -> bool:
        if self._state is None or self._state.turn is None:
            return False
        self._on(core.Cancel())
        return True

    def _heard(self, message: _Heard) -> None:
        event = message.event
        if isinstance(event, PermissionRequest):
            self._on(core.AskHeard(event))
        else:
            self._on(core.AskSettled(event.request_id, event.answer))

    def _deliver(self, message: DeliverBackground) -> None:
        self._on(core.Background(message.result))

    def _evict(self, _message: EvictIfIdle) -> None:
        self._on(core.Evict())

    def _hand_off(self, _message: HandOff) -> None:
        self._handing_off = True
        self._on(core.Evict())

    def _crash(self, _message: _Crash) -> None:
        raise RuntimeError("crash requested")

    # -- the interpreter ----------------------------------------------------------------
    def _on(self, message: core.Message) -> list[core.Effect]:
        """One message through the state machine, and its effects carried out in order."""
        state = self._state
        if state is None:
            return []
        _, effects = core.on(state, message, core.Now(time.time(), time.monotonic()))
        todo = deque(effects)
        while todo:
            effect = todo.popleft()
            answer = _EFFECTS[type(effect)](self, effect)
            if answer is not None:  # an effect answered at once (a brief, a failed submit)
                _, more = core.on(state, answer, core.Now(time.time(), time.monotonic()))
                effects.extend(more)
                todo.extend(more)
        return effects

    def _publish(self, events: Sequence[ConversationEvent]) -> None:
        for event in events:
            self._deps.bus.publish(self.conversation_id, event)

    def _write(self, effect: core.Write) -> None:
        self._deps.storage.store.write(effect.batch)

    def _do_publish(self, effect: core.Publish) -> None:
        self._publish(effect.events)
        self._trace(effect.events)

    def _trace(self, events: Sequence[ConversationEvent]) -> None:
        """A turn's span opens and closes with its started and finished events (as published:
        a written batch's events are published too)."""
        state = self._state
        for event in events:
            if isinstance(event, TurnStarted) and state is not None:
                telemetry.turn_started(
                    self.conversation_id,
                    event.turn_id,
                    event.text,
                    state.channel.name,
                    state.parent_call,
                )
            elif isinstance(event, TurnFinished):
                telemetry.turn_ended(event.turn_id, event.reason, event.text)

    def _ack(self, effect: core.Ack) -> None:
        self._deps.storage.outbox.ack(effect.ids)

    def _follow_up(self, effect: core.FollowUp) -> None:
        self._deps.hooks.follow_up(self.conversation_id, effect.result)

    def _taken_now(self, effect: core.Taken) -> None:
        taken = self._taken.pop(effect.turn_id, None)
        if taken is not None and not taken.done():
            taken.set_result(
                submission.decided(self.conversation_id, effect.turn_id, effect.queued)
            )

    def _idle(self, _effect: core.Idle) -> None:
        if self._parent is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                self._parent.tell(
                    TurnActorIdle(self.conversation_id, self.actor_urn, self._send_no)
                )

    def _arm(self, effect: core.Arm) -> None:
        self._disarm(effect.timer)
        self._timers[effect.timer] = self.schedule(effect.delay, effect.message)

    def _disarm(self, timer: core.Timer) -> None:
        handle = self._timers.pop(timer, None)
        if handle is not None:
            self.unschedule(handle)

    def _do_disarm(self, effect: core.Disarm) -> None:
        self._disarm(effect.timer)

    def _cancel_model(self, _effect: core.CancelModel) -> None:
        model, self._model = self._model, None
        if model is not None:
            model.cancel()  # closes the HTTP stream on the loop

    def _cancel_calls(self, effect: core.CancelCalls) -> None:
        self._deps.dispatcher.cancel_turn(effect.turn_id)

    def _dispatch(self, effect: core.Dispatch) -> None:
        ref, gen, slot = self.actor_ref, effect.gen, effect.slot

        def done(future: concurrent.futures.Future[ToolOutcome]) -> None:
            tell_quietly(ref, core.CallDone(gen, slot, future.result()))

        self._deps.dispatcher.submit(effect.call).add_done_callback(done)

    def _brief(self, effect: core.Brief) -> core.Message:
        try:
            text = self._deps.hooks.brief(effect.context, effect.text)
        except Exception:  # the brief is extra: a memory fault never stops a turn
            log.exception("the memory brief failed", extra={"turn_id": effect.context.turn_id})
            text = ""
        return core.Briefed(effect.gen, text)

    def _keep_summary(self, effect: core.KeepSummary) -> None:
        if self._deps.storage.summaries is not None:
            self._deps.storage.summaries.put(self.conversation_id, effect.summary, effect.at)

    def _ended(self, effect: core.Ended) -> None:
        self._deps.tools.forget(effect.turn_id)
        if self._handing_off:  # idle once this turn's effects are done and none is queued
            tell_quietly(self.actor_ref, core.Evict())
        state = self._state
        channel = state.channel if state is not None else None
        try:
            self._deps.hooks.learn(
                effect.turn_id, channel.policy_channel if channel else "", effect.used
            )
        except Exception:
            log.exception("learning from turn %s failed", effect.turn_id)
        # One info line a turn: who, where, how far, which tools with which codes, why.
        log.info(
            "turn ended: conversation=%s channel=%s steps=%d tools=%s reason=%s duration=%.0fms",
            self.conversation_id,
            channel.name if channel else "?",
            effect.steps,
            ",".join(effect.codes) or "-",
            effect.reason,
            (time.monotonic() - effect.started) * 1000,
            extra={
                "conversation_id": self.conversation_id,
                "turn_id": effect.turn_id,
                "channel": channel.name if channel else "",
                "steps": effect.steps,
                "tools": list(effect.codes),
                "reason": effect.reason,
            },
        )

    def _compact(self, effect: core.Compact) -> core.Message | None:
        """Ask the model for a summary; answered by ``Compacted`` (text None: none came)."""
        client = self._deps.models.client(effect.model)
        ref, gen, upto, request = self.actor_ref, effect.gen, effect.upto, effect.request

        async def summarise() -> tuple[ModelResponse, str]:  # on the loop
            return await client.complete(request, lambda _text: None), ""

        def done(fut: concurrent.futures.Future[tuple[ModelResponse, str]]) -> None:
            try:
                response = fut.result()[0]
            except BaseException:
                tell_quietly(ref, core.Compacted(gen, upto, None, 0))
                return
            text = response.text.strip() or None
            tell_quietly(ref, core.Compacted(gen, upto, text, response.usage.total))

        try:
            self._model = self._deps.models.submit(summarise())
        except RuntimeError:
            return core.Compacted(gen, upto, None, 0)  # no loop: trim as before
        self._model.add_done_callback(done)
        return None

    def _ask(self, effect: core.Ask) -> core.Message | None:
        """The model request on the loop: deltas joined per window, the reply as a message."""
        client = self._deps.models.client(effect.model)
        ref, gen = self.actor_ref, effect.gen

        def emit(text: str) -> None:  # on the loop
            tell_quietly(ref, core.Delta(gen, text))

        def retried(attempt: int, error: ProviderError, delay: float) -> None:
            tell_quietly(ref, core.Retrying(gen, attempt, error, delay))

        if self._state is not None and self._state.turn is not None:
            telemetry.model_started(
                self._state.turn.turn_id, client.config.model, client.config.provider
            )
        try:
            future = self._deps.models.submit(answer(client, effect, emit, retried))
        except RuntimeError as exc:
            return core.ModelFailed(
                gen, ProviderError("model-unreachable", str(exc), retryable=False)
            )
        self._model = future
        future.add_done_callback(lambda f: tell_quietly(ref, _model_result(gen, f)))
        return None


# What the actor hears besides the state machine's own messages.
_RECEIVE: dict[type, Callable[[TurnActor, Any], Any]] = {
    StartTurn: TurnActor._start_turn,
    CancelRunningTurn: TurnActor._cancel,
    _Heard: TurnActor._heard,
    DeliverBackground: TurnActor._deliver,
    EvictIfIdle: TurnActor._evict,
    HandOff: TurnActor._hand_off,
    _Crash: TurnActor._crash,
}

# How each effect is carried out; an answer (a message) goes back into the machine at once.
_EFFECTS: dict[type, Callable[[TurnActor, Any], core.Message | None]] = {
    core.Write: TurnActor._write,
    core.Publish: TurnActor._do_publish,
    core.Ask: TurnActor._ask,
    core.Compact: TurnActor._compact,
    core.KeepSummary: TurnActor._keep_summary,
    core.CancelModel: TurnActor._cancel_model,
    core.Dispatch: TurnActor._dispatch,
    core.CancelCalls: TurnActor._cancel_calls,
    core.Brief: TurnActor._brief,
    core.Arm: TurnActor._arm,
    core.Disarm: TurnActor._do_disarm,
    core.Ack: TurnActor._ack,
    core.FollowUp: TurnActor._follow_up,
    core.Taken: TurnActor._taken_now,
    core.Idle: TurnActor._idle,
    core.Ended: TurnActor._ended,
}


def _model_result(
    gen: int, future: concurrent.futures.Future[tuple[ModelResponse, str]]
) -> core.Replied | core.ModelFailed:
    if future.cancelled():
        return core.ModelFailed(gen, ProviderError("cancelled", "cancelled", retryable=False))
    error = future.exception()
    if error is None:
        response, tail = future.result()
        return core.Replied(gen, response, tail)
    if isinstance(error, ProviderError):
        return core.ModelFailed(gen, error)
    log.error("model request failed unexpectedly: %r", error)
    return core.ModelFailed(
        gen, ProviderError("model-bad-response", type(error).__name__, retryable=False)
    )


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"

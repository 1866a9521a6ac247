"""TurnActor: one conversation's turns, as a message-driven state machine.

A turn, in order (each arrow is a message to this actor, never a wait):

1. ``StartTurn``: the user's message is stored with ``turn_started`` and the
   turn row marked running, in one transaction, before the model is called.
2. A model step: guards checked (steps, tokens, wall clock), the request built
   (system prompt, history fitted to the model's window, the channel's pinned
   descriptors plus what find_tools injected this turn) and handed to the
   daemon's event loop. Text deltas come back as ``_Delta`` (joined per 40 ms
   window on the loop: :mod:`chalie.conversation.stream`); the answer as
   ``_ModelDone``; a retry as ``_Retry`` (shown to the user).
3. No tool calls: the answer is stored with ``turn_finished(final)``. Tool
   calls: stored with the assistant message, then each dispatched at once
   (concurrently); each outcome comes back as ``_ToolDone`` via the
   dispatcher future's done-callback. When all are in, their results are
   stored in call order as native tool-result messages, and step 2 runs again.
4. Any time: ``CancelTurn`` (cancels the model stream and the turn's calls),
   a permission request or its settlement, a background result, another user
   message (queued, or cancelling the turn when the client asks for that).
5. The turn ends (final, cancelled, a guard, a model error): every call left
   without a result gets an error result, so the history stays valid for every
   provider; then the next queued message starts, or an idle timer runs.

A message from an older step or turn carries an older generation number and is
ignored. The actor never blocks on I/O: model requests run on the loop,
tool calls in the dispatcher, and SQLite writes are a few hundred microseconds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final, Protocol, TypeVar

import msgspec
import pykka

from actors.actor import SupervisedActor, tell_quietly
from actors.loop import EventLoopThread
from chalie import telemetry
from chalie.conversation import act, answers, background, compaction
from chalie.conversation.channels import Channel
from chalie.conversation.events import (
    BackgroundResult,
    ConversationEvent,
    ErrorEvent,
    FinishReason,
    PermissionRequest,
    PermissionSettled,
    RichPayload,
    TextDelta,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnStarted,
)
from chalie.conversation.store import FAILED_LINE, Batch, ConversationStore, TurnUpdate
from chalie.conversation.stream import DeltaThrottle
from chalie.delegate import parent_of
from chalie.dispatch import envelope_name
from chalie.events import EventBus, Subscription
from chalie.mail import (
    CancelRunningTurn,
    DeliverBackground,
    EvictIfIdle,
    StartTurn,
    TurnActorIdle,
)
from chalie.messages import RequestSettled, ToolCall, ToolOutcome, TurnContext
from chalie.principals import Principal
from chalie.providers import rescue
from chalie.providers.client import ModelClient
from chalie.providers.types import ChatMessage, ModelRequest, ModelResponse, ProviderError

log = logging.getLogger("chalie.turn")
R = TypeVar("R", PermissionRequest, BackgroundResult)

CANCELLED_LINE: Final = "The turn was cancelled."
# A call that ended with one of these was refused by a person or the gate: the turn
# does not learn from the tool (the user did not want it).
DENIED_CODES: Final = frozenset({"permission-denied", "approval-expired"})
# Tool calls one model response may start; the rest get an error result.
MAX_CALLS_PER_STEP: Final = 32
# Calls whose repetition is not an answer already in hand (they change what is callable).
META_TOOLS: Final = frozenset({"find_tools", "find_skills"})
# The characters of the person's message a framework seed searches with (one query entry).
SEED_CHARS: Final = 200


def cfg_nudge(client: ModelClient) -> bool:
    """Whether a repeat after success sends the next request without tools."""
    cfg = client.config
    return cfg.answer_nudge == "auto" and rescue.enabled("auto", cfg.provider)


class Dispatch(Protocol):
    def __call__(self, call: ToolCall) -> concurrent.futures.Future[ToolOutcome]: ...


@dataclass
class TurnDeps:
    """What every TurnActor of the daemon shares."""

    store: ConversationStore
    channels: dict[str, Channel]
    models: Callable[[str], ModelClient]
    loop: EventLoopThread
    dispatch: Dispatch
    cancel_calls: Callable[[str], None]  # the dispatcher's cancel_turn(turn_id)
    descriptors: Callable[[tuple[str, ...], bool], list[dict[str, Any]]]
    injected: Callable[[str], frozenset[str]]  # what find_tools injected into a turn
    forget: Callable[[str], None]  # release a finished turn's injections
    pending_background: Callable[[str], list[BackgroundResult]]  # the outbox, after a restart
    ack_background: Callable[[list[int]], object]  # results now stored in the history
    bus: EventBus
    idle_stop: float = 600.0
    max_queued: int = 16
    # At a turn's end: (turn id, policy channel, tools it used with success and no
    # denial; empty when the turn did not end with an answer). Must not block.
    learn: Callable[[str, str, frozenset[str]], object] = lambda _t, _c, _u: None
    # The tooltip shown while a call runs: the model's act_summary, or one the framework
    # writes from the tool's tooltip and arguments (chalie.healing.summary_for).
    summary: Callable[[str, dict[str, Any]], str] = lambda _t, _a: ""
    # The remote (MCP) tools scoped to a channel (by name): offered there like its pins.
    scoped: Callable[[str], tuple[str, ...]] = lambda _channel: ()
    # A background result reached this conversation while no turn ran: start a turn that
    # tells the person (chalie/conversation/background.py). Must not block.
    follow_up: Callable[[str, BackgroundResult], object] = lambda _c, _r: None
    # Where summaries of compacted histories are kept (None: histories are only trimmed).
    summaries: compaction.SummaryStore | None = None
    # The person's time zone ([accounts] zone): the system prompt says what day it is there.
    zone: str = "UTC"
    # What the memory remembers that bears on a message, for a turn with a human
    # (chalie.memory.briefing.for_turn; '' when nothing does). Reads only.
    brief: Callable[[TurnContext, str], str] = lambda _c, _m: ""


def _answer_taken(start: StartTurn, queued: bool) -> None:
    if start.taken is not None and not start.taken.done():
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            start.taken.set_result(queued)


@dataclass(frozen=True)
class State:
    """A snapshot for tests and ``conversations show``."""

    conversation_id: str
    turn_id: str | None
    queued: int
    messages: int
    last_seq: int


# -- private messages: the actor's own timers and model stream --------------------------


@dataclass(frozen=True)
class _Delta:
    gen: int
    text: str


@dataclass(frozen=True)
class _ModelDone:
    gen: int
    response: ModelResponse | None
    error: ProviderError | None
    tail: str = ""  # streamed text not yet sent as a delta (stored with the answer)


@dataclass(frozen=True)
class _Heard:
    """From the bus: a permission request of this conversation, or how one ended."""

    event: PermissionRequest | RequestSettled


@dataclass(frozen=True)
class _Retry:
    gen: int
    attempt: int
    error: ProviderError
    delay: float


@dataclass(frozen=True)
class _ToolDone:
    gen: int
    index: int
    outcome: ToolOutcome


@dataclass(frozen=True)
class _Deadline:
    gen: int


@dataclass(frozen=True)
class _Seeded:
    """The framework seed's find_tools ended (its injections are in place): ask the model."""

    gen: int
    outcome: ToolOutcome


@dataclass(frozen=True)
class _IdleCheck:
    gen: int


@dataclass(frozen=True)
class _Compacted:
    """The model's summary of the turns that no longer fit (None: it could not write one)."""

    gen: int
    upto: int
    text: str | None
    tokens: int


@dataclass
class _Call:
    index: int
    call_id: str
    tool: str
    result: str | None = None
    key: str = ""  # act.call_key: a later identical call gets this one's result


@dataclass
class _Turn:
    turn_id: str
    client_msg_id: str
    start_idx: int
    guards: act.Guards
    notes: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    model: concurrent.futures.Future[tuple[ModelResponse, str]] | None = None
    requests: dict[str, str] = field(default_factory=dict)  # pending request id -> tool
    succeeded: set[str] = field(default_factory=set)  # tools called with success
    compacted: bool = False  # this turn already asked for a summary
    denied: set[str] = field(default_factory=set)  # tools the user (or the gate) denied
    deadline: list[int] = field(default_factory=list)  # this actor's timer handles
    human_present: bool = False  # a person answers this turn's asks (StartTurn)
    started: float = field(default_factory=time.monotonic)
    done: dict[str, tuple[str, str]] = field(default_factory=dict)  # call key -> tool, result
    last_ok: tuple[str, str] | None = None  # the latest successful call: tool, envelope
    codes: list[str] = field(default_factory=list)  # "tool:code" of each call, for the log
    nudge: str = ""  # a one-off note after the history in the next request (never stored)
    nudged: bool = False  # the empty-answer nudge was spent
    no_tools: bool = False  # the next request goes without tools (the model must answer)
    model_notes: set[str] = field(default_factory=set)  # error lines meant for the model
    park_asks: bool = False  # its unanswerable asks wait for the owner (StartTurn)
    answer_due: bool = False  # a tool succeeded: the next request asks for the answer
    brief: str = ""  # the memories that bear on the message, before it in every request


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
    ) -> None:
        super().__init__()
        self.conversation_id = conversation_id
        self._deps = deps
        self._parent = parent
        self._messages: list[ChatMessage] = []
        self._sizes: list[int] = []  # act.message_tokens of each message, counted once
        self._seq = 0
        self._gen = 0
        self._turn: _Turn | None = None
        self._queue: deque[StartTurn] = deque()
        # Turns loaded from storage as queued when this actor started: their StartTurn
        # (sent by the parent right after starting this actor) may arrive after they ran.
        self._from_storage: set[str] = set()
        # Background results waiting for the tool step, with their outbox ids.
        self._held: list[tuple[ChatMessage, int]] = []
        self._delivered: set[str] = set()
        self._send_no = send_no
        self._channel: Channel | None = None
        self._parent_call = ""  # a delegate conversation's parent call (chalie.delegate)
        self._principal: Principal | None = None  # whose conversation (None: the owner's)
        self._idle_timer: list[int] = []
        self._requests: Subscription | None = None

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
        for event in deps.store.recover(self.conversation_id):
            deps.bus.publish(self.conversation_id, event)
        loaded = deps.store.load(self.conversation_id)
        if loaded is None:
            # Deleted meanwhile: nothing to run, and nothing failed (a normal exit).
            log.info("no conversation to run", extra={"conversation_id": self.conversation_id})
            self.actor_ref.stop(block=False)
            return
        self._channel = deps.channels.get(loaded.info.channel) or deps.channels["subconscious"]
        self._parent_call = parent_of(loaded.info.origin)
        self._principal = loaded.info.principal
        self._messages = loaded.messages
        self._sizes = [act.message_tokens(m) for m in self._messages]
        self._history_summary = deps.summaries.get(self.conversation_id) if deps.summaries else None
        self._seq = loaded.info.last_seq
        for message in self._messages:
            if message.role == "background":
                self._delivered.add(message.call_id)
        for result in deps.pending_background(self.conversation_id):
            self._background(result)
        for row in loaded.queued:
            self._queue.append(StartTurn(row.turn_id, row.client_msg_id, row.text))
            self._from_storage.add(row.turn_id)
        self._next_or_idle()

    def on_stop(self) -> None:
        self._close_requests()
        self._unschedule(self._idle_timer)
        if self._turn is not None:
            self._finish("interrupted", "The conversation was stopped during the turn.")

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
        self._gen += 1
        turn, self._turn = self._turn, None
        if turn is not None:
            telemetry.turn_ended(turn.turn_id, "internal-error")
            if turn.model is not None:
                turn.model.cancel()
            with contextlib.suppress(Exception):
                self._deps.cancel_calls(turn.turn_id)
            with contextlib.suppress(Exception):
                self._deps.forget(turn.turn_id)
        try:
            events = self._deps.store.recover(
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

    def _report_idle(self) -> None:
        if self._turn is None and not self._queue and self._parent is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                self._parent.tell(
                    TurnActorIdle(self.conversation_id, self.actor_urn, self._send_no)
                )

    # -- the mailbox ----------------------------------------------------------------
    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Delta):
            if message.gen == self._gen and self._turn is not None:
                self._emit(TextDelta, turn_id=self._turn.turn_id, text=message.text)
        elif isinstance(message, _ToolDone):
            if message.gen == self._gen:
                self._tool_done(message.index, message.outcome)
        elif isinstance(message, _ModelDone):
            if message.gen == self._gen:
                self._model_done(message.response, message.error, message.tail)
        elif isinstance(message, StartTurn):
            self._send_no = max(self._send_no, message.send_no)
            queued = self._start_or_queue(message)
            _answer_taken(message, queued)  # if _start has not already
            return queued
        elif isinstance(message, _Retry):
            if message.gen == self._gen and self._turn is not None:
                self._emit(
                    ErrorEvent,
                    turn_id=self._turn.turn_id,
                    code="model-retry",
                    message=(
                        f"{message.error.message}; retrying in {message.delay:.1f} s "
                        f"(attempt {message.attempt})"
                    ),
                )
        elif isinstance(message, CancelRunningTurn):
            return self._cancel()
        elif isinstance(message, _Heard):
            if isinstance(message.event, PermissionRequest):
                self._permission(message.event)
            else:
                self._settled(message.event.request_id, message.event.answer)
        elif isinstance(message, DeliverBackground):
            self._background(message.result)
        elif isinstance(message, _Compacted):
            self._compacted(message)
        elif isinstance(message, _Seeded):
            if message.gen == self._gen and self._turn is not None:
                self._turn.codes.append(f"seed:{message.outcome.code or message.outcome.status}")
                self._step()
        elif isinstance(message, _Deadline):
            if message.gen == self._gen and self._turn is not None:
                self._finish("guard-time", self._turn.guards.line("guard-time"))
        elif isinstance(message, _IdleCheck):
            if message.gen == self._gen:
                self._report_idle()
        elif isinstance(message, EvictIfIdle):
            self._report_idle()
        elif message == "state":
            return self.state()
        elif message == "crash":  # tests: a fault inside the actor
            raise RuntimeError("crash requested")
        return None

    def state(self) -> State:
        return State(
            conversation_id=self.conversation_id,
            turn_id=self._turn.turn_id if self._turn else None,
            queued=len(self._queue),
            messages=len(self._messages),
            last_seq=self._seq,
        )

    # -- events -----------------------------------------------------------------------
    def _event(self, cls: type[ConversationEvent], **fields: Any) -> ConversationEvent:
        self._seq += 1
        return cls(conversation_id=self.conversation_id, seq=self._seq, ts=time.time(), **fields)

    def _finished(
        self, turn: _Turn, call_id: str, tool: str, status: str, code: str | None
    ) -> ConversationEvent:
        """The tool_finished event of one of the turn's calls."""
        return self._event(
            ToolFinished,
            turn_id=turn.turn_id,
            call_id=call_id,
            tool=tool[:128],
            status=status,
            code=code,
        )

    def _record(self, made: R, **fields: Any) -> R:
        """A value its owner made unnumbered (a request, a result), as this log's next event."""
        self._seq += 1
        return msgspec.structs.replace(made, seq=self._seq, ts=time.time(), **fields)

    def _publish(self, events: Sequence[ConversationEvent]) -> None:
        for event in events:
            self._deps.bus.publish(self.conversation_id, event)

    def _emit(self, cls: type[ConversationEvent], **fields: Any) -> None:
        """One event on its own: stored, then published."""
        event = self._event(cls, **fields)
        self._deps.store.write(Batch(self.conversation_id, events=[event]))
        self._publish([event])

    def _append(self, batch: Batch, turn_id: str, message: ChatMessage) -> None:
        batch.messages.append((len(self._messages), turn_id, message))
        self._messages.append(message)
        self._sizes.append(act.message_tokens(message))

    # -- starting a turn ----------------------------------------------------------------
    def _start_or_queue(self, start: StartTurn) -> bool:
        """Start the turn or queue it; True when it waits behind another."""
        turn = self._turn
        if turn is not None and turn.turn_id == start.turn_id:
            # Loaded from storage as queued when this actor started: the send's per-turn
            # facts still apply (before the model's first answer, which comes later).
            turn.human_present = start.human_present
            turn.park_asks = start.park_asks
            return False
        for i, queued in enumerate(self._queue):
            if queued.turn_id == start.turn_id:
                self._queue[i] = start
                return True
        if start.turn_id in self._from_storage:
            # Loaded from storage and already run (the model answered before this message
            # came): running it again would repeat the user's message.
            self._from_storage.discard(start.turn_id)
            return False
        if turn is None:
            self._start(start)
            return False
        if start.busy == "cancel":
            self._finish("cancelled", CANCELLED_LINE)
            if self._turn is None:
                self._start(start)
                return False
        if len(self._queue) >= self._deps.max_queued:
            self._refuse(
                start, "queue-full", "Too many messages are waiting; this one was not run."
            )
            return False
        self._queue.append(start)
        return True

    def _refuse(self, start: StartTurn, code: str, line: str) -> None:
        event = self._event(TurnFinished, turn_id=start.turn_id, reason="cancelled", text=line)
        self._deps.store.write(
            Batch(
                self.conversation_id,
                events=[event],
                turn=TurnUpdate(start.turn_id, state="done", reason="cancelled", notes=[code]),
            )
        )
        self._publish([event])

    def _start(self, start: StartTurn) -> None:
        _answer_taken(start, False)  # started, not queued: the sender need not wait for more
        channel = self._channel
        assert channel is not None
        self._gen += 1
        turn = _Turn(
            start.turn_id,
            start.client_msg_id,
            len(self._messages),
            act.Guards(channel),
            human_present=start.human_present,
            park_asks=start.park_asks,
        )
        self._turn = turn
        telemetry.turn_started(self.conversation_id, start, channel.name, self._parent_call)
        batch = Batch(self.conversation_id, turn=TurnUpdate(start.turn_id, state="running"))
        self._append(batch, start.turn_id, ChatMessage(role="user", text=start.text))
        batch.events.append(
            self._event(
                TurnStarted,
                turn_id=start.turn_id,
                client_msg_id=start.client_msg_id,
                text=start.text,
            )
        )
        self._deps.store.write(batch)
        self._publish(batch.events)
        self._schedule(channel.wall_clock, _Deadline(self._gen), turn.deadline)
        if channel.human_present and self._model_config().memory_brief == "on":
            try:
                turn.brief = self._deps.brief(self._context(turn), start.text)
            except Exception:  # the brief is extra: a memory fault never stops a turn
                log.exception("the memory brief failed", extra={"turn_id": turn.turn_id})
        if channel.find_tools and self._aid(self._deps.models(channel.model).config.seed_tools):
            self._seed(turn, start.text)
            return
        self._step()

    def _aid(self, setting: str) -> bool:
        """Whether a small-model aid set to ``setting`` ("auto" or "off") is on for this
        channel's model (auto: on the wires local models speak, chalie.providers.rescue)."""
        channel = self._channel
        assert channel is not None
        provider = self._deps.models(channel.model).config.provider
        return rescue.enabled(setting, provider)  # type: ignore[arg-type]

    def _context(self, turn: _Turn, **extra: Any) -> TurnContext:
        """Who the turn's calls are made for: its conversation, channel, principal."""
        channel = self._channel
        assert channel is not None
        fields: dict[str, Any] = {
            "conversation_id": self.conversation_id,
            "turn_id": turn.turn_id,
            "channel": channel.policy_channel,
            "human_present": channel.human_present or turn.human_present,
            "park_asks": turn.park_asks,
            "allow_async": channel.async_offered,
            "injected": self._channel_tools(),
            "scope": "restricted",
            "initiator": "model",
            "parent_call": self._parent_call,
            "principal": self._principal,
        }
        return TurnContext(**{**fields, **extra})

    def _seed(self, turn: _Turn, text: str) -> None:
        """The framework seed: find_tools on the person's message, through the dispatcher,
        so a tool that clearly fits is offered in the first request; then the first step."""
        query = " ".join(text.split())[:SEED_CHARS]
        call = ToolCall(
            call_id=f"seed_{uuid.uuid4().hex[:24]}",
            tool="find_tools",
            arguments={"query": [query]},
            context=self._context(turn, initiator="framework", seed=True),
        )
        gen, ref = self._gen, self.actor_ref

        def seeded(future: concurrent.futures.Future[ToolOutcome]) -> None:
            tell_quietly(ref, _Seeded(gen, future.result()))

        self._deps.dispatch(call).add_done_callback(seeded)

    # -- a model step -------------------------------------------------------------------
    def _channel_tools(self) -> tuple[str, ...]:
        """The channel's own tools: its pins and the remote tools scoped to it."""
        channel = self._channel
        assert channel is not None
        return tuple(dict.fromkeys((*channel.tools(), *self._deps.scoped(channel.name))))

    def _tool_names(self, turn: _Turn) -> tuple[str, ...]:
        injected = sorted(self._deps.injected(turn.turn_id))
        return tuple(dict.fromkeys((*self._channel_tools(), *injected)))

    def _step(self) -> None:
        turn = self._turn
        channel = self._channel
        assert turn is not None and channel is not None
        if self._held:
            batch = Batch(self.conversation_id)
            for message, _ in self._held:
                self._append(batch, turn.turn_id, message)
            self._deps.store.write(batch)
            self._ack_held()
        stop = turn.guards.before_step()
        if stop is not None:
            self._finish(stop, turn.guards.line(stop))
            return
        client = self._deps.models(channel.model)
        names = self._tool_names(turn)
        tools = tuple(self._deps.descriptors(names, channel.async_offered))
        cfg = client.config
        if turn.no_tools:
            turn.no_tools = False
            tools = ()
        system = act.with_today(channel.prompt(), self._deps.zone, time.time())
        budget = (
            cfg.context_window
            - cfg.max_output_tokens
            - act.estimate_tokens(system)
            - act.tools_tokens(tools)
        )
        view, sizes, offset = compaction.with_summary(
            self._messages, self._sizes, self._history_summary
        )
        fitted = act.fit_context(view, turn.start_idx - offset, max(budget, 0), sizes)
        dropped = len(view) - len(fitted.messages)
        if dropped > 0 and self._deps.summaries is not None and not turn.compacted:
            turn.compacted = True
            self._compact(client, view[:dropped], offset + dropped)
            return
        for note in fitted.notes:
            if note not in turn.notes:
                turn.notes.append(note)
        messages = tuple(fitted.messages)
        if turn.brief:
            messages = _with_brief(messages, self._messages[turn.start_idx], turn.brief)
        if turn.answer_due:
            turn.answer_due = False
            # After a success the model is asked for the answer with the result, in the
            # result's own message (a small model otherwise says how it would do it; with
            # the note there the real one answered 17 of 17 times). Not on the delegates'
            # channels (no find_tools): there a search is followed by reading pages.
            last = messages[-1] if messages else None
            if (
                last is not None
                and last.role == "tool"
                and channel.find_tools
                and self._aid(cfg.answer_check)
            ):
                noted = f"{last.text}\n{answers.ANSWER_NOTE}"
                messages = (*messages[:-1], msgspec.structs.replace(last, text=noted))
        if turn.nudge:  # a one-off note for this request only: never stored
            messages = (*messages, ChatMessage(role="user", text=turn.nudge))
            turn.nudge = ""
        request = ModelRequest(
            system=system,
            messages=messages,
            tools=tools,
            max_tokens=cfg.max_output_tokens,
        )
        gen = self._gen
        ref = self.actor_ref
        # The answer check holds the stream until its start reads as an answer.
        check = self._aid(cfg.answer_check)
        # Calls written as text are read back only where tools were offered.
        offered = (
            frozenset(names)
            if tools and rescue.enabled(cfg.tool_call_rescue, cfg.provider)
            else None
        )

        async def complete() -> tuple[ModelResponse, str]:  # on the loop
            deltas = DeltaThrottle(
                asyncio.get_running_loop(), lambda text: tell_quietly(ref, _Delta(gen, text))
            )
            held = rescue.HeldText() if offered is not None else None
            checked = answers.HeldAnswer(names) if check else None

            def shown(text: str) -> str:
                return checked.feed(text) if checked is not None and text else text

            def on_delta(text: str) -> None:
                deltas.add(shown(held.feed(text) if held is not None else text))

            def on_retry(attempt: int, error: ProviderError, delay: float) -> None:
                if held is not None:
                    held.release()  # the retry streams the answer again from its start
                if checked is not None:
                    checked.release()
                deltas.flush()
                tell_quietly(ref, _Retry(gen, attempt, error, delay))

            try:
                response = await client.complete(request, on_delta, on_retry)
            except BaseException:
                deltas.flush()  # what streamed before the failure reaches the actor first
                raise
            if offered is not None and held is not None:
                rescued = act.rescued_response(response, offered)
                if rescued is not None:
                    held.release()  # the call is never shown as an answer
                    return rescued, deltas.take()
                deltas.add(shown(held.release()))
            if checked is not None:
                deltas.add(checked.release())
            # The words not yet passed on are stored with the answer, in the same write.
            return response, deltas.take()

        telemetry.model_started(turn.turn_id, cfg.model, cfg.provider)
        try:
            future = self._deps.loop.submit(complete())
        except RuntimeError as exc:
            self._model_done(None, ProviderError("model-unreachable", str(exc), retryable=False))
            return
        turn.model = future
        future.add_done_callback(lambda f: tell_quietly(ref, _model_result(gen, f)))

    def _model_config(self) -> Any:
        channel = self._channel
        assert channel is not None
        return self._deps.models(channel.model).config

    def _compact(self, client: ModelClient, old: list[ChatMessage], upto: int) -> None:
        """Ask the model for a summary of ``old`` (the first ``upto`` stored messages)."""
        turn = self._turn
        assert turn is not None
        gen, ref = self._gen, self.actor_ref
        request = compaction.summary_request(old)

        async def summarise() -> tuple[ModelResponse, str]:  # on the loop
            return await client.complete(request, lambda _text: None), ""

        def done(fut: concurrent.futures.Future[tuple[ModelResponse, str]]) -> None:
            try:
                response = fut.result()[0]
            except BaseException:
                tell_quietly(ref, _Compacted(gen, upto, None, 0))
                return
            text = response.text.strip() or None
            tell_quietly(ref, _Compacted(gen, upto, text, response.usage.total))

        try:
            turn.model = self._deps.loop.submit(summarise())
        except RuntimeError:
            self._step()  # no loop: trim as before (compacted is set, so no second try)
            return
        turn.model.add_done_callback(done)

    def _compacted(self, message: _Compacted) -> None:
        turn = self._turn
        if message.gen != self._gen or turn is None:
            return
        turn.model = None
        turn.guards.tokens += message.tokens
        if message.text and self._deps.summaries is not None:
            self._history_summary = compaction.Summary(message.upto, message.text)
            self._deps.summaries.put(self.conversation_id, self._history_summary, time.time())
            turn.notes.append(f"context: {message.upto} earlier message(s) summarised")
        self._step()

    def _model_done(
        self, response: ModelResponse | None, error: ProviderError | None, tail: str = ""
    ) -> None:
        turn = self._turn
        if turn is None:
            return
        turn.model = None
        telemetry.model_ended(turn.turn_id, self._model_config().model, response, error)
        if error is not None or response is None:
            err = error or ProviderError("model-bad-response", "no response", retryable=False)
            self._emit(ErrorEvent, turn_id=turn.turn_id, code=err.code, message=err.message)
            self._finish("model-error", f"The model could not answer: {err.message}")
            return
        turn.guards.steps += 1
        turn.guards.tokens += response.usage.total or (act.estimate_tokens(response.text) + 1)
        batch = Batch(
            self.conversation_id,
            turn=TurnUpdate(turn.turn_id, steps=turn.guards.steps, tokens=turn.guards.tokens),
        )
        if tail:  # the step's last words: stored and published with the answer
            batch.events.append(self._event(TextDelta, turn_id=turn.turn_id, text=tail))
        unfit: answers.Unfit = ""
        if not response.tool_calls and self._aid(self._model_config().answer_check):
            unfit = answers.unfit(response.text, self._tool_names(turn))
        if not response.tool_calls and (
            not response.text.strip()
            or act.recites_a_note(response.text, turn.model_notes)
            or unfit
        ):
            # An empty answer, a hint meant for the model recited, or text that is no
            # answer (markup, a schema, a call described): one nudge, then the turn ends
            # saying so (never "final"), with the result in hand if there is one.
            if turn.nudged:
                line = act.EMPTY_LINE
                if unfit and turn.last_ok is not None:
                    line = f"{line} {act.result_for_user(*turn.last_ok)}"
                self._finish("empty-answer", line, batch)
                return
            turn.nudged = True
            turn.nudge = answers.retry_note(unfit) if unfit else act.EMPTY_NUDGE
            if unfit:
                turn.notes.append(f"answer refused: {unfit}")
            self._deps.store.write(batch)
            self._publish(batch.events)
            self._step()
            return
        message = ChatMessage(role="assistant", text=response.text, tool_calls=response.tool_calls)
        self._append(batch, turn.turn_id, message)
        if not response.tool_calls:
            self._finish("final", response.text, batch)  # the answer and the end: one write
            return
        channel = self._channel
        assert channel is not None
        repeat = False
        to_run: list[tuple[_Call, ToolCall]] = []
        context = self._context(turn)
        turn.calls = []
        for index, part in enumerate(response.tool_calls):
            call = _Call(index, part.id, part.name, key=act.call_key(part))
            turn.calls.append(call)
            if index >= MAX_CALLS_PER_STEP:
                call.result = act.closed_call(
                    part.name,
                    "overloaded",
                    f"Only {MAX_CALLS_PER_STEP} tool calls run per step; this one did not.",
                )
                continue
            summary = self._deps.summary(part.name, part.arguments or {})[:200]
            batch.events.append(
                self._event(
                    ToolStarted,
                    turn_id=turn.turn_id,
                    call_id=part.id,
                    tool=part.name[:128],
                    act_summary=summary,
                )
            )
            if turn.guards.record_call(part):
                repeat = True
            earlier = turn.done.get(call.key)
            if earlier is not None and not repeat:
                # The same call again after it succeeded: not run again. The model gets
                # the earlier result with a note to answer, and (answer_nudge) no tools.
                call.result = act.repeated_result(earlier[1])
                turn.codes.append(f"{envelope_name(part.name)}:repeated")
                if cfg_nudge(self._deps.models(channel.model)):
                    turn.no_tools = True
                batch.events.append(self._finished(turn, part.id, part.name, "success", "repeated"))
                continue
            arguments, bare = act.loose_arguments(part)
            if arguments is None and bare is None:
                call.result = act.malformed_arguments(part)
                turn.codes.append(f"{envelope_name(part.name)}:invalid-param")
                batch.events.append(
                    self._finished(turn, part.id, part.name, "error", "invalid-param")
                )
                continue
            to_run.append(
                (
                    call,
                    ToolCall(
                        call_id=part.id,
                        tool=part.name,
                        arguments=arguments or {},
                        context=context,
                        bare=bare,
                    ),
                )
            )
        self._deps.store.write(batch)
        if repeat:
            self._publish(batch.events)
            line = turn.guards.line("guard-repeat")
            if turn.last_ok is not None:  # the user gets the result the model had in hand
                line = f"{line} {act.result_for_user(*turn.last_ok)}"
            self._finish("guard-repeat", line)
            return
        gen = self._gen
        ref = self.actor_ref
        for call, tool_call in to_run:
            future = self._deps.dispatch(tool_call)
            future.add_done_callback(_tool_callback(ref, gen, call.index))
        self._publish(batch.events)  # stored before the calls start, shown after they left
        self._maybe_next_step()

    # -- tool results -------------------------------------------------------------------
    def _tool_done(self, index: int, outcome: ToolOutcome) -> None:
        turn = self._turn
        if turn is None or index >= len(turn.calls) or turn.calls[index].result is not None:
            return
        call = turn.calls[index]
        call.result = outcome.envelope
        if outcome.status == "error":
            turn.model_notes.update(act.model_notes(outcome.envelope))
        turn.codes.append(f"{envelope_name(call.tool)}:{outcome.code or outcome.status}")
        if outcome.status == "success" and not outcome.background:
            # a call sent to the background has not succeeded yet: it teaches nothing
            turn.succeeded.add(call.tool)
            if call.tool not in META_TOOLS:
                turn.done[call.key] = (call.tool, outcome.envelope)
                turn.last_ok = (call.tool, outcome.envelope)
                turn.answer_due = True
        elif outcome.code in DENIED_CODES:
            turn.denied.add(call.tool)
        events = [self._finished(turn, call.call_id, call.tool, outcome.status, outcome.code)]
        rich = getattr(outcome, "rich", None)
        if isinstance(rich, dict):
            events.append(
                self._event(
                    RichPayload,
                    turn_id=turn.turn_id,
                    call_id=call.call_id,
                    tool=call.tool,
                    payload=rich,
                )
            )
        batch = Batch(self.conversation_id, events=events)
        if any(c.result is None for c in turn.calls):
            self._deps.store.write(batch)
            self._publish(events)
            return
        self._next_step(batch)  # the last result: its events and all results in one write

    def _maybe_next_step(self) -> None:
        turn = self._turn
        if turn is None or any(c.result is None for c in turn.calls):
            return
        self._next_step(Batch(self.conversation_id))

    def _next_step(self, batch: Batch) -> None:
        """Store every result of the step in call order, then ask the model again."""
        turn = self._turn
        assert turn is not None
        for call in turn.calls:
            self._append(
                batch,
                turn.turn_id,
                ChatMessage(
                    role="tool", call_id=call.call_id, tool=call.tool, text=call.result or ""
                ),
            )
        turn.calls = []
        self._deps.store.write(batch)
        self._publish(batch.events)
        self._step()

    # -- mid-turn arrivals --------------------------------------------------------------
    def _permission(self, request: PermissionRequest) -> None:
        turn = self._turn
        turn_id = turn.turn_id if turn is not None else ""
        if turn is not None:
            turn.requests[request.request_id] = request.tool
        event = self._record(request, turn_id=turn_id)
        self._deps.store.write(Batch(self.conversation_id, events=[event]))
        self._publish([event])

    def _settled(self, request_id: str, answer: str) -> None:
        turn = self._turn
        if turn is None or turn.requests.pop(request_id, None) is None:
            return  # not this turn's, or withdrawn with its turn
        self._emit(PermissionSettled, request_id=request_id, answer=answer)

    def _background(self, result: BackgroundResult) -> None:
        if result.call_id in self._delivered:
            if result.outbox_id:
                self._deps.ack_background([result.outbox_id])
            return
        self._delivered.add(result.call_id)
        if len(self._delivered) > 10_000:
            self._delivered.clear()
        message = ChatMessage(
            role="background", call_id=result.call_id, tool=result.tool, text=result.envelope
        )
        # The rich payload and the outbox row are the delivery's, not the log's.
        event = self._record(result, rich=None, outbox_id=0)
        turn = self._turn
        if turn is not None and (turn.calls or turn.model is not None):
            # Between a tool call and its result no message may stand: the model
            # sees it at its next step.
            self._held.append((message, result.outbox_id))
            self._deps.store.write(Batch(self.conversation_id, events=[event]))
        else:
            batch = Batch(self.conversation_id, events=[event])
            self._append(batch, turn.turn_id if turn else "", message)
            self._deps.store.write(batch)
            if result.outbox_id:
                self._deps.ack_background([result.outbox_id])
        self._publish([event])
        if turn is None and background.starts_turn(result):
            self._deps.follow_up(self.conversation_id, result)

    def _cancel(self) -> bool:
        if self._turn is None:
            return False
        self._finish("cancelled", CANCELLED_LINE)
        return True

    # -- the end of a turn ----------------------------------------------------------------
    def _finish(self, reason: FinishReason, text: str, prior: Batch | None = None) -> None:
        """End the turn; ``prior`` (not yet written) is stored in the same transaction."""
        turn = self._turn
        if turn is None:
            return
        self._gen += 1
        self._turn = None
        telemetry.turn_ended(turn.turn_id, reason, text)
        if turn.model is not None:
            turn.model.cancel()  # closes the HTTP stream on the loop
        self._unschedule(turn.deadline)
        open_calls = [c for c in turn.calls if c.result is None]
        if open_calls or reason in ("cancelled", "interrupted"):
            with contextlib.suppress(Exception):
                self._deps.cancel_calls(turn.turn_id)
        batch = Batch(
            self.conversation_id,
            turn=TurnUpdate(
                turn.turn_id,
                state="done",
                reason=reason,
                steps=turn.guards.steps,
                tokens=turn.guards.tokens,
                notes=turn.notes,
            ),
        )
        if prior is not None:
            batch.messages.extend(prior.messages)
            batch.events.extend(prior.events)
        code = "interrupted" if reason == "interrupted" else "cancelled"
        for call in turn.calls:
            result = call.result or act.closed_call(
                call.tool, code, f"The turn ended ({reason}) before this call finished."
            )
            self._append(
                batch,
                turn.turn_id,
                ChatMessage(role="tool", call_id=call.call_id, tool=call.tool, text=result),
            )
        for message, _ in self._held:
            self._append(batch, turn.turn_id, message)
        for request_id in sorted(turn.requests):
            batch.events.append(
                self._event(PermissionSettled, request_id=request_id, answer="withdrawn")
            )
        batch.events.append(
            self._event(TurnFinished, turn_id=turn.turn_id, reason=reason, text=text)
        )
        self._deps.store.write(batch)
        self._ack_held()
        self._publish(batch.events)
        self._deps.forget(turn.turn_id)
        self._learn(turn, reason)
        self._log_turn(turn, reason)
        self._next_or_idle()

    def _log_turn(self, turn: _Turn, reason: FinishReason) -> None:
        """One info line a turn: who, where, how far, which tools with which codes, why."""
        channel = self._channel
        log.info(
            "turn ended: conversation=%s channel=%s steps=%d tools=%s reason=%s duration=%.0fms",
            self.conversation_id,
            channel.name if channel else "?",
            turn.guards.steps,
            ",".join(turn.codes) or "-",
            reason,
            (time.monotonic() - turn.started) * 1000,
            extra={
                "conversation_id": self.conversation_id,
                "turn_id": turn.turn_id,
                "channel": channel.name if channel else "",
                "steps": turn.guards.steps,
                "tools": list(turn.codes),
                "reason": reason,
            },
        )

    def _learn(self, turn: _Turn, reason: FinishReason) -> None:
        """Hand what the turn used to discovery's learning; only an answered turn teaches."""
        channel = self._channel
        used = frozenset(turn.succeeded - turn.denied) if reason == "final" else frozenset()
        try:
            self._deps.learn(turn.turn_id, channel.policy_channel if channel else "", used)
        except Exception:
            log.exception("learning from turn %s failed", turn.turn_id)

    def _ack_held(self) -> None:
        ids = [outbox_id for _, outbox_id in self._held if outbox_id]
        self._held.clear()
        if ids:
            self._deps.ack_background(ids)

    def _next_or_idle(self) -> None:
        if self._queue:
            self._start(self._queue.popleft())
            return
        self._unschedule(self._idle_timer)
        self._idle_timer = []
        self._schedule(self._deps.idle_stop, _IdleCheck(self._gen), self._idle_timer)

    # -- timers on the loop (a thread per timer would cost a thread per conversation) ----
    def _schedule(self, delay: float, message: Any, box: list[int]) -> None:
        box.append(self.schedule(delay, message))  # in this actor's inbox

    def _unschedule(self, box: list[int]) -> None:
        for handle in box:
            self.unschedule(handle)
        box.clear()


def _with_brief(
    messages: tuple[ChatMessage, ...], asked: ChatMessage, brief: str
) -> tuple[ChatMessage, ...]:
    """The request's messages with the memory brief before the person's message (in this
    request only: the stored message stays as it was written)."""
    out = list(messages)
    for i, m in enumerate(out):
        if m is asked:
            out[i] = msgspec.structs.replace(m, text=f"{brief}\n\n{m.text}")
            break
    return tuple(out)


def _tool_callback(
    ref: pykka.ActorRef[Any], gen: int, index: int
) -> Callable[[concurrent.futures.Future[ToolOutcome]], None]:
    def done(future: concurrent.futures.Future[ToolOutcome]) -> None:
        tell_quietly(ref, _ToolDone(gen, index, future.result()))

    return done


def _model_result(
    gen: int, future: concurrent.futures.Future[tuple[ModelResponse, str]]
) -> _ModelDone:
    if future.cancelled():
        return _ModelDone(gen, None, ProviderError("cancelled", "cancelled", retryable=False))
    error = future.exception()
    if error is None:
        response, tail = future.result()
        return _ModelDone(gen, response, None, tail)
    if isinstance(error, ProviderError):
        return _ModelDone(gen, None, error)
    log.error("model request failed unexpectedly: %r", error)
    return _ModelDone(
        gen, None, ProviderError("model-bad-response", type(error).__name__, retryable=False)
    )


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"

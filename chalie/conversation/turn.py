"""One conversation's turns as data: a state, messages in, effects out.

:func:`on` is the whole state machine: ``on(state, message, now)`` updates the
state and returns what must happen, in order, as effects. It does no I/O and
keeps no clock, thread, future or bus of its own; the TurnActor
(actors/conversation/turn.py) interprets the effects (a write, an event published, a model
request, a tool call dispatched, a timer armed) and feeds what comes back (a
model's reply, a call's outcome, a timer) into :func:`on` again.

A turn, in order (each arrow is a message):

1. :class:`Start`: the user's message is stored with ``turn_started`` and the
   turn row marked running, in one write, before the model is asked; the
   wall-clock deadline is armed. With a memory brief the interpreter answers
   :class:`Brief` with :class:`Briefed`; with the framework seed, find_tools
   runs on the message first (:class:`Dispatch` in slot :data:`SEED`).
2. A model step (:func:`_step`): guards checked, the request built (system
   prompt, history fitted to the model's window, the channel's tools plus what
   find_tools injected), and :class:`Ask` emitted; or, when the history no
   longer fits and summaries are kept, :class:`Compact` first.
3. :class:`Replied`: no tool calls, the answer and ``turn_finished(final)`` in
   one write (an empty or unfit answer gets one nudge first). Tool calls: the
   assistant message stored, each call dispatched at once; each outcome comes
   back as :class:`CallDone`. When all are in, the results are stored in call
   order and step 2 runs again.
4. Any time: :class:`Cancel`, a permission request or its settlement, a
   background result (held while a call or the model is outstanding), another
   user message (queued, or cancelling the turn when the client asks).
5. The turn ends (:func:`_finish`): every call left without a result gets an
   error result, so the history stays valid for every provider; then the next
   queued message starts, or the idle timer is armed.

A message carrying a generation (``gen``) from an older step or turn is
dropped in one place (:func:`on`), never in a handler.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal, NamedTuple, Protocol, TypeVar

import msgspec

from chalie.calls.dispatch import envelope_name
from chalie.conversation import act, answers, background, compaction
from chalie.conversation.channels import Channel
from chalie.conversation.store import Batch, TurnUpdate
from chalie.process.config import ModelConfig
from chalie.providers import rescue
from chalie.providers.types import ChatMessage, ModelRequest, ModelResponse, ProviderError
from chalie.wire.events import (
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
from chalie.wire.messages import Busy, ToolCall, ToolOutcome, TurnContext
from chalie.wire.principals import Principal

CANCELLED_LINE: Final = "The turn was cancelled."
STOPPED_LINE: Final = "The conversation was stopped during the turn."
QUEUE_FULL_LINE: Final = "Too many messages are waiting; this one was not run."
# A call that ended with one of these was refused by a person or the gate: the turn
# does not learn from the tool (the user did not want it).
DENIED_CODES: Final = frozenset({"permission-denied", "approval-expired"})
# Tool calls one model response may start; the rest get an error result.
MAX_CALLS_PER_STEP: Final = 32
# Calls whose repetition is not an answer already in hand (they change what is callable).
META_TOOLS: Final = frozenset({"find_tools", "find_skills"})
# The characters of the person's message a framework seed searches with (one query entry).
SEED_CHARS: Final = 200
# The dispatch slot of the framework seed's find_tools (a step's calls use 0, 1, ...).
SEED: Final = -1
# Background results remembered as delivered (a bound; past it the set starts again).
MAX_DELIVERED: Final = 10_000

E = TypeVar("E", PermissionRequest, BackgroundResult)


class Now(NamedTuple):
    """The caller's clock: ``wall`` for events and the prompt's date, ``mono`` for guards."""

    wall: float
    mono: float


class Catalogue(Protocol):
    """What a turn reads about tools (reads only, never blocking)."""

    def descriptors(self, names: tuple[str, ...], allow_async: bool) -> list[dict[str, Any]]:
        """The model-facing descriptors of the tools named that exist."""

    def injected(self, turn_id: str) -> frozenset[str]:
        """What find_tools injected into a turn."""

    def scoped(self, channel: str) -> tuple[str, ...]:
        """The remote (MCP) tools scoped to a channel: offered there like its pins."""

    def summary(self, tool: str, arguments: dict[str, Any]) -> str:
        """The tooltip shown while a call runs (the model's act_summary or the framework's)."""


# -- messages in ------------------------------------------------------------------------


class Start(msgspec.Struct, frozen=True, kw_only=True):
    """Run (or queue) one user message as a turn (chalie.wire.actor_messages.StartTurn, its
    future aside)."""

    turn_id: str
    client_msg_id: str
    text: str
    busy: Busy = "queue"
    human_present: bool = False
    park_asks: bool = False


class Resume(msgspec.Struct, frozen=True):
    """The state was just loaded: start the first queued turn, or wait idle."""


class Delta(msgspec.Struct, frozen=True):
    """Streamed text of the model's answer (joined per window by the interpreter)."""

    gen: int
    text: str


class Retrying(msgspec.Struct, frozen=True):
    """The model request failed and is tried again (shown to the user)."""

    gen: int
    attempt: int
    error: ProviderError
    delay: float


class Replied(msgspec.Struct, frozen=True):
    """The model's answer; ``tail`` is streamed text not yet sent as a delta."""

    gen: int
    response: ModelResponse
    tail: str = ""


class ModelFailed(msgspec.Struct, frozen=True):
    gen: int
    error: ProviderError


class CallDone(msgspec.Struct, frozen=True):
    """The outcome of the call dispatched in ``slot`` (:data:`SEED`: the framework seed)."""

    gen: int
    slot: int
    outcome: ToolOutcome


class Briefed(msgspec.Struct, frozen=True):
    """The answer to :class:`Brief`: what memory holds that bears on the message."""

    gen: int
    text: str


class Compacted(msgspec.Struct, frozen=True):
    """The model's summary of the turns that no longer fit (None: it could not write one)."""

    gen: int
    upto: int
    text: str | None
    tokens: int


class Deadline(msgspec.Struct, frozen=True):
    gen: int


class IdleCheck(msgspec.Struct, frozen=True):
    gen: int


class Evict(msgspec.Struct, frozen=True):
    """The parent is over its limit of live actors: say so now if nothing runs."""


class Cancel(msgspec.Struct, frozen=True):
    """End the running turn (``cancelled``), or the actor's stop (``interrupted``)."""

    reason: Literal["cancelled", "interrupted"] = "cancelled"


class AskHeard(msgspec.Struct, frozen=True):
    """A permission request of this conversation, from the PolicyActor."""

    request: PermissionRequest


class AskSettled(msgspec.Struct, frozen=True):
    """How a permission request ended."""

    request_id: str
    answer: str


class Background(msgspec.Struct, frozen=True):
    """The final envelope of one of this conversation's background calls."""

    result: BackgroundResult


Message = (
    Start
    | Resume
    | Delta
    | Retrying
    | Replied
    | ModelFailed
    | CallDone
    | Briefed
    | Compacted
    | Deadline
    | IdleCheck
    | Evict
    | Cancel
    | AskHeard
    | AskSettled
    | Background
)

# -- effects out ------------------------------------------------------------------------


class Write(msgspec.Struct, frozen=True):
    """Store one batch, all or nothing."""

    batch: Batch


class Publish(msgspec.Struct, frozen=True):
    events: list[ConversationEvent]


class Ask(msgspec.Struct, frozen=True, kw_only=True):
    """Ask the model; its deltas, retries and reply come back as messages of ``gen``.

    ``names`` are the tools offered (the answer check's reading); ``check`` holds the
    stream until its start reads as an answer; ``offered`` (None: off) are the names a
    call written as text is read back for."""

    gen: int
    model: str
    request: ModelRequest
    names: tuple[str, ...]
    check: bool
    offered: frozenset[str] | None


class Compact(msgspec.Struct, frozen=True):
    """Ask for a summary of the first ``upto`` messages; answered by :class:`Compacted`."""

    gen: int
    model: str
    request: ModelRequest
    upto: int


class KeepSummary(msgspec.Struct, frozen=True):
    summary: compaction.Summary
    at: float


class CancelModel(msgspec.Struct, frozen=True):
    """Drop the outstanding model request (closes its stream)."""


class Dispatch(msgspec.Struct, frozen=True):
    """Run a call through the dispatcher; its outcome comes back as :class:`CallDone`."""

    gen: int
    slot: int
    call: ToolCall


class CancelCalls(msgspec.Struct, frozen=True):
    turn_id: str


class Brief(msgspec.Struct, frozen=True):
    """Read what memory holds that bears on ``text``; answered by :class:`Briefed` at once."""

    gen: int
    context: TurnContext
    text: str


Timer = Literal["deadline", "idle"]


class Arm(msgspec.Struct, frozen=True):
    """Deliver ``message`` to :func:`on` after ``delay`` seconds (one timer of each kind)."""

    timer: Timer
    delay: float
    message: Deadline | IdleCheck


class Disarm(msgspec.Struct, frozen=True):
    timer: Timer


class Ack(msgspec.Struct, frozen=True):
    """These outbox rows are now in the history."""

    ids: list[int]


class FollowUp(msgspec.Struct, frozen=True):
    """A background result came while no turn ran: start a turn that tells the person."""

    result: BackgroundResult


class Taken(msgspec.Struct, frozen=True):
    """The sender of ``turn_id`` may stop waiting: it started, or waits queued."""

    turn_id: str
    queued: bool


class Idle(msgspec.Struct, frozen=True):
    """Nothing runs and nothing waits: tell the parent."""


class Ended(msgspec.Struct, frozen=True, kw_only=True):
    """A turn ended: release its injections, learn what it used, log one line."""

    turn_id: str
    reason: FinishReason
    used: frozenset[str]  # tools it used with success and no denial (an answered turn only)
    codes: list[str]
    steps: int
    started: float  # monotonic


Effect = (
    Write
    | Publish
    | Ask
    | Compact
    | KeepSummary
    | CancelModel
    | Dispatch
    | CancelCalls
    | Brief
    | Arm
    | Disarm
    | Ack
    | FollowUp
    | Taken
    | Idle
    | Ended
)

# -- the state --------------------------------------------------------------------------


class Call(msgspec.Struct, kw_only=True):
    """One tool call of the current step."""

    index: int
    call_id: str
    tool: str
    result: str | None = None
    key: str = ""  # act.call_key: a later identical call gets this one's result


class Turn(msgspec.Struct, kw_only=True):
    """The running turn."""

    turn_id: str
    client_msg_id: str
    start_idx: int
    guards: act.Guards
    notes: list[str] = msgspec.field(default_factory=list)
    calls: list[Call] = msgspec.field(default_factory=list)
    waiting: bool = False  # a model request (or summary) is outstanding
    requests: dict[str, str] = msgspec.field(default_factory=dict)  # pending request -> tool
    succeeded: set[str] = msgspec.field(default_factory=set)  # tools called with success
    compacted: bool = False  # this turn already asked for a summary
    denied: set[str] = msgspec.field(default_factory=set)  # tools the user (or gate) denied
    human_present: bool = False  # a person answers this turn's asks (Start)
    done: dict[str, tuple[str, str]] = msgspec.field(default_factory=dict)  # key -> tool, result
    last_ok: tuple[str, str] | None = None  # the latest successful call: tool, envelope
    codes: list[str] = msgspec.field(default_factory=list)  # "tool:code" of each call
    nudge: str = ""  # a one-off note after the history in the next request (never stored)
    nudged: bool = False  # the empty-answer nudge was spent
    hold_next: bool = False  # the next step is held to a step object (after an unfit text)
    no_tools: bool = False  # the next request goes without tools (the model must answer)
    model_notes: set[str] = msgspec.field(default_factory=set)  # error lines for the model
    park_asks: bool = False  # its unanswerable asks wait for the owner (Start)
    answer_due: bool = False  # a tool succeeded: the next request asks for the answer
    brief: str = ""  # the memories that bear on the message, before it in every request


class Conversation(msgspec.Struct, kw_only=True):
    """One conversation's state: its settings, its history in memory, its turn and queue.

    :func:`on` updates it in place and returns it (the interpreter owns the only copy).
    """

    conversation_id: str
    channel: Channel
    config: ModelConfig
    tools: Catalogue
    zone: str = "UTC"
    idle_stop: float = 600.0
    max_queued: int = 16
    summaries: bool = False  # summaries of compacted histories are kept
    parent_call: str = ""  # a delegate conversation's parent call (chalie.calls.delegate)
    principal: Principal | None = None  # whose conversation (None: the owner's)
    messages: list[ChatMessage] = msgspec.field(default_factory=list)
    sizes: list[int] = msgspec.field(default_factory=list)  # act.message_tokens, counted once
    summary: compaction.Summary | None = None
    seq: int = 0
    gen: int = 0
    turn: Turn | None = None
    queue: list[Start] = msgspec.field(default_factory=list)
    # Turns loaded from storage as queued: their Start (sent by the parent right after
    # the actor started) may arrive after they ran.
    from_storage: set[str] = msgspec.field(default_factory=set)
    # Background results waiting for the tool step, with their outbox ids.
    held: list[tuple[ChatMessage, int]] = msgspec.field(default_factory=list)
    delivered: set[str] = msgspec.field(default_factory=set)


def opened(
    conversation_id: str,
    *,
    channel: Channel,
    config: ModelConfig,
    tools: Catalogue,
    messages: list[ChatMessage],
    seq: int,
    queued: Sequence[Start] = (),
    **settings: Any,
) -> Conversation:
    """The state of a conversation loaded from storage (then :class:`Resume` it)."""
    state = Conversation(
        conversation_id=conversation_id,
        channel=channel,
        config=config,
        tools=tools,
        messages=messages,
        sizes=[act.message_tokens(m) for m in messages],
        seq=seq,
        queue=list(queued),
        from_storage={s.turn_id for s in queued},
        delivered={m.call_id for m in messages if m.role == "background"},
        **settings,
    )
    return state


# -- the transition table ----------------------------------------------------------------

_Handler = Callable[["_Ctx", Any], None]


class _Ctx:
    """One call of :func:`on`: the state, the clock and the effects so far."""

    __slots__ = ("now", "out", "s")

    def __init__(self, state: Conversation, now: Now) -> None:
        self.s = state
        self.now = now
        self.out: list[Effect] = []

    # events
    def event(self, cls: type[ConversationEvent], **fields: Any) -> ConversationEvent:
        self.s.seq += 1
        return cls(
            conversation_id=self.s.conversation_id, seq=self.s.seq, ts=self.now.wall, **fields
        )

    def record(self, made: E, **fields: Any) -> E:
        """A value its owner made unnumbered (a request, a result), as this log's next event."""
        self.s.seq += 1
        return msgspec.structs.replace(made, seq=self.s.seq, ts=self.now.wall, **fields)

    def finished(
        self, turn: Turn, call_id: str, tool: str, status: str, code: str | None
    ) -> ConversationEvent:
        """The tool_finished event of one of the turn's calls."""
        return self.event(
            ToolFinished,
            turn_id=turn.turn_id,
            call_id=call_id,
            tool=tool[:128],
            status=status,
            code=code,
        )

    def batch(self, **fields: Any) -> Batch:
        return Batch(self.s.conversation_id, **fields)

    def append(self, batch: Batch, turn_id: str, message: ChatMessage) -> None:
        s = self.s
        batch.messages.append((len(s.messages), turn_id, message))
        s.messages.append(message)
        s.sizes.append(act.message_tokens(message))

    def write(self, batch: Batch) -> None:
        self.out.append(Write(batch))

    def publish(self, events: list[ConversationEvent]) -> None:
        self.out.append(Publish(events))

    def emit(self, cls: type[ConversationEvent], **fields: Any) -> None:
        """One event on its own: stored, then published."""
        event = self.event(cls, **fields)
        self.write(self.batch(events=[event]))
        self.publish([event])

    def ack_held(self) -> None:
        ids = [outbox_id for _, outbox_id in self.s.held if outbox_id]
        self.s.held.clear()
        if ids:
            self.out.append(Ack(ids))


def on(state: Conversation, message: Message, now: Now) -> tuple[Conversation, list[Effect]]:
    """The state after ``message`` and what must happen, in order."""
    ctx = _Ctx(state, now)
    gen = getattr(message, "gen", None)
    if gen is not None and (gen != state.gen or (state.turn is None and type(message) in _TURN)):
        return state, ctx.out  # from an older step or turn
    _HANDLERS[type(message)](ctx, message)
    return state, ctx.out


def aid(config: ModelConfig, setting: str) -> bool:
    """Whether a small-model aid set to ``setting`` ("auto" or "off") is on for this model
    (auto: on the wires local models speak, chalie.providers.rescue)."""
    return rescue.enabled(setting, config.provider)  # type: ignore[arg-type]


def channel_tools(state: Conversation) -> tuple[str, ...]:
    """The channel's own tools: its pins and the remote tools scoped to it."""
    channel = state.channel
    return tuple(dict.fromkeys((*channel.tools(), *state.tools.scoped(channel.name))))


def tool_names(state: Conversation, turn: Turn) -> tuple[str, ...]:
    injected = sorted(state.tools.injected(turn.turn_id))
    return tuple(dict.fromkeys((*channel_tools(state), *injected)))


def context(state: Conversation, turn: Turn, **extra: Any) -> TurnContext:
    """Who the turn's calls are made for: its conversation, channel, principal."""
    channel = state.channel
    fields: dict[str, Any] = {
        "conversation_id": state.conversation_id,
        "turn_id": turn.turn_id,
        "channel": channel.policy_channel,
        "human_present": channel.human_present or turn.human_present,
        "park_asks": turn.park_asks,
        "allow_async": channel.async_offered,
        "injected": channel_tools(state),
        "scope": "restricted",
        "initiator": "model",
        "parent_call": state.parent_call,
        "principal": state.principal,
    }
    return TurnContext(**{**fields, **extra})


# -- starting a turn ----------------------------------------------------------------------


def _on_start(ctx: _Ctx, start: Start) -> None:
    queued = _start_or_queue(ctx, start)
    ctx.out.append(Taken(start.turn_id, queued))


def _start_or_queue(ctx: _Ctx, start: Start) -> bool:
    """Start the turn or queue it; True when it waits behind another."""
    s = ctx.s
    turn = s.turn
    if turn is not None and turn.turn_id == start.turn_id:
        # Loaded from storage as queued when the actor started: the send's per-turn
        # facts still apply (before the model's first answer, which comes later).
        turn.human_present = start.human_present
        turn.park_asks = start.park_asks
        return False
    for i, queued in enumerate(s.queue):
        if queued.turn_id == start.turn_id:
            s.queue[i] = start
            return True
    if start.turn_id in s.from_storage:
        # Loaded from storage and already run (the model answered before this message
        # came): running it again would repeat the user's message.
        s.from_storage.discard(start.turn_id)
        return False
    if turn is None:
        _start(ctx, start)
        return False
    if start.busy == "cancel":
        _finish(ctx, "cancelled", CANCELLED_LINE)
        if s.turn is None:
            _start(ctx, start)
            return False
    if len(s.queue) >= s.max_queued:
        event = ctx.event(
            TurnFinished, turn_id=start.turn_id, reason="cancelled", text=QUEUE_FULL_LINE
        )
        ctx.write(
            ctx.batch(
                events=[event],
                turn=TurnUpdate(
                    start.turn_id, state="done", reason="cancelled", notes=["queue-full"]
                ),
            )
        )
        ctx.publish([event])
        return False
    s.queue.append(start)
    return True


def _start(ctx: _Ctx, start: Start) -> None:
    s = ctx.s
    ctx.out.append(Taken(start.turn_id, False))  # the sender need not wait for more
    channel = s.channel
    s.gen += 1
    turn = Turn(
        turn_id=start.turn_id,
        client_msg_id=start.client_msg_id,
        start_idx=len(s.messages),
        guards=act.Guards(channel, started=ctx.now.mono),
        human_present=start.human_present,
        park_asks=start.park_asks,
    )
    s.turn = turn
    batch = ctx.batch(turn=TurnUpdate(start.turn_id, state="running"))
    ctx.append(batch, start.turn_id, ChatMessage(role="user", text=start.text))
    batch.events.append(
        ctx.event(
            TurnStarted, turn_id=start.turn_id, client_msg_id=start.client_msg_id, text=start.text
        )
    )
    ctx.write(batch)
    ctx.publish(batch.events)
    ctx.out.append(Arm("deadline", channel.wall_clock, Deadline(s.gen)))
    if channel.human_present and s.config.memory_brief == "on":
        ctx.out.append(Brief(s.gen, context(s, turn), start.text))  # answered by Briefed
        return
    _seed_or_step(ctx, start.text)


def _on_briefed(ctx: _Ctx, message: Briefed) -> None:
    turn = ctx.s.turn
    assert turn is not None
    turn.brief = message.text
    _seed_or_step(ctx, ctx.s.messages[turn.start_idx].text)


def _seed_or_step(ctx: _Ctx, text: str) -> None:
    s = ctx.s
    turn = s.turn
    assert turn is not None
    if s.channel.find_tools and aid(s.config, s.config.seed_tools):
        # The framework seed: find_tools on the person's message, through the dispatcher,
        # so a tool that clearly fits is offered in the first request.
        query = " ".join(text.split())[:SEED_CHARS]
        call = ToolCall(
            call_id=f"seed_{uuid.uuid4().hex[:24]}",
            tool="find_tools",
            arguments={"query": [query]},
            context=context(s, turn, initiator="framework", seed=True),
        )
        ctx.out.append(Dispatch(s.gen, SEED, call))
        return
    _step(ctx)


# -- a model step -------------------------------------------------------------------------


def with_brief(
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


def _step(ctx: _Ctx) -> None:
    s = ctx.s
    turn = s.turn
    channel = s.channel
    assert turn is not None
    if s.held:
        batch = ctx.batch()
        for message, _ in s.held:
            ctx.append(batch, turn.turn_id, message)
        ctx.write(batch)
        ctx.ack_held()
    stop = turn.guards.before_step(ctx.now.mono)
    if stop is not None:
        _finish(ctx, stop, turn.guards.line(stop))
        return
    cfg = s.config
    names = tool_names(s, turn)
    tools = tuple(s.tools.descriptors(names, channel.async_offered))
    if turn.no_tools:
        turn.no_tools = False
        tools = ()
    system = act.with_today(channel.prompt(), s.zone, ctx.now.wall)
    budget = (
        cfg.context_window
        - cfg.max_output_tokens
        - act.estimate_tokens(system)
        - act.tools_tokens(tools)
    )
    view, sizes, offset = compaction.with_summary(s.messages, s.sizes, s.summary)
    fitted = act.fit_context(view, turn.start_idx - offset, max(budget, 0), sizes)
    dropped = len(view) - len(fitted.messages)
    if dropped > 0 and s.summaries and not turn.compacted:
        turn.compacted = True
        turn.waiting = True
        request = compaction.summary_request(view[:dropped])
        ctx.out.append(Compact(s.gen, channel.model, request, offset + dropped))
        return
    for note in fitted.notes:
        if note not in turn.notes:
            turn.notes.append(note)
    messages = tuple(fitted.messages)
    if turn.brief:
        messages = with_brief(messages, s.messages[turn.start_idx], turn.brief)
    # A step is held to a step object (structured steps) only when discovery offered a
    # tool in this turn: there the real 1.5B model narrated calls. Without one (chit-chat,
    # general knowledge) it was held to pick a "reply" it rarely chose, and called
    # find_skills or memory instead of answering; in words it answered.
    free = not set(names) - set(channel.tools())
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
            and aid(cfg, cfg.answer_check)
        ):
            noted = f"{last.text}\n{answers.ANSWER_NOTE}"
            messages = (*messages[:-1], msgspec.structs.replace(last, text=noted))
            # The answer after a success: free text (held to an object, the real model
            # called the tool again or stored the result in memory instead of answering).
            free = True
    if turn.hold_next:
        turn.hold_next = False
        free = False
    if turn.nudge:  # a one-off note for this request only: never stored
        messages = (*messages, ChatMessage(role="user", text=turn.nudge))
        turn.nudge = ""
    request = ModelRequest(
        system=system,
        messages=messages,
        tools=tools,
        max_tokens=cfg.max_output_tokens,
        free=free,
    )
    turn.waiting = True
    ctx.out.append(
        Ask(
            gen=s.gen,
            model=channel.model,
            request=request,
            names=names,
            check=aid(cfg, cfg.answer_check),
            # Calls written as text are read back only where tools were offered.
            offered=(
                frozenset(names)
                if tools and rescue.enabled(cfg.tool_call_rescue, cfg.provider)
                else None
            ),
        )
    )


def _on_compacted(ctx: _Ctx, message: Compacted) -> None:
    s = ctx.s
    turn = s.turn
    assert turn is not None
    turn.waiting = False
    turn.guards.tokens += message.tokens
    if message.text and s.summaries:
        s.summary = compaction.Summary(message.upto, message.text)
        ctx.out.append(KeepSummary(s.summary, ctx.now.wall))
        turn.notes.append(f"context: {message.upto} earlier message(s) summarised")
    _step(ctx)


def _on_delta(ctx: _Ctx, message: Delta) -> None:
    turn = ctx.s.turn
    assert turn is not None
    ctx.emit(TextDelta, turn_id=turn.turn_id, text=message.text)


def _on_retrying(ctx: _Ctx, message: Retrying) -> None:
    turn = ctx.s.turn
    assert turn is not None
    ctx.emit(
        ErrorEvent,
        turn_id=turn.turn_id,
        code="model-retry",
        message=(
            f"{message.error.message}; retrying in {message.delay:.1f} s "
            f"(attempt {message.attempt})"
        ),
    )


def _on_model_failed(ctx: _Ctx, message: ModelFailed) -> None:
    turn = ctx.s.turn
    assert turn is not None
    turn.waiting = False
    err = message.error
    ctx.emit(ErrorEvent, turn_id=turn.turn_id, code=err.code, message=err.message)
    _finish(ctx, "model-error", f"The model could not answer: {err.message}")


def _on_replied(ctx: _Ctx, message: Replied) -> None:
    s = ctx.s
    turn = s.turn
    assert turn is not None
    response = message.response
    turn.waiting = False
    turn.guards.steps += 1
    turn.guards.tokens += response.usage.total or (act.estimate_tokens(response.text) + 1)
    batch = ctx.batch(
        turn=TurnUpdate(turn.turn_id, steps=turn.guards.steps, tokens=turn.guards.tokens)
    )
    if message.tail:  # the step's last words: stored and published with the answer
        batch.events.append(ctx.event(TextDelta, turn_id=turn.turn_id, text=message.tail))
    unfit: answers.Unfit = ""
    if not response.tool_calls and aid(s.config, s.config.answer_check):
        unfit = answers.unfit(response.text, tool_names(s, turn))
    if not response.tool_calls and (
        not response.text.strip() or act.recites_a_note(response.text, turn.model_notes) or unfit
    ):
        # An empty answer, a hint meant for the model recited, or text that is no
        # answer (markup, a schema, a call described): one nudge, then the turn ends
        # saying so (never "final"), with the result in hand if there is one.
        if turn.nudged:
            line = act.EMPTY_LINE
            if unfit and turn.last_ok is not None:
                line = f"{line} {act.result_for_user(*turn.last_ok)}"
            _finish(ctx, "empty-answer", line, batch)
            return
        turn.nudged = True
        turn.nudge = answers.retry_note(unfit) if unfit else act.EMPTY_NUDGE
        # The retry after a call described or markup is held to a step object where
        # steps can be: told not to describe the call, the 1.5B model described it again
        # in free text (4 of 4 seen); held, it made the call it had described.
        turn.hold_next = bool(unfit)
        if unfit:
            turn.notes.append(f"answer refused: {unfit}")
        ctx.write(batch)
        ctx.publish(batch.events)
        _step(ctx)
        return
    assistant = ChatMessage(role="assistant", text=response.text, tool_calls=response.tool_calls)
    ctx.append(batch, turn.turn_id, assistant)
    if not response.tool_calls:
        _finish(ctx, "final", response.text, batch)  # the answer and the end: one write
        return
    _calls(ctx, response, batch)


def _calls(ctx: _Ctx, response: ModelResponse, batch: Batch) -> None:
    """The step's tool calls: recorded, refused, answered from earlier, or dispatched."""
    s = ctx.s
    turn = s.turn
    assert turn is not None
    repeat = False
    to_run: list[Dispatch] = []
    call_context = context(s, turn)
    turn.calls = []
    for index, part in enumerate(response.tool_calls):
        call = Call(index=index, call_id=part.id, tool=part.name, key=act.call_key(part))
        turn.calls.append(call)
        if index >= MAX_CALLS_PER_STEP:
            call.result = act.closed_call(
                part.name,
                "overloaded",
                f"Only {MAX_CALLS_PER_STEP} tool calls run per step; this one did not.",
            )
            continue
        summary = s.tools.summary(part.name, part.arguments or {})[:200]
        batch.events.append(
            ctx.event(
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
            if s.config.answer_nudge == "auto" and aid(s.config, "auto"):
                turn.no_tools = True
            batch.events.append(ctx.finished(turn, part.id, part.name, "success", "repeated"))
            continue
        arguments, bare = act.loose_arguments(part)
        if arguments is None and bare is None:
            call.result = act.malformed_arguments(part)
            turn.codes.append(f"{envelope_name(part.name)}:invalid-param")
            batch.events.append(ctx.finished(turn, part.id, part.name, "error", "invalid-param"))
            continue
        tool_call = ToolCall(
            call_id=part.id,
            tool=part.name,
            arguments=arguments or {},
            context=call_context,
            bare=bare,
        )
        to_run.append(Dispatch(s.gen, index, tool_call))
    ctx.write(batch)
    if repeat:
        ctx.publish(batch.events)
        line = turn.guards.line("guard-repeat")
        if turn.last_ok is not None:  # the user gets the result the model had in hand
            line = f"{line} {act.result_for_user(*turn.last_ok)}"
        _finish(ctx, "guard-repeat", line)
        return
    ctx.out.extend(to_run)
    ctx.publish(batch.events)  # stored before the calls start, shown after they left
    if not any(c.result is None for c in turn.calls):
        _next_step(ctx, ctx.batch())


# -- tool results -------------------------------------------------------------------------


def _on_call_done(ctx: _Ctx, message: CallDone) -> None:
    turn = ctx.s.turn
    assert turn is not None
    outcome = message.outcome
    if message.slot == SEED:  # the seed's injections are in place: ask the model
        turn.codes.append(f"seed:{outcome.code or outcome.status}")
        _step(ctx)
        return
    if message.slot >= len(turn.calls) or turn.calls[message.slot].result is not None:
        return
    call = turn.calls[message.slot]
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
    events = [ctx.finished(turn, call.call_id, call.tool, outcome.status, outcome.code)]
    rich = getattr(outcome, "rich", None)
    if isinstance(rich, dict):
        events.append(
            ctx.event(
                RichPayload,
                turn_id=turn.turn_id,
                call_id=call.call_id,
                tool=call.tool,
                payload=rich,
            )
        )
    batch = ctx.batch(events=events)
    if any(c.result is None for c in turn.calls):
        ctx.write(batch)
        ctx.publish(events)
        return
    _next_step(ctx, batch)  # the last result: its events and all results in one write


def _next_step(ctx: _Ctx, batch: Batch) -> None:
    """Store every result of the step in call order, then ask the model again."""
    turn = ctx.s.turn
    assert turn is not None
    for call in turn.calls:
        ctx.append(
            batch,
            turn.turn_id,
            ChatMessage(role="tool", call_id=call.call_id, tool=call.tool, text=call.result or ""),
        )
    turn.calls = []
    ctx.write(batch)
    ctx.publish(batch.events)
    _step(ctx)


# -- mid-turn arrivals --------------------------------------------------------------------


def _on_ask_heard(ctx: _Ctx, message: AskHeard) -> None:
    turn = ctx.s.turn
    if turn is not None:
        turn.requests[message.request.request_id] = message.request.tool
    event = ctx.record(message.request, turn_id=turn.turn_id if turn is not None else "")
    ctx.write(ctx.batch(events=[event]))
    ctx.publish([event])


def _on_ask_settled(ctx: _Ctx, message: AskSettled) -> None:
    turn = ctx.s.turn
    if turn is None or turn.requests.pop(message.request_id, None) is None:
        return  # not this turn's, or withdrawn with its turn
    ctx.emit(PermissionSettled, request_id=message.request_id, answer=message.answer)


def _on_background(ctx: _Ctx, message: Background) -> None:
    s = ctx.s
    result = message.result
    if result.call_id in s.delivered:
        if result.outbox_id:
            ctx.out.append(Ack([result.outbox_id]))
        return
    s.delivered.add(result.call_id)
    if len(s.delivered) > MAX_DELIVERED:
        s.delivered.clear()
    held = ChatMessage(
        role="background", call_id=result.call_id, tool=result.tool, text=result.envelope
    )
    # The rich payload and the outbox row are the delivery's, not the log's.
    event = ctx.record(result, rich=None, outbox_id=0)
    turn = s.turn
    if turn is not None and (turn.calls or turn.waiting):
        # Between a tool call and its result no message may stand: the model
        # sees it at its next step.
        s.held.append((held, result.outbox_id))
        ctx.write(ctx.batch(events=[event]))
    else:
        batch = ctx.batch(events=[event])
        ctx.append(batch, turn.turn_id if turn else "", held)
        ctx.write(batch)
        if result.outbox_id:
            ctx.out.append(Ack([result.outbox_id]))
    ctx.publish([event])
    if turn is None and background.starts_turn(result):
        ctx.out.append(FollowUp(result))


def _on_cancel(ctx: _Ctx, message: Cancel) -> None:
    line = CANCELLED_LINE if message.reason == "cancelled" else STOPPED_LINE
    _finish(ctx, message.reason, line)


def _on_deadline(ctx: _Ctx, _message: Deadline) -> None:
    turn = ctx.s.turn
    assert turn is not None
    _finish(ctx, "guard-time", turn.guards.line("guard-time"))


# -- the end of a turn --------------------------------------------------------------------


def _finish(ctx: _Ctx, reason: FinishReason, text: str, prior: Batch | None = None) -> None:
    """End the turn; ``prior`` (not yet written) is stored in the same write."""
    s = ctx.s
    turn = s.turn
    if turn is None:
        return
    s.gen += 1
    s.turn = None
    if turn.waiting:
        ctx.out.append(CancelModel())  # closes the HTTP stream
    ctx.out.append(Disarm("deadline"))
    open_calls = [c for c in turn.calls if c.result is None]
    if open_calls or reason in ("cancelled", "interrupted"):
        ctx.out.append(CancelCalls(turn.turn_id))
    batch = ctx.batch(
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
        ctx.append(
            batch,
            turn.turn_id,
            ChatMessage(role="tool", call_id=call.call_id, tool=call.tool, text=result),
        )
    for held, _ in s.held:
        ctx.append(batch, turn.turn_id, held)
    for request_id in sorted(turn.requests):
        batch.events.append(ctx.event(PermissionSettled, request_id=request_id, answer="withdrawn"))
    batch.events.append(ctx.event(TurnFinished, turn_id=turn.turn_id, reason=reason, text=text))
    ctx.write(batch)
    ctx.ack_held()
    ctx.publish(batch.events)
    ctx.out.append(
        Ended(
            turn_id=turn.turn_id,
            reason=reason,
            # only an answered turn teaches
            used=frozenset(turn.succeeded - turn.denied) if reason == "final" else frozenset(),
            codes=list(turn.codes),
            steps=turn.guards.steps,
            started=turn.guards.started,
        )
    )
    _next_or_idle(ctx)


def _next_or_idle(ctx: _Ctx) -> None:
    s = ctx.s
    if s.queue:
        _start(ctx, s.queue.pop(0))
        return
    ctx.out.append(Arm("idle", s.idle_stop, IdleCheck(s.gen)))


def _on_resume(ctx: _Ctx, _message: Resume) -> None:
    _next_or_idle(ctx)


def _on_idle(ctx: _Ctx, _message: IdleCheck | Evict) -> None:
    if ctx.s.turn is None and not ctx.s.queue:
        ctx.out.append(Idle())


_HANDLERS: Final[dict[type, _Handler]] = {
    Start: _on_start,
    Resume: _on_resume,
    Delta: _on_delta,
    Retrying: _on_retrying,
    Replied: _on_replied,
    ModelFailed: _on_model_failed,
    CallDone: _on_call_done,
    Briefed: _on_briefed,
    Compacted: _on_compacted,
    Deadline: _on_deadline,
    IdleCheck: _on_idle,
    Evict: _on_idle,
    Cancel: _on_cancel,
    AskHeard: _on_ask_heard,
    AskSettled: _on_ask_settled,
    Background: _on_background,
}
# Messages of a turn: dropped when their turn has ended (a generation is checked for all).
_TURN: Final = frozenset(
    {Delta, Retrying, Replied, ModelFailed, CallDone, Briefed, Compacted, Deadline}
)

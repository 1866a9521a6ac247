"""In-process mail: the messages one actor or component sends another, never on a wire.

They carry futures and results, so they are dataclasses, not the msgspec wire types of
:mod:`chalie.wire.messages`. Every message one actor sends another is here; an actor's
messages to itself (its own timers, its event-loop callbacks) stay private in its module.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from chalie.result import ToolResult
from chalie.wire.events import BackgroundResult
from chalie.wire.messages import Accepted, Busy, GateDecision, ToolCall, ToolOutcome, TurnContext

# -- DispatcherActor --


@dataclass(frozen=True, slots=True)
class Dispatch:
    """DispatcherActor: run one call; its outcome completes ``reply``."""

    call: ToolCall
    reply: Future[ToolOutcome]


@dataclass(frozen=True, slots=True)
class GateAnswered:
    """DispatcherActor: the PolicyActor's answer for call ``seq`` (a completed future)."""

    seq: int
    answer: Future[GateDecision]


@dataclass(frozen=True, slots=True)
class Suggested:
    """DispatcherActor: the unknown-tool answer for a call, with the closest tools found."""

    call: ToolCall
    reply: Future[ToolOutcome]
    result: ToolResult


@dataclass(frozen=True, slots=True)
class Executed:
    """DispatcherActor: an executor's result for call ``seq``."""

    seq: int
    result: ToolResult


@dataclass(frozen=True, slots=True)
class Deadline:
    """DispatcherActor: call ``seq`` ran out of time."""

    seq: int


@dataclass(frozen=True, slots=True)
class FlushTrail:
    """DispatcherActor: write the trail's deferred ``running`` rows now."""


@dataclass(frozen=True, slots=True)
class SettleTrail:
    """DispatcherActor: read the store's answers to the trail rows sent (PostgreSQL)."""


@dataclass(frozen=True, slots=True)
class RecordAsk:
    """DispatcherActor: put a connected server's request (sampling, elicitation), as the gate
    decided it, on the action trail: one whole row, through the trail's one writer."""

    call_id: str
    context: TurnContext
    permission: str
    params: dict[str, Any]
    act_summary: str
    decision: str
    decided_by: str
    code: str | None


@dataclass(slots=True)
class GateAsk:
    """PolicyActor: decide one call (sent with ``tell``); the decision completes ``reply``."""

    call_id: str
    context: TurnContext
    tool: str
    permission: str
    internal: bool
    act_summary: str
    params_redacted: dict[str, Any]
    reply: Future[GateDecision] = field(default_factory=Future)
    # What the call reaches beyond Chalie (chalie.ability.Ability.reach); set: sensitive.
    reach: str | None = None
    # What the person asked should know besides the parameters, in words
    # (chalie.calls.dispatch.notes).
    notes: tuple[str, ...] = ()
    # The call as it can be run again after a restart (chalie.gate.approvals.ResumableCall,
    # encoded), or None when it cannot be stored (its arguments hold a redacted secret).
    resume: bytes | None = None
    # The digest of the call (chalie.gate.approvals.call_binding): an answer stored for later is
    # taken only by a call with the same one. None: no stored answer is ever taken by it.
    binding: str | None = None
    # A form the owner fills (a server's elicitation, chalie.gate.forms): the JSON schema of the
    # answer, which the decision carries (GateDecision.content); a request with a form is
    # always put to a person, even where the setting is allow, and expires after
    # ``expires_in`` seconds (None: the gate's approval expiry).
    form: dict[str, Any] | None = None
    expires_in: float | None = None


@dataclass(frozen=True, slots=True)
class Withdraw:
    """PolicyActor: the caller no longer wants the decision (its call was cancelled)."""

    reply: Future[GateDecision]


@dataclass(frozen=True, slots=True)
class ViewRequest:
    """PolicyActor: ask (with ``ask``) for the actor's lock-free PolicyView."""


@dataclass(frozen=True, slots=True)
class ExpireRequest:
    """PolicyActor: a permission request's time is up."""

    request_id: str


@dataclass(frozen=True, slots=True)
class EndpointDied:
    """A serving actor's server stopped serving unexpectedly (the actor fails, is restarted)."""

    what: str
    error: str


@dataclass(frozen=True, slots=True)
class ChildExit:
    """Supervisor: a child (by id and incarnation urn) exited, normally or not."""

    child_id: str
    urn: str
    abnormal: bool
    error: str


@dataclass(frozen=True, slots=True)
class RestartChild:
    """Supervisor: restart the child now, unless it exited again since (token)."""

    child_id: str
    token: int


@dataclass(frozen=True, slots=True)
class WatchChildren:
    """Supervisor: look for plain-actor children that died without a report."""


@dataclass(frozen=True, slots=True)
class DismissedStopped:
    """Supervisor: a dismissed child (by urn) has stopped, or its shutdown time is up."""

    urn: str


# -- TurnActor and its parent, the Conversations actor --


@dataclass(frozen=True, slots=True)
class StartTurn:
    """TurnActor: run (or queue) one user message as a turn."""

    turn_id: str
    client_msg_id: str
    text: str
    busy: Busy = "queue"
    send_no: int = 0
    # This turn only: a person answers its asks (SendMessage.human_present).
    human_present: bool = False
    # This turn only: an ask nobody can answer now is parked for the owner (SendMessage).
    park_asks: bool = False
    # The client's answer (chalie.conversation.submission), given as soon as the actor has
    # decided (queued or not), before the turn's first step: the sender waits for this.
    taken: Future[Accepted] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class CancelRunningTurn:
    """TurnActor (asked): cancel the running turn; answers whether one ran."""


@dataclass(frozen=True, slots=True)
class EvictIfIdle:
    """TurnActor, from its parent over its limit of live actors: report idle now if nothing runs."""


@dataclass(frozen=True, slots=True)
class HandOff:
    """TurnActor, from its parent: another daemon on the shared store waits for this
    conversation; report idle as soon as no turn runs or waits (now, or when they end)."""


@dataclass(frozen=True, slots=True)
class DeliverBackground:
    """TurnActor: the final envelope of one of its conversation's background calls."""

    result: BackgroundResult


@dataclass(frozen=True, slots=True)
class TurnActorIdle:
    """Conversations, from a TurnActor: nothing ran for idle_stop seconds, no send in flight."""

    conversation_id: str
    urn: str
    send_no: int


# -- McpConnectionActor --


@dataclass(frozen=True, slots=True)
class ProbeConnection:
    """McpConnectionActor: a call met a broken connection (generation ``gen``); probe it now."""

    gen: int


@dataclass(frozen=True, slots=True)
class RefreshServer:
    """McpConnectionActor: re-read the server's rows from the store (an approve) and re-sync."""

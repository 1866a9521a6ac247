"""The events of a conversation: numbered per conversation from 1, gapless, stored, published.

msgspec Structs tagged by ``type``. Every event carries ``conversation_id``,
``seq`` and ``ts``. A client subscribes to the live bus first, then backfills
with ``events(after_seq)`` and drops duplicates by ``seq``.

Two of them are made before they are numbered, by their one owner, and published
unnumbered (``seq`` 0, :attr:`ConversationEvent.recorded` false): a
:class:`PermissionRequest` (the PolicyActor, when the gate asks) and a
:class:`BackgroundResult` (the dispatcher or the scheduler, when an async call
ends). The conversation's TurnActor records the same value in the log, numbered;
clients see only the recorded one (the conversations port drops the others).
"""

from __future__ import annotations

from typing import Any, Final, Literal, get_args

import msgspec

from chalie.wire.messages import Channel, Settlement, Status
from chalie.wire.principals import Principal

FinishReason = Literal[
    "final",
    "cancelled",
    "interrupted",
    "guard-steps",
    "guard-repeat",
    "guard-time",
    "guard-tokens",
    "model-error",
    "empty-answer",
]
FINISH_REASONS: Final[tuple[str, ...]] = get_args(FinishReason)


class ConversationEvent(
    msgspec.Struct, tag_field="type", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    conversation_id: str
    seq: int
    ts: float

    @property
    def recorded(self) -> bool:
        """Whether this is the conversation's log's (numbered), not yet to be recorded."""
        return self.seq > 0


class TurnStarted(ConversationEvent, tag="turn_started", frozen=True, kw_only=True):
    turn_id: str
    client_msg_id: str
    text: str


class TextDelta(ConversationEvent, tag="text_delta", frozen=True, kw_only=True):
    turn_id: str
    text: str


class ToolStarted(ConversationEvent, tag="tool_started", frozen=True, kw_only=True):
    turn_id: str
    call_id: str
    tool: str
    act_summary: str


class ToolFinished(ConversationEvent, tag="tool_finished", frozen=True, kw_only=True):
    turn_id: str
    call_id: str
    tool: str
    status: str
    code: str | None = None


class PermissionRequest(ConversationEvent, tag="permission_request", frozen=True, kw_only=True):
    """A call waits for a person's answer: raised by the PolicyActor, its one owner.

    The gate makes it unnumbered, without a turn; the TurnActor whose call raised it
    records it with its ``seq``, ``ts`` and ``turn_id``.
    """

    seq: int = 0
    ts: float = 0.0
    request_id: str
    turn_id: str = ""
    tool: str
    permission: str
    act_summary: str = ""
    params: dict[str, Any] = {}
    expires_at: float
    # The policy channel of the call (None only in events recorded before it was kept).
    channel: Channel | None = None
    # Whose turn raised it (never the one to answer it, unless the owner) and through what.
    principal: Principal | None = None
    asked_by: str = ""
    # A sensitive call's reach (the command line it runs...), and the prompt a person reads.
    reach: str | None = None
    # What the person should know besides the parameters, in words: how often a reminder
    # fires, that the conversation had read untrusted content first (chalie.calls.dispatch.notes).
    notes: tuple[str, ...] = ()
    prompt: str = ""
    # A form to fill (a remote server's elicitation): the JSON schema of the answer; the
    # client answers allow_once with ``content`` (the fields), or deny to decline.
    form: dict[str, Any] | None = None


class PermissionSettled(ConversationEvent, tag="permission_settled", frozen=True, kw_only=True):
    """How the request ended, as its owner (the PolicyActor) said: a person's answer
    (wherever given: a chat client, ``chalie policy answer``), expired, or withdrawn (the
    call or its turn ended first)."""

    request_id: str
    answer: Settlement


class BackgroundResult(ConversationEvent, tag="background_result", frozen=True, kw_only=True):
    """The final envelope of an async call, delivered to its conversation later.

    Made unnumbered when the call ends (kept in the outbox until its conversation has
    it: ``outbox_id``); the conversation's TurnActor records it (without ``rich`` or
    ``outbox_id``, which are for the delivery only).
    """

    seq: int = 0
    ts: float = 0.0
    call_id: str
    tool: str
    status: Status
    envelope: str
    code: str | None = None
    rich: dict[str, Any] | None = None
    # The outbox row holding it until a consumer acknowledges it (0: not stored).
    outbox_id: int = 0


class RichPayload(ConversationEvent, tag="rich_payload", frozen=True, kw_only=True):
    turn_id: str
    call_id: str
    tool: str
    payload: dict[str, Any]


class TurnFinished(ConversationEvent, tag="turn_finished", frozen=True, kw_only=True):
    turn_id: str
    reason: FinishReason
    text: str


class ErrorEvent(ConversationEvent, tag="error", frozen=True, kw_only=True):
    turn_id: str | None
    code: str
    message: str


class ToolProgress(
    msgspec.Struct, tag_field="type", tag="tool_progress", frozen=True, kw_only=True
):
    """A running call's progress (a remote tool's ``notifications/progress``).

    Live only: not stored, not numbered (``seq`` 0), so a client that resumes does
    not replay it; a newer one supersedes an older one for the same ``call_id``.
    """

    conversation_id: str
    turn_id: str
    call_id: str
    tool: str
    progress: float
    total: float | None = None
    message: str | None = None
    seq: int = 0
    ts: float = 0.0


Event = (
    TurnStarted
    | TextDelta
    | ToolStarted
    | ToolFinished
    | PermissionRequest
    | PermissionSettled
    | BackgroundResult
    | RichPayload
    | TurnFinished
    | ErrorEvent
)

_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(Event)


def encode_event(event: ConversationEvent) -> bytes:
    return _encoder.encode(event)


def decode_event(data: bytes | str) -> Event:
    return _decoder.decode(data)

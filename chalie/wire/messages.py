"""Every message actors and processes exchange: msgspec Structs in tagged unions.

One module, so the wire format is read in one place. Encoded as msgpack on
ZeroMQ; the ``kind`` field is the tag. Decoding validates: a malformed message
raises :class:`msgspec.ValidationError` naming the field (``at `$.channel```).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, get_args

import msgspec

from chalie.wire.principals import Principal

# An id a client names in a request (a call, a request, a conversation, a token): one
# shape for the control socket, the chat protocol and the Brain's API.
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")]

# -- the enumerations, each defined once (the tuples are derived, never restated) --

Channel = Literal["chat", "subconscious", "external_agent"]
CHANNELS: Final[tuple[str, ...]] = get_args(Channel)
# An operator's setting for a (channel, permission).
Decision = Literal["allow", "ask", "deny", "internal"]
DECISIONS: Final[tuple[str, ...]] = get_args(Decision)
# A human's answer to a permission request.
Answer = Literal["allow_once", "allow_always", "deny"]
ANSWERS: Final[tuple[str, ...]] = get_args(Answer)
# How a person types each answer: a word (``chalie policy answer ID once``) and its letter.
ANSWER_WORDS: Final[dict[str, Answer]] = {
    "once": "allow_once",
    "always": "allow_always",
    "deny": "deny",
}
ANSWER_LETTERS: Final[dict[str, Answer]] = {
    word[0]: answer for word, answer in ANSWER_WORDS.items()
}
# How a permission request ended: a person's answer, its time ran out, or its call
# went away first (cancelled, its turn ended, the gate stopped).
Settlement = Literal["allow_once", "allow_always", "deny", "expired", "withdrawn"]
SETTLEMENTS: Final[tuple[str, ...]] = get_args(Settlement)
# Who decided a gate question.
DecidedBy = Literal["policy", "human", "internal", "fail-closed"]
# How a call ended.
Status = Literal["success", "error"]
# A trail row's status: a call's status, or still running, or cut off by a stop.
TrailStatus = Literal["running", "success", "error", "interrupted"]
TRAIL_STATUSES: Final[tuple[str, ...]] = get_args(TrailStatus)
# The words ``chalie trail --status`` takes: each status, and the outcomes people name
# that are stored as a status and a code (a cancelled call: status error, code cancelled).
TRAIL_FILTERS: Final[dict[str, tuple[TrailStatus, str | None]]] = {
    **{status: (status, None) for status in get_args(TrailStatus)},
    "cancelled": ("error", "cancelled"),
}
# Where an ability runs: the key of the executor table (actors/executors).
Isolation = Literal["immediate", "inline", "process", "mcp"]
ISOLATIONS: Final[tuple[str, ...]] = get_args(Isolation)
# Whether a turn may call only the tools it was given, or any registered tool.
ToolScope = Literal["restricted", "unrestricted"]
TOOL_SCOPES: Final[tuple[str, ...]] = get_args(ToolScope)
# What a message sent while a turn runs does: wait its turn, or cancel the running one.
Busy = Literal["queue", "cancel"]
# Who made the call: the model (must say act_summary), or the runtime/operator.
Initiator = Literal["model", "framework"]
INITIATORS: Final[tuple[str, ...]] = get_args(Initiator)


class Message(
    msgspec.Struct, tag_field="kind", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """Base of every message."""


class TurnContext(Message, tag="turn", kw_only=True, frozen=True):
    """Who is calling: the conversation, the channel, and whether a human can answer.

    Only the runtime builds a TurnContext (the model controls the arguments,
    never the context). ``scope`` says which tools the turn may call:
    ``restricted`` (the default: fail closed) allows only ``injected`` (the
    channel's pins) and what find_tools injected into this turn;
    ``unrestricted`` (the CLI, operator calls) allows every registered tool.
    ``initiator`` says who made the call: a ``model`` call must carry an
    ``act_summary``; a ``framework`` call (operator, scheduler) may omit it and
    the runtime supplies one.
    """

    conversation_id: str
    turn_id: str
    channel: Channel = "chat"
    human_present: bool = True
    allow_async: bool = False
    # Tool names pinned to this turn's channel.
    injected: tuple[str, ...] = ()
    scope: ToolScope = "restricted"
    initiator: Initiator = "model"
    # A delegate's sub-turn (chalie.calls.delegate): the id of the call that started it.
    parent_call: str = ""
    # Whose turn this is (chalie.wire.principals); None: the owner's (a local or operator call).
    principal: Principal | None = None
    # An ask nobody can answer now is parked for the owner instead of denied (park_asks).
    park_asks: bool = False
    # A call re-dispatched on the owner's answer to this stored request (chalie.gate.approvals):
    # the gate allows it once if that request was allowed, and asks again otherwise.
    resumes: str = ""
    # A framework seed (find_tools run on the person's message before the first request):
    # only the tools that clearly fit are injected (chalie.discovery.cascade.confident).
    seed: bool = False


class ToolCall(Message, tag="tool_call", kw_only=True, frozen=True):
    """A request to run one tool: the model's raw arguments, framework fields included."""

    call_id: str
    tool: str
    arguments: dict[str, Any] = {}
    context: TurnContext
    # Arguments the model sent as a bare JSON value (``["clock"]``), not an object: the
    # dispatcher reads them as the tool's one required parameter or refuses them.
    bare: Any = None


class ToolOutcome(Message, tag="tool_outcome", kw_only=True, frozen=True):
    """The answer to a ToolCall: the envelope for the model, the rich payload for the client."""

    call_id: str
    tool: str
    status: Status
    envelope: str
    code: str | None = None
    background: bool = False
    # The ability's rich-media payload (ToolResult.rich), never shown to the model.
    rich: dict[str, Any] | None = None


class CancelTurn(Message, tag="cancel_turn", kw_only=True, frozen=True):
    turn_id: str


class PermissionAnswer(Message, tag="permission_answer", kw_only=True, frozen=True):
    request_id: str
    answer: Answer


class RequestSettled(Message, tag="request_settled", kw_only=True, frozen=True):
    """Published by the PolicyActor, the request's one owner, when a request ends."""

    request_id: str
    conversation_id: str
    answer: Settlement


# -- worker protocol (broker <-> ability worker processes) -------------------


class WorkerReady(Message, tag="worker_ready", kw_only=True, frozen=True):
    worker_id: str
    pid: int
    proof: str = (
        ""  # chalie.workers.broker_state.worker_proof: the worker was started by this broker
    )


class Heartbeat(Message, tag="heartbeat", kw_only=True, frozen=True):
    worker_id: str = ""
    busy: int = 0


class WorkerJob(Message, tag="worker_job", kw_only=True, frozen=True):
    """Run one ability in a worker. ``ability`` is an import reference, never code."""

    job_id: str
    ability: str  # "package.module:QualName" or "/path/file.py:QualName"
    params: dict[str, Any] = {}
    context: TurnContext | None = None
    deadline: float = 0.0


class WorkerResult(Message, tag="worker_result", kw_only=True, frozen=True):
    job_id: str
    status: Status
    body: str = ""
    rich: dict[str, Any] | None = None
    meta: dict[str, str | int | float | bool | None] = {}
    code: str | None = None
    hint: str | None = None
    valid_values: list[str | int | float | bool | None] | None = None


class WorkerCancel(Message, tag="worker_cancel", kw_only=True, frozen=True):
    job_id: str


class WorkerShutdown(Message, tag="worker_shutdown", kw_only=True, frozen=True):
    pass


# -- control endpoint (CLI <-> daemon) ----------------------------------------


class ControlRequest(Message, tag="control_request", kw_only=True, frozen=True):
    command: str
    args: dict[str, Any] = {}


class ControlReply(Message, tag="control_reply", kw_only=True, frozen=True):
    ok: bool
    data: Any = None
    error: str | None = None


# -- In-process answers (not on a wire): the gate's decision, a submitted message's --


class GateDecision(msgspec.Struct, frozen=True, kw_only=True):
    """The gate's answer for one call. ``code``/``message``/``hint`` describe a deny."""

    decision: Literal["allow", "deny"]
    decided_by: DecidedBy
    code: str | None = None
    message: str = ""
    hint: str = ""
    # The owner's answer to a form (GateAsk.form), checked against it; only when allowed.
    content: dict[str, Any] | None = None

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"


class Accepted(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to a SendMessage (chalie.conversation.requests): the message is stored.

    ``queued``: it waits behind a running turn; ``duplicate``: the client id was seen
    before and nothing new started (``turn_id`` is the earlier turn).
    """

    conversation_id: str
    turn_id: str | None
    queued: bool
    duplicate: bool


AnyMessage = (
    TurnContext
    | ToolCall
    | ToolOutcome
    | CancelTurn
    | PermissionAnswer
    | RequestSettled
    | WorkerReady
    | Heartbeat
    | WorkerJob
    | WorkerResult
    | WorkerCancel
    | WorkerShutdown
    | ControlRequest
    | ControlReply
)

_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(AnyMessage)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> AnyMessage:
    """Decode one message; raises msgspec.ValidationError / DecodeError naming the problem."""
    return _decoder.decode(data)

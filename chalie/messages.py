"""Every message actors and processes exchange: msgspec Structs in tagged unions.

One module, so the wire format is read in one place. Encoded as msgpack on
ZeroMQ; the ``kind`` field is the tag. Decoding validates: a malformed message
raises :class:`msgspec.ValidationError` naming the field (``at `$.channel```).
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

Channel = Literal["chat", "subconscious", "external_agent"]
CHANNELS: Final[tuple[str, ...]] = ("chat", "subconscious", "external_agent")
Decision = Literal["allow", "ask", "deny", "internal"]
Status = Literal["success", "error"]


class Message(
    msgspec.Struct, tag_field="kind", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """Base of every message."""


class TurnContext(Message, tag="turn", kw_only=True, frozen=True):
    """Who is calling: the conversation, the channel, and whether a human can answer."""

    conversation_id: str
    turn_id: str
    channel: Channel = "chat"
    human_present: bool = True
    allow_async: bool = False
    # Tool names injected into this turn (by find_tools or the channel's pins).
    injected: tuple[str, ...] = ()


class ToolCall(Message, tag="tool_call", kw_only=True, frozen=True):
    """A request to run one tool: the model's raw arguments, framework fields included."""

    call_id: str
    tool: str
    arguments: dict[str, Any] = {}
    context: TurnContext


class ToolOutcome(Message, tag="tool_outcome", kw_only=True, frozen=True):
    """The answer to a ToolCall: the rendered envelope and what the trail records."""

    call_id: str
    tool: str
    status: Status
    envelope: str
    code: str | None = None
    background: bool = False


class CancelTurn(Message, tag="cancel_turn", kw_only=True, frozen=True):
    turn_id: str


class PermissionRequest(Message, tag="permission_request", kw_only=True, frozen=True):
    """Sent to the conversation's human when the gate says ask."""

    request_id: str
    conversation_id: str
    channel: Channel
    permission: str
    tool: str
    act_summary: str = ""
    params: dict[str, Any] = {}
    expires_at: float


class PermissionAnswer(Message, tag="permission_answer", kw_only=True, frozen=True):
    request_id: str
    answer: Literal["allow_once", "allow_always", "deny"]


class BackgroundResult(Message, tag="background_result", kw_only=True, frozen=True):
    """The final envelope of an async call, delivered to its conversation later."""

    call_id: str
    conversation_id: str
    tool: str
    envelope: str
    status: Status


# -- worker protocol (broker <-> ability worker processes) -------------------


class WorkerReady(Message, tag="worker_ready", kw_only=True, frozen=True):
    worker_id: str
    pid: int
    proof: str = ""  # chalie.workers.worker_proof: the worker was started by this broker


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


AnyMessage = (
    TurnContext
    | ToolCall
    | ToolOutcome
    | CancelTurn
    | PermissionRequest
    | PermissionAnswer
    | BackgroundResult
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

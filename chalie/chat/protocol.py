"""The chat protocol: every frame a client and the daemon exchange, as msgspec types.

One protocol behind two transports: JSON text frames on the WebSocket,
msgpack frames on ZeroMQ. Every frame is an object tagged by ``type``.

Client → daemon (:data:`ClientMessage`): ``open`` (subscribe to a
conversation and receive every event after ``after_seq``), ``send`` (a user
message; ``client_msg_id`` makes a retried send land once), ``cancel`` (the
running turn), ``answer`` (a permission request, from any client), ``close``
(stop receiving a conversation's events), ``ping``, ``bye`` (the client leaves;
its ``pong`` is the last frame it gets). Each may carry an ``id``
that the daemon echoes in its reply.

Daemon → client: the conversation events (``chalie.wire.events``,
numbered per conversation by ``seq``), and the replies below
(:data:`ServerReply`); ``rejected`` is the error frame, with a stable code
from :mod:`chalie.errors`.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from chalie.wire.frames import TooDeep, check_depth, check_json_depth
from chalie.wire.messages import Answer as PermissionAnswer
from chalie.wire.messages import Busy, Id

PROTOCOL_VERSION: Final = 1
MAX_TEXT_CHARS: Final = 100_000

# The conversation id shape the conversations service accepts.
ConversationId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
]
ChannelName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_-]*$")
]
Text = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT_CHARS)]
Seq = Annotated[int, msgspec.Meta(ge=0, le=2**53)]  # SQLite holds at most 2**63 - 1

# Error codes a ``rejected`` frame carries (each listed in chalie/errors.py).
MALFORMED: Final = "malformed-frame"
OVERSIZED: Final = "oversized-frame"
UNKNOWN_KIND: Final = "unknown-kind"
INVALID: Final = "invalid-frame"
UNAUTHORIZED: Final = "unauthorized"
FORBIDDEN: Final = "forbidden"
ORIGIN_REFUSED: Final = "origin-not-allowed"
TOO_MANY: Final = "too-many-clients"
TOO_MANY_OPEN: Final = "too-many-conversations"
SLOW_CLIENT: Final = "slow-client"
UNAVAILABLE: Final = "chat-unavailable"
INTERNAL: Final = "internal-error"


# -- client → daemon ------------------------------------------------------------------


class ClientFrame(
    msgspec.Struct, tag_field="type", kw_only=True, frozen=True, forbid_unknown_fields=True
):
    """Base of every client frame; ``id`` is echoed in the reply."""

    id: Id | None = None


class Open(ClientFrame, tag="open", kw_only=True, frozen=True):
    conversation_id: ConversationId
    after_seq: Seq = 0


class Send(ClientFrame, tag="send", kw_only=True, frozen=True):
    conversation_id: ConversationId | None = None  # None starts a new conversation
    channel: ChannelName = "chat"
    text: Text
    client_msg_id: Id
    busy: Busy = "queue"


class Cancel(ClientFrame, tag="cancel", kw_only=True, frozen=True):
    conversation_id: ConversationId


class Answer(ClientFrame, tag="answer", kw_only=True, frozen=True):
    request_id: Id
    answer: PermissionAnswer
    # A request with a form (a server's elicitation): the fields, checked against it.
    content: dict[str, Any] | None = None


class Close(ClientFrame, tag="close", kw_only=True, frozen=True):
    conversation_id: ConversationId


class Ping(ClientFrame, tag="ping", kw_only=True, frozen=True):
    pass


class Bye(ClientFrame, tag="bye", kw_only=True, frozen=True):
    """The client leaves: nothing more is sent to it, and it no longer counts as a person
    present (a ZeroMQ client has no connection whose end the daemon would see)."""


ClientMessage = Open | Send | Cancel | Answer | Close | Ping | Bye


class Authenticate(ClientFrame, tag="hello", kw_only=True, frozen=True):
    """A ZeroMQ client's optional first frame: the token it speaks for. Checked like the
    WebSocket's (an agent's token gets ``forbidden``); a client that sends none is the
    transport's owner (the 0600 ipc socket, an authorized CURVE key). Not a session frame."""

    token: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


KINDS: Final = ("open", "send", "cancel", "answer", "close", "ping", "bye")


# -- daemon → client (beside the conversation events) --------------------------------


class ServerFrame(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    id: str | None = None


class Hello(ServerFrame, tag="hello", kw_only=True, frozen=True):
    protocol: int = PROTOCOL_VERSION
    max_frame_bytes: int
    kinds: tuple[str, ...] = KINDS


class Opened(ServerFrame, tag="opened", kw_only=True, frozen=True):
    conversation_id: str
    last_seq: int  # every event up to here has been sent


class Accepted(ServerFrame, tag="accepted", kw_only=True, frozen=True):
    client_msg_id: str
    conversation_id: str
    turn_id: str | None
    queued: bool
    duplicate: bool


class Cancelled(ServerFrame, tag="cancelled", kw_only=True, frozen=True):
    conversation_id: str
    cancelled: bool


class Answered(ServerFrame, tag="answered", kw_only=True, frozen=True):
    request_id: str
    found: bool


class Closed(ServerFrame, tag="closed", kw_only=True, frozen=True):
    conversation_id: str


class Pong(ServerFrame, tag="pong", kw_only=True, frozen=True):
    pass


class Rejected(ServerFrame, tag="rejected", kw_only=True, frozen=True):
    """The error frame: a stable code and one line for a person."""

    code: str
    message: str


ServerReply = Hello | Opened | Accepted | Cancelled | Answered | Closed | Pong | Rejected


class _Peek(msgspec.Struct):
    type: Any = None
    id: Any = None


class FrameError(Exception):
    def __init__(self, rejected: Rejected) -> None:
        super().__init__(rejected.message)
        self.rejected = rejected


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


class Codec:
    """Decodes client frames and encodes daemon frames, as JSON or msgpack."""

    def __init__(self, fmt: Literal["json", "msgpack"], max_frame_bytes: int) -> None:
        self.format = fmt
        self.max_frame_bytes = max_frame_bytes
        if fmt == "json":
            self._decoder: Any = msgspec.json.Decoder(ClientMessage)
            self._peek: Any = msgspec.json.Decoder(_Peek)
            self._encoder: Any = msgspec.json.Encoder()
        else:
            self._decoder = msgspec.msgpack.Decoder(ClientMessage)
            self._peek = msgspec.msgpack.Decoder(_Peek)
            self._encoder = msgspec.msgpack.Encoder()

    def decode(self, frame: bytes | str) -> ClientMessage:
        """The client message in ``frame``; FrameError with the reply to send when it is bad."""
        size = len(frame.encode("utf-8", "surrogatepass") if isinstance(frame, str) else frame)
        if size > self.max_frame_bytes:
            raise FrameError(
                Rejected(
                    code=OVERSIZED, message=f"frame of {size} bytes exceeds {self.max_frame_bytes}"
                )
            )
        try:
            # The one depth rule (chalie.wire.frames) first: msgspec would recurse into the frame
            # and raise RecursionError, which ended the session.
            if self.format == "json":
                check_json_depth(frame)
            else:
                check_depth(frame if isinstance(frame, bytes) else frame.encode())
            message: ClientMessage = self._decoder.decode(frame)
            return message
        except TooDeep as exc:
            raise FrameError(Rejected(code=MALFORMED, message=_one_line(str(exc)))) from None
        except RecursionError:
            raise FrameError(Rejected(code=MALFORMED, message="the frame nests too deep")) from None
        except msgspec.ValidationError as exc:
            raise FrameError(self._classify(frame, exc)) from None
        except msgspec.DecodeError as exc:
            raise FrameError(
                Rejected(code=MALFORMED, message=_one_line(f"not a {self.format} object: {exc}"))
            ) from None

    def _classify(self, frame: bytes | str, exc: msgspec.ValidationError) -> Rejected:
        try:
            peek = self._peek.decode(frame)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return Rejected(code=MALFORMED, message=_one_line(f"a frame is an object: {exc}"))
        ref = peek.id if isinstance(peek.id, str) and len(peek.id) <= 128 else None
        if not isinstance(peek.type, str):
            return Rejected(id=ref, code=INVALID, message="a frame needs a string 'type'")
        if peek.type not in KINDS:
            return Rejected(
                id=ref,
                code=UNKNOWN_KIND,
                message=_one_line(f"unknown kind {peek.type[:40]!r}; known: {', '.join(KINDS)}"),
            )
        return Rejected(id=ref, code=INVALID, message=_one_line(f"{peek.type}: {exc}"))

    def encode(self, frame: msgspec.Struct) -> bytes:
        data: bytes = self._encoder.encode(frame)
        return data

"""How a message is submitted to a conversation: the pure steps of ``Conversations.submit``.

The Conversations actor sequences them
(:meth:`actors.conversation.conversations.Conversations.submit`),
doing the I/O between them (the store's reads and writes, the TurnActor's start):

1. :func:`chalie.conversation.requests.check_send`: a malformed, oversized or
   hostile message is refused before anything is read or stored.
2. :func:`place`: where it goes, given what is known of the conversation (its
   channel and owner, or nothing: a new one) and who sends it. A conversation of
   another principal is answered as one that does not exist; a conversation
   stays on its channel.
3. :func:`chalie.conversation.quota.check_room`: the disk and the sender's quota.
4. The message is stored; a client id seen before is answered at once by
   :func:`duplicate` and starts nothing.
5. :func:`start`: the TurnActor's message. Its ``taken`` future is the one answer
   the client gets; the TurnActor completes it as soon as it has decided (queued
   or not), before the turn's first step.
6. :func:`undecided`: the ask that carried the message failed (the TurnActor died
   with it in its inbox, or failed before it decided): the answer is that failure,
   unless the TurnActor had already decided. Both run on the TurnActor's thread, one
   after the other, so exactly one of them answers.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Final, Protocol

import msgspec

from chalie.conversation.requests import ConversationError, SendMessage
from chalie.wire.actor_messages import StartTurn
from chalie.wire.messages import Accepted
from chalie.wire.principals import LOCAL_OWNER, Principal, may_see

# A new conversation's title: the first words of its first message.
TITLE_CHARS: Final = 80


class Placement(msgspec.Struct, frozen=True):
    """Where a submitted message goes (step 2)."""

    conversation_id: str
    principal: Principal  # who sends it (the local owner when the message names nobody)
    new: bool  # the conversation is created with this message
    title: str  # a new conversation's title ('' for an existing one)
    owner_id: str  # a new conversation's owning principal id ('' for the owner's)


def sender(msg: SendMessage) -> Principal:
    """Who sends the message: its principal, or the local owner when it names nobody."""
    return msg.principal if msg.principal is not None else LOCAL_OWNER


def place(msg: SendMessage, cid: str, placed: tuple[str, str] | None) -> Placement:
    """Step 2: ``placed`` is the conversation's (channel, owner id), None when there is none.

    Raises ConversationError: another principal's conversation (``unknown-conversation``,
    the same answer as for an id that does not exist), another channel's
    (``invalid-message``).
    """
    who = sender(msg)
    if placed is None:
        title = " ".join(msg.text.split())[:TITLE_CHARS]
        return Placement(cid, who, True, title, "" if who.is_owner else who.id)
    channel, owner_id = placed
    if not may_see(who, owner_id):
        raise ConversationError("unknown-conversation", f"no conversation {cid!r}")
    if channel != msg.channel:
        raise ConversationError(
            "invalid-message",
            f"conversation {cid} is on channel {channel!r}, not {msg.channel[:64]!r}",
        )
    return Placement(cid, who, False, "", owner_id)


def incoming_bytes(msg: SendMessage) -> int:
    """What the message's text takes in storage (step 3's ``incoming``)."""
    return len(msg.text.encode("utf-8", "surrogatepass"))


def duplicate(cid: str, seen_turn_id: str | None) -> concurrent.futures.Future[Accepted]:
    """Step 4: a client id seen before; answered now, with the earlier turn."""
    out: concurrent.futures.Future[Accepted] = concurrent.futures.Future()
    out.set_result(
        Accepted(conversation_id=cid, turn_id=seen_turn_id, queued=False, duplicate=True)
    )
    return out


def start(
    msg: SendMessage, turn_id: str, client_msg_id: str, send_no: int
) -> tuple[StartTurn, concurrent.futures.Future[Accepted]]:
    """Step 5: the TurnActor's message and the one future that answers the client."""
    taken: concurrent.futures.Future[Accepted] = concurrent.futures.Future()
    message = StartTurn(
        turn_id,
        client_msg_id,
        msg.text,
        msg.busy,
        send_no,
        human_present=msg.human_present is True,
        park_asks=msg.park_asks is True,
        taken=taken,
    )
    return message, taken


def decided(cid: str, turn_id: str, queued: bool) -> Accepted:
    """What the TurnActor answers once it has decided (step 5)."""
    return Accepted(conversation_id=cid, turn_id=turn_id, queued=queued, duplicate=False)


class Answered(Protocol):
    """An answered ask (a pykka future): ``get`` returns its value or raises its failure."""

    def get(self, *, timeout: float | None = None) -> Any: ...


def undecided(taken: concurrent.futures.Future[Accepted], asked: Answered) -> None:
    """Step 6: the ask carrying the message ended; its failure answers an undecided start."""
    try:
        asked.get(timeout=0)
    except BaseException as exc:
        if not taken.done():
            taken.set_exception(exc)

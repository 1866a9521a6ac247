"""ActorConversations: the daemon's one adapter of the conversations port.

Every client of the conversations (the WebSocket and ZeroMQ chat bridges, the
inbound MCP server, the control commands behind ``chalie ask`` and ``chalie
conversations``) reaches the Conversations actor through this class
(:class:`chalie.conversation.port.ConversationsPort`), so a rule about who may
touch which conversation belongs here, once.

Async code never waits on a pykka future (DESIGN.md): each call is awaited with
:meth:`ChildRef.acall`, answered on the loop by a callback. The Conversations
actor answers ``send``, ``cancel``, ``answer`` and ``delete`` with a future that
another actor completes (the TurnActor, the PolicyActor), so it never blocks its
own mailbox on them; the loop awaits that future.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar

import pykka

from actors.child_ref import ChildRef, ChildUnavailable
from actors.conversation.conversations import Conversations
from chalie.conversation.port import Closeable, ConversationsUnavailable
from chalie.conversation.requests import ConversationError, SendMessage
from chalie.gate.policy import PolicyError
from chalie.wire.bus import HUMANS, EventBus
from chalie.wire.events import ConversationEvent, Event
from chalie.wire.messages import Accepted
from chalie.wire.principals import Principal

T = TypeVar("T")

CALL_TIMEOUT: Final = 10.0


class ActorConversations:
    """The conversations port over the Conversations actor and the event bus."""

    def __init__(
        self,
        conversations: ChildRef[Any],
        events: EventBus,
        *,
        timeout: float = CALL_TIMEOUT,
        backlog: Callable[[], Sequence[Any]] | None = None,
    ) -> None:
        """``backlog``: what a new subscriber to ``HUMANS`` gets first (the loop_in_human
        exchanges kept while no owner was connected, chalie.mcp_server.kept)."""
        self._child = conversations.within(timeout)
        self._events = events
        self._timeout = timeout
        self._backlog = backlog

    async def send(self, msg: SendMessage) -> Accepted:
        return await self._settled("send", self._child.acall(Conversations.submit, msg))

    async def cancel(self, conversation_id: str) -> bool:
        return await self._settled(
            "cancel", self._child.acall(Conversations.cancel, conversation_id)
        )

    async def answer(
        self, request_id: str, answer: str, by: Principal, content: Any = None
    ) -> bool:
        answered = self._child.acall(Conversations.answer, request_id, answer, by, content)
        return await self._settled("answer", answered)

    async def delete(self, conversation_id: str) -> bool:
        return await self._settled(
            "delete", self._child.acall(Conversations.delete, conversation_id)
        )

    async def events(self, conversation_id: str, after_seq: int, limit: int) -> Sequence[Event]:
        found: Sequence[Event] = await self._call(
            "events", self._child.acall(Conversations.events, conversation_id, after_seq, limit)
        )
        return found

    def subscribe(self, conversation_id: str, callback: Callable[[Any], None]) -> Closeable:
        """The conversation's live events; a request or a result its owner published
        before the TurnActor recorded it is left out (the client gets the record)."""

        def recorded(event: Any) -> None:
            if not isinstance(event, ConversationEvent) or event.recorded:
                callback(event)

        live = self._events.subscribe(conversation_id, recorded)
        if conversation_id == HUMANS and self._backlog is not None:
            for kept in self._backlog():
                callback(kept)
        return live

    # -- the answers ----------------------------------------------------------------------
    async def _settled(self, method: str, asked: Awaitable[concurrent.futures.Future[T]]) -> T:
        """The actor's answer is a future another actor completes: await both, on the loop."""
        later = await self._call(method, asked)
        return await self._call(method, _within(asyncio.wrap_future(later), self._timeout))

    async def _call(self, method: str, answer: Awaitable[T]) -> T:
        """The answer, or the port's errors: unavailable (retry later) or refused."""
        try:
            return await answer
        except ConversationError:
            raise
        except PolicyError as exc:  # the gate refused it (an answer from anyone but the owner)
            raise ConversationError(exc.code, str(exc)) from None
        except (ChildUnavailable, pykka.ActorDeadError) as exc:
            raise ConversationsUnavailable(f"the conversations are restarting ({exc})") from None
        except (TimeoutError, pykka.Timeout):
            raise ConversationsUnavailable(
                f"the conversations did not answer {method} in {self._timeout:g} s"
            ) from None


async def _within(waiting: Awaitable[T], timeout: float) -> T:
    async with asyncio.timeout(timeout):
        return await waiting

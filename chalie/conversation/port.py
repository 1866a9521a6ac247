"""The conversations port: the one way a client reaches the conversations.

The chat bridges, the inbound MCP server and the control commands (``chalie ask``,
``chalie conversations ...``) all use this protocol, and the daemon has one adapter
for it (``actors/conversation/port.py``, over the Conversations and Policy actors).
Every method is awaited on the daemon's event loop and never blocks it.

Who may touch which conversation is checked behind that one adapter: a message
carries its sender's principal (``SendMessage.principal``) and an answer its
answerer's, and the Conversations and Policy actors apply the rules of
:mod:`chalie.wire.principals` to every client alike.

Errors: :class:`~chalie.conversation.requests.ConversationError` when the
conversations refuse a request (its ``code`` is a stable error code), and
:class:`ConversationsUnavailable` when they did not answer (restarting, stopping,
overloaded: try again later).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from chalie.conversation.requests import SendMessage
from chalie.wire.events import Event
from chalie.wire.messages import Accepted
from chalie.wire.principals import Principal


class ConversationsUnavailable(RuntimeError):
    """The conversations did not answer (restarting, stopping, overloaded)."""


class Closeable(Protocol):
    def close(self) -> None: ...


class ConversationsPort(Protocol):
    """What every client may ask of the conversations, awaitable on the event loop."""

    async def send(self, msg: SendMessage) -> Accepted:
        """Store the message and start (or queue) its turn."""
        ...

    async def cancel(self, conversation_id: str) -> bool:
        """Cancel the conversation's running turn; False when none runs."""
        ...

    async def events(self, conversation_id: str, after_seq: int, limit: int) -> Sequence[Event]:
        """The stored events after ``after_seq``, at most ``limit``, in order."""
        ...

    async def answer(
        self, request_id: str, answer: str, by: Principal, content: Any = None
    ) -> bool:
        """``by``'s answer to a permission request; False when it is no longer pending.

        Only the owner answers (:func:`chalie.wire.principals.may_answer`): anyone else gets
        ConversationError ``forbidden`` and the request stays pending. A request with a
        form is answered with ``content`` (its fields, checked against the form).
        """
        ...

    def subscribe(self, conversation_id: str, callback: Callable[[Any], None]) -> Closeable:
        """Live events of one conversation (or of a bus key such as ``HUMANS``);
        ``callback`` runs on the publisher's thread. A request or a result its owner
        published before the conversation recorded it is left out: the record follows
        (:attr:`chalie.wire.events.ConversationEvent.recorded`)."""
        ...

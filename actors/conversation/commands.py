from __future__ import annotations

from typing import Any

import msgspec

from actors.child_ref import ChildRef
from actors.conversation.conversations import ASK_TIMEOUT, Conversations, new_id
from actors.conversation.port import ActorConversations
from actors.host import Host
from actors.process.control_commands import answer_errors
from chalie.conversation.follow import follow_turn
from chalie.conversation.port import ConversationsUnavailable
from chalie.conversation.requests import (
    AskArgs,
    ConversationArgs,
    ConversationError,
    ConversationsListArgs,
    SendMessage,
)
from chalie.process import control
from chalie.process.routing import Route
from chalie.wire.events import (
    ConversationEvent,
    TextDelta,
    ToolFinished,
    TurnStarted,
)
from chalie.wire.messages import ControlReply


class ConversationCommands:
    """The control socket's conversation commands: one routing-table row each.

    A handler runs on the control endpoint's handler thread; what it asks of the
    conversations goes through the conversations port (on the loop), as every
    client's does.
    """

    def __init__(self, host: Host) -> None:
        self._host = host
        self._port = ActorConversations(
            host.child("conversations", Conversations), host.events, timeout=ASK_TIMEOUT
        )

    def routes(self) -> list[Route[Any]]:
        rows: list[Route[Any]] = [
            Route("ask", AskArgs, self.ask),
            Route("conversations.list", ConversationsListArgs, self.list),
            Route("conversations.show", ConversationArgs, self.show),
            Route("conversations.delete", ConversationArgs, self.delete),
        ]
        return [answer_errors(_conversation_errors(row)) for row in rows]

    def _conversations(self) -> ChildRef[Conversations]:
        return self._host.child("conversations", Conversations).within(ASK_TIMEOUT)

    def list(self, args: ConversationsListArgs) -> ControlReply:
        rows = self._conversations().call(Conversations.list, args.limit)
        return control.success(msgspec.to_builtins(rows))

    def show(self, args: ConversationArgs) -> ControlReply:
        found = self._conversations().call(Conversations.show, args.conversation_id)
        if found is None:
            return control.failure(
                "unknown-conversation", f"no conversation {args.conversation_id!r}"
            )
        return control.success(msgspec.to_builtins(found))

    def delete(self, args: ConversationArgs) -> ControlReply:
        cid = args.conversation_id
        deleted = self._host.loop.submit(self._port.delete(cid)).result(ASK_TIMEOUT * 2)
        if not deleted:
            return control.failure("unknown-conversation", f"no conversation {cid!r}")
        return control.success({"conversation_id": cid, "deleted": True})

    def ask(self, args: AskArgs) -> ControlReply:
        """Run one turn without a human and wait for its end (this handler thread waits)."""
        channels = self._conversations().call(Conversations.channels)
        channel = channels.get(args.channel)
        if channel is None:
            return control.failure(
                "unknown-channel",
                f"no channel {args.channel!r}; known: {', '.join(sorted(channels))}",
            )
        if channel.human_present:
            return control.failure(
                "invalid-message",
                f"ask runs without a human, and channel {args.channel!r} expects one; "
                "use a channel such as subconscious",
            )
        cid = args.conversation_id or new_id("c")
        msg = SendMessage(
            conversation_id=cid,
            channel=args.channel,
            text=args.text,
            client_msg_id=new_id("ask"),
            origin="cli-ask",
        )
        seen = SeenSoFar()  # what the turn did before a timeout, for the reply
        following = self._host.loop.submit(
            follow_turn(self._port, msg, timeout=args.timeout, on_event=seen.add)
        )
        try:
            outcome = following.result(args.timeout + ASK_TIMEOUT)
        except TimeoutError:
            return control.failure(
                "tool-timeout",
                f"the turn did not finish within {args.timeout:g} s",
                conversation_id=cid,
                turn_id=seen.turn_id,
                text=seen.text(),
                tools=seen.tools,
            )
        return control.success(
            {
                "conversation_id": cid,
                "turn_id": outcome.accepted.turn_id,
                "reason": outcome.finished.reason,
                "text": outcome.finished.text,
                "tools": [
                    {"tool": t.tool, "status": t.status, "code": t.code} for t in outcome.tools
                ],
            }
        )


class SeenSoFar:
    """A turn's events as they come (on the loop), read once when the wait ends."""

    def __init__(self) -> None:
        self.turn_id: str | None = None
        self.parts: list[str] = []
        self.tools: list[dict[str, Any]] = []

    def add(self, event: ConversationEvent) -> None:
        if isinstance(event, TurnStarted):
            self.turn_id = event.turn_id
        elif isinstance(event, TextDelta):
            self.parts.append(event.text)
        elif isinstance(event, ToolFinished):
            self.tools.append({"tool": event.tool, "status": event.status, "code": event.code})

    def text(self) -> str:
        return "".join(self.parts)[-4000:]


def _conversation_errors(route: Route[Any]) -> Route[Any]:
    """A ConversationError from the actor becomes a reply with its code."""

    def run(args: Any) -> ControlReply:
        try:
            return route.handler(args)
        except ConversationError as exc:
            return control.failure(exc.code, exc.message)
        except ConversationsUnavailable as exc:
            return control.failure(control.UNAVAILABLE, str(exc))

    return Route(route.name, route.args, run)

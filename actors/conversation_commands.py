"""The control socket's conversation commands: ``chalie ask`` and ``chalie conversations ...``."""

from __future__ import annotations

import contextlib
import queue
import time
from typing import Any

import msgspec

from actors.child_ref import ChildRef
from actors.control_commands import answer_errors
from actors.conversations import ASK_TIMEOUT, Conversations, ConversationsHost, new_id
from chalie import control
from chalie.conversation.events import ToolFinished, TurnFinished
from chalie.conversation.requests import (
    AskArgs,
    ConversationArgs,
    ConversationError,
    ConversationsListArgs,
    SendMessage,
)
from chalie.messages import (
    ControlReply,
)
from chalie.routing import Route


class ConversationCommands:
    """The control socket's conversation commands: one routing-table row each."""

    def __init__(self, host: ConversationsHost) -> None:
        self._host = host

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
        if not self._conversations().call(Conversations.delete, cid):
            return control.failure("unknown-conversation", f"no conversation {cid!r}")
        return control.success({"conversation_id": cid, "deleted": True})

    def ask(self, args: AskArgs) -> ControlReply:
        """Run one turn without a human and wait for its end (this handler thread blocks)."""
        conversations = self._conversations()
        channels = conversations.call(Conversations.channels)
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
        finished: queue.SimpleQueue[TurnFinished] = queue.SimpleQueue()
        tools: list[dict[str, Any]] = []

        def on_event(event: Any) -> None:
            if isinstance(event, TurnFinished):
                finished.put(event)
            elif isinstance(event, ToolFinished):
                tools.append({"tool": event.tool, "status": event.status, "code": event.code})

        with self._host.events.subscribe(cid, on_event):
            accepted = conversations.call(
                Conversations.send,
                SendMessage(
                    conversation_id=cid,
                    channel=args.channel,
                    text=args.text,
                    client_msg_id=new_id("ask"),
                    origin="cli-ask",
                ),
            )
            deadline = time.monotonic() + args.timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    with contextlib.suppress(Exception):
                        conversations.call(Conversations.cancel, cid)
                    return control.failure(
                        "tool-timeout",
                        f"the turn did not finish within {args.timeout:g} s",
                        conversation_id=cid,
                    )
                try:
                    event = finished.get(timeout=min(left, 1.0))
                except queue.Empty:
                    continue
                if event.turn_id == accepted.turn_id:
                    break
        return control.success(
            {
                "conversation_id": cid,
                "turn_id": accepted.turn_id,
                "reason": event.reason,
                "text": event.text,
                "tools": tools,
            }
        )


def _conversation_errors(route: Route[Any]) -> Route[Any]:
    """A ConversationError from the actor becomes a reply with its code."""

    def run(args: Any) -> ControlReply:
        try:
            return route.handler(args)
        except ConversationError as exc:
            return control.failure(exc.code, exc.message)

    return Route(route.name, route.args, run)

"""The delegate port over the conversations port: run one sub-turn on a delegate channel.

:class:`DelegateRunner` is ``services.delegates`` in the daemon (chalie.calls.delegate
describes the contract). It runs on the thread of the delegate call (the
dispatcher's inline pool), never on an actor's, and hands the work to the
daemon's event loop: :func:`chalie.conversation.follow.follow_turn` over the
one conversations port (``ActorConversations``) sends the task to a new
conversation on the delegate channel (the path every turn takes; its origin
names the parent call) and follows that turn's events to its end. The call's
``cancelled`` event (the parent turn was cancelled, or the call timed out) is
looked at every :data:`POLL` seconds and cancels the sub-turn through the port.
The sub-turn's tool results come back as its events (``tool_finished``,
``rich_payload``): the sources are read from them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from typing import Any, Final

from actors.conversation.conversations import Conversations, new_id
from actors.conversation.port import ActorConversations
from actors.host import Host
from chalie.calls.delegate import DelegateError, DelegateRun, origin_for
from chalie.conversation.channels import resolve_channels
from chalie.conversation.follow import TurnOutcome, follow_turn
from chalie.conversation.port import ConversationsUnavailable
from chalie.conversation.requests import ConversationError, SendMessage
from chalie.wire.events import RichPayload, ToolFinished
from chalie.wire.messages import TurnContext

POLL: Final = 0.05  # how often the waiting call looks at its cancelled event
MARGIN: Final = 15.0  # seconds past the channel's wall clock before the wait gives up


class DelegateRunner:
    def __init__(self, host: Host, *, on_end: Callable[[str, str], object] | None = None) -> None:
        self._port = ActorConversations(host.child("conversations", Conversations), host.events)
        self._loop = host.loop
        self._channels = resolve_channels(host.config.channels)
        # Called with (channel, delegate turn id) when a sub-turn ends: the browser pool
        # closes that turn's page.
        self._on_end = on_end

    def run(
        self,
        channel: str,
        task: str,
        *,
        parent: TurnContext | None,
        parent_call: str,
        cancelled: threading.Event,
        timeout: float,
    ) -> DelegateRun:
        spec = self._channels.get(channel)
        if spec is None:
            raise DelegateError("delegate-failed", f"no delegate channel {channel!r}")
        limit = min(timeout, spec.wall_clock + MARGIN)
        cid = new_id("c")
        parent_conversation = parent.conversation_id if parent is not None else ""
        msg = SendMessage(
            conversation_id=cid,
            channel=channel,
            text=task,
            client_msg_id=new_id("dlg"),
            origin=origin_for(parent_call or parent_conversation),
            # The sub-turn runs as whoever asked for it (an agent's: its memory key, trail id).
            principal=parent.principal if parent is not None else None,
        )
        finished: list[ToolFinished] = []
        payloads: dict[str, dict[str, Any]] = {}
        turn: list[str] = []

        def on_event(event: Any) -> None:  # on the loop
            if not turn and isinstance(getattr(event, "turn_id", None), str):
                turn.append(event.turn_id)
            if isinstance(event, ToolFinished):
                finished.append(event)
            elif isinstance(event, RichPayload):
                payloads[event.call_id] = event.payload

        future = self._loop.submit(follow_turn(self._port, msg, timeout=limit, on_event=on_event))
        try:
            outcome = self._wait(future, cid, cancelled)
        finally:
            if self._on_end is not None and turn:
                with contextlib.suppress(Exception):
                    self._on_end(channel, turn[0])
        results = [
            {
                "tool": f.tool,
                "status": f.status,
                "code": f.code,
                "payload": payloads.get(f.call_id),
            }
            for f in finished
        ]
        return DelegateRun(
            conversation_id=cid,
            turn_id=outcome.accepted.turn_id or "",
            reason=outcome.finished.reason,
            text=outcome.finished.text,
            results=tuple(results),
        )

    def _wait(
        self,
        future: concurrent.futures.Future[TurnOutcome],
        cid: str,
        cancelled: threading.Event,
    ) -> TurnOutcome:
        while True:
            if cancelled.is_set():
                future.cancel()
                with contextlib.suppress(Exception):
                    self._loop.submit(self._port.cancel(cid)).result(10)
                raise DelegateError("cancelled", "the delegate was cancelled")
            try:
                return future.result(timeout=POLL)
            except concurrent.futures.TimeoutError:
                continue
            except TimeoutError:  # follow_turn's own limit: it cancelled the sub-turn
                raise DelegateError("tool-timeout", "the delegate did not finish in time") from None
            except ConversationError as exc:
                raise DelegateError("delegate-failed", exc.message) from None
            except ConversationsUnavailable as exc:
                raise DelegateError("delegate-failed", str(exc)) from None

"""The delegate port over the conversations: run one sub-turn on a delegate channel and wait.

:class:`DelegateRunner` is what ``services.extra["delegates"]`` holds in the
daemon (chalie.delegate describes the contract). It starts a new conversation
on the delegate channel through :meth:`Conversations.send`, the path every
turn takes, with the parent call in its origin; follows the conversation's
events on the bus until its turn finishes; cancels the turn if the calling
ability's ``cancelled`` event is set (the parent turn was cancelled) or the
time runs out; then reads the transcript back for the sources. It runs on
the thread of the delegate call (the dispatcher's inline pool), never on an
actor's.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Any, Final, Protocol

from actors.child_ref import ChildRef, ChildUnavailable
from actors.conversations import ASK_TIMEOUT, Conversations, new_id
from chalie.conversation.events import ToolFinished, TurnFinished
from chalie.conversation.requests import ConversationError, SendMessage
from chalie.delegate import DelegateError, DelegateRun, origin_for
from chalie.events import EventBus
from chalie.messages import TurnContext

POLL: Final = 0.05  # how often the waiting call looks at its cancelled event


class DelegateHost(Protocol):
    @property
    def events(self) -> EventBus: ...

    def child(self, child_id: str, kind: type[Conversations]) -> ChildRef[Conversations]: ...


class DelegateRunner:
    def __init__(self, host: DelegateHost, *, on_end: Any = None) -> None:
        self._host = host
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
        try:
            conversations = self._host.child("conversations", Conversations).within(ASK_TIMEOUT)
            known = conversations.call(Conversations.channels)
        except ChildUnavailable as exc:
            raise DelegateError(
                "delegate-failed", f"the conversations are unavailable: {exc}"
            ) from None
        spec = known.get(channel)
        if spec is None:
            raise DelegateError("delegate-failed", f"no delegate channel {channel!r}")
        limit = min(timeout, spec.wall_clock + 15.0)
        cid = new_id("c")
        finished: queue.SimpleQueue[TurnFinished] = queue.SimpleQueue()
        tools: list[dict[str, Any]] = []

        def on_event(event: Any) -> None:
            if isinstance(event, TurnFinished):
                finished.put(event)
            elif isinstance(event, ToolFinished):
                tools.append({"tool": event.tool, "status": event.status, "code": event.code})

        parent_conversation = parent.conversation_id if parent is not None else ""
        with self._host.events.subscribe(cid, on_event):
            try:
                accepted = conversations.call(
                    Conversations.send,
                    SendMessage(
                        conversation_id=cid,
                        channel=channel,
                        text=task,
                        client_msg_id=new_id("dlg"),
                        origin=origin_for(parent_call or parent_conversation),
                    ),
                )
            except ConversationError as exc:
                raise DelegateError("delegate-failed", exc.message) from None
            turn_id = accepted.turn_id or ""
            deadline = time.monotonic() + limit
            end: TurnFinished | None = None
            try:
                while end is None:
                    if cancelled.is_set() or time.monotonic() > deadline:
                        with contextlib.suppress(Exception):
                            conversations.call(Conversations.cancel, cid)
                        if cancelled.is_set():
                            raise DelegateError("cancelled", "the delegate was cancelled")
                        raise DelegateError(
                            "tool-timeout", f"the {channel} delegate did not finish in {limit:g} s"
                        )
                    try:
                        event = finished.get(timeout=POLL)
                    except queue.Empty:
                        continue
                    if event.turn_id == turn_id:
                        end = event
            finally:
                if self._on_end is not None:
                    with contextlib.suppress(Exception):
                        self._on_end(channel, turn_id)
        shown = conversations.call(Conversations.show, cid) or {}
        return DelegateRun(
            conversation_id=cid,
            turn_id=turn_id,
            reason=end.reason,
            text=end.text,
            messages=tuple(shown.get("messages", ())),
            tools=tuple(tools),
        )

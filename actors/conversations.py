"""Conversations: the supervisor of one TurnActor per conversation, and the seam clients call.

Lifecycle, in order:

1. ``on_start``: open the conversation tables in ``chalie.db``, close what a
   crash left open (turns left running end ``interrupted``; tool calls left
   without a result get an ``interrupted`` result), and subscribe to the
   event bus for permission requests and background results, which it
   routes to the conversation's actor.
2. :meth:`send` validates and stores the message (a seen ``client_msg_id``
   starts nothing), creates the conversation's TurnActor on demand (it loads
   the history from storage) and hands it the turn.
3. A TurnActor idle for ``conversations.idle_stop`` seconds reports it and is
   stopped, unless a message was sent to it meanwhile.
4. A TurnActor that crashes reports it and is started again at once; the new
   one ends the crashed turn ``interrupted`` with a line the user sees. Past
   :data:`MAX_CRASHES` in :data:`CRASH_PERIOD` seconds it is left stopped
   until the next message.
5. ``on_stop``: stop every TurnActor (a running turn ends ``interrupted``),
   close the model clients on the loop, close the store.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import pykka

from actors.actor import SupervisedActor
from actors.child_ref import ChildRef, ChildUnavailable
from actors.dispatcher import DispatcherActor, submit
from actors.future import CallbackFuture
from actors.loop import EventLoopThread
from actors.policy import PolicyActor
from actors.turn import TurnActor, TurnDeps
from chalie.config import Config, ModelConfig
from chalie.conversation.channels import Channel, resolve_channels
from chalie.conversation.events import Event
from chalie.conversation.requests import (
    Accepted,
    ConversationError,
    SendMessage,
    check_id,
    check_send,
)
from chalie.conversation.store import ConversationInfo, ConversationStore, TurnRow
from chalie.dispatch import envelope_name
from chalie.envelope import render
from chalie.events import EventBus, Subscription
from chalie.mail import (
    CancelRunningTurn,
    DeliverBackground,
    EvictIfIdle,
    RelayPermission,
    SettlePermission,
    StartTurn,
    TurnActorCrashed,
    TurnActorIdle,
)
from chalie.messages import (
    ANSWERS,
    BackgroundResult,
    CancelTurn,
    PermissionRequest,
    ToolCall,
    ToolOutcome,
)
from chalie.outbox import Outbox
from chalie.providers.client import ModelClient
from chalie.registry import Registry
from chalie.services import Services


class ConversationsHost(Protocol):
    """What the conversations need of the running daemon (the composition root's Runtime)."""

    @property
    def config(self) -> Config: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def events(self) -> EventBus: ...

    @property
    def loop(self) -> EventLoopThread: ...

    @property
    def services(self) -> Services: ...

    @property
    def db_path(self) -> Path: ...

    def child(self, child_id: str, kind: type[K]) -> ChildRef[K]: ...


log = logging.getLogger("chalie.conversations")
K = TypeVar("K", bound=pykka.Actor)

MAX_CRASHES: Final = 3
CRASH_PERIOD: Final = 30.0
ASK_TIMEOUT: Final = 10.0
# Conversations whose channel is kept in memory (least recently used dropped first).
CHANNELS_REMEMBERED: Final = 10_000


@dataclass(frozen=True)
class _Route:
    event: PermissionRequest | BackgroundResult


@dataclass
class _Live:
    ref: pykka.ActorRef[TurnActor]
    send_no: int = 0
    evicting: bool = False  # asked to stop if idle (over max_live); cleared on use


class Conversations(SupervisedActor):
    """One TurnActor per conversation, on demand; the API chat clients and MCP build on."""

    def __init__(self, rt: ConversationsHost) -> None:
        super().__init__()
        self._rt = rt
        cfg = rt.config
        self._channels: dict[str, Channel] = resolve_channels(cfg.channels)
        self._channel_names = frozenset(self._channels)
        self._model_configs: dict[str, ModelConfig] = dict(cfg.models)
        self._models: dict[str, ModelClient] = {}
        # Least recently used first: a use moves a conversation to the end.
        self._live: OrderedDict[str, _Live] = OrderedDict()
        self._crashes: dict[str, deque[float]] = {}
        self._requests: dict[str, str] = {}  # permission request id -> conversation id
        self._send_no = 0
        # The channel of conversations seen (it never changes): no read for each message.
        self._channel_of: OrderedDict[str, str] = OrderedDict()
        self._store: ConversationStore | None = None
        self._outbox: Outbox | None = None
        self._sub: Subscription | None = None
        self._deps: TurnDeps | None = None

    # -- lifecycle ------------------------------------------------------------------
    def on_start(self) -> None:
        rt = self._rt
        store = ConversationStore(rt.db_path)
        self._store = store
        outbox = Outbox(
            rt.db_path, max_age=rt.config.outbox.max_age, max_rows=rt.config.outbox.max_rows
        )
        self._outbox = outbox
        for cid in store.interrupted_conversations():
            for event in store.recover(cid):
                rt.events.publish(cid, event)
            log.warning(
                "a turn left running at the last stop ended interrupted",
                extra={"conversation_id": cid},
            )
        self._deps = TurnDeps(
            store=store,
            channels=self._channels,
            models=self._model,
            loop=rt.loop,
            dispatch=self._dispatch,
            cancel_calls=self._cancel_calls,
            descriptors=self._descriptors,
            injected=rt.services.turns.injected,
            forget=rt.services.turns.forget,
            pending_background=lambda cid: outbox.pending(cid),
            ack_background=outbox.ack,
            bus=rt.events,
            idle_stop=rt.config.conversations.idle_stop,
            max_queued=rt.config.conversations.max_queued,
            learn=self._learn,
        )
        ref = self.actor_ref

        def route(event: Any) -> None:
            if isinstance(event, (PermissionRequest, BackgroundResult)):
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.tell(_Route(event))

        self._sub = rt.events.subscribe(None, route)

    def on_stop(self) -> None:
        self._close()

    def on_failure(self, *exc: Any) -> None:
        self._close()

    def _close(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None
        live, self._live = self._live, OrderedDict()
        stops = []
        for entry in live.values():
            with contextlib.suppress(pykka.ActorDeadError):
                stops.append(entry.ref.stop(block=False))
        for stop in stops:
            with contextlib.suppress(pykka.Timeout, pykka.ActorDeadError):
                stop.get(timeout=5)
        models, self._models = self._models, {}
        for client in models.values():
            with contextlib.suppress(Exception):
                self._rt.loop.submit(client.aclose()).result(5)
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._outbox is not None:
            self._outbox.close()
            self._outbox = None

    # -- what the TurnActors share ------------------------------------------------------
    def _model(self, name: str) -> ModelClient:
        # Called from TurnActor threads: a dict read, and a benign race on first use.
        client = self._models.get(name)
        if client is None:
            config = self._model_configs.get(name) or self._model_configs.get("default")
            client = ModelClient(name, config or ModelConfig())
            client = self._models.setdefault(name, client)
        return client

    def _learn(self, turn_id: str, channel: str, used: frozenset[str]) -> None:
        """A turn ended (TurnActor threads): learn what it used, where learning is on.

        Never waits: the examples go to discovery as tells. Elsewhere (an external
        agent, learning off) only the turn's find_tools record is dropped.
        """
        learning = self._rt.config.discovery
        if not learning.learn or channel not in learning.learn_channels:
            used = frozenset()
        discovery = self._rt.services.discovery
        if discovery is not None:
            discovery.learn_turn_soon(turn_id, channel, used)

    def _dispatch(self, call: ToolCall) -> concurrent.futures.Future[ToolOutcome]:

        try:
            ref = self._rt.child("dispatcher", DispatcherActor).current()
        except ChildUnavailable as exc:
            future: concurrent.futures.Future[ToolOutcome] = concurrent.futures.Future()
            future.set_result(
                ToolOutcome(
                    call_id=call.call_id,
                    tool=call.tool,
                    status="error",
                    code=exc.code,
                    envelope=render(envelope_name(call.tool), exc.result()),
                )
            )
            return future
        return submit(ref, call)

    def _cancel_calls(self, turn_id: str) -> None:
        # A tell: the TurnActor calling this never waits on the dispatcher.
        with contextlib.suppress(ChildUnavailable):
            self._rt.child("dispatcher", DispatcherActor).tell(CancelTurn(turn_id=turn_id))

    def _descriptors(self, names: tuple[str, ...], allow_async: bool) -> list[dict[str, Any]]:
        registry = self._rt.registry
        out = []
        for name in names:
            entry = registry.get(name)
            if entry is not None:
                out.append(entry.cls.descriptor(allow_async=allow_async))
        return out

    @property
    def store(self) -> ConversationStore:
        if self._store is None:
            raise ConversationError("unavailable", "the conversations are not running")
        return self._store

    # -- the seam -------------------------------------------------------------------------
    def send(self, msg: SendMessage) -> Accepted:
        """Store the message and start (or queue) its turn; raises ConversationError.

        Waits, on this actor's thread, for the TurnActor to take the turn: for
        callers on a thread. Async callers use :meth:`submit`.
        """
        try:
            return self.submit(msg).result(timeout=ASK_TIMEOUT)
        except concurrent.futures.TimeoutError:
            raise pykka.Timeout(
                f"the conversation did not take the turn in {ASK_TIMEOUT:g} s"
            ) from None

    def submit(self, msg: SendMessage) -> concurrent.futures.Future[Accepted]:
        """Store the message and hand its turn to the conversation's TurnActor, without waiting.

        The message is validated and stored here (raises ConversationError); the
        future is answered by the TurnActor once it has started or queued the
        turn (with ``queued``), or fails with ActorDeadError if that actor died
        first (the stored turn is then run by the next one, from storage). This
        actor is free meanwhile: one conversation's turn start never holds up
        another's message.
        """
        check_send(
            msg,
            channels=self._channel_names,
            max_chars=self._rt.config.conversations.max_message_chars,
        )
        store = self.store
        cid = msg.conversation_id
        if cid is None:
            cid = new_id("c")
        channel = self._known_channel(cid)
        if channel is None:
            store.create(cid, msg.channel, msg.origin, title=" ".join(msg.text.split())[:80])
            self._remember_channel(cid, msg.channel)
        elif channel != msg.channel:
            raise ConversationError(
                "invalid-message",
                f"conversation {cid} is on channel {channel!r}, not {msg.channel[:64]!r}",
            )
        client_msg_id = msg.client_msg_id or new_id("m")
        turn_id = new_id("t")
        out: concurrent.futures.Future[Accepted] = concurrent.futures.Future()
        seen = store.queue_turn(cid, turn_id, client_msg_id, msg.text)
        if seen is not None:
            out.set_result(
                Accepted(conversation_id=cid, turn_id=seen.turn_id, queued=False, duplicate=True)
            )
            return out
        self._send_no += 1
        live = self._actor(cid)
        live.send_no = self._send_no
        taken: concurrent.futures.Future[bool] = concurrent.futures.Future()
        asked = live.ref.ask(
            StartTurn(
                turn_id,
                client_msg_id,
                msg.text,
                msg.busy,
                self._send_no,
                human_present=msg.human_present is True,
                taken=taken,
            ),
            block=False,
        )

        def settle(queued: bool | None, exc: BaseException | None) -> None:
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # the other won
                if exc is not None:
                    out.set_exception(exc)
                else:
                    out.set_result(
                        Accepted(
                            conversation_id=cid,
                            turn_id=turn_id,
                            queued=bool(queued),
                            duplicate=False,
                        )
                    )

        # Answered when the TurnActor decides (before the turn's first step); the ask
        # itself answers only after that step, or fails if the actor died first.
        taken.add_done_callback(lambda f: settle(f.result(), None))

        def asked_done(done: CallbackFuture) -> None:  # on the TurnActor's thread
            try:
                settle(bool(done.get(timeout=0)), None)
            except BaseException as exc:
                settle(None, exc)

        assert isinstance(asked, CallbackFuture)  # a TurnActor's asks call back
        asked.add_done_callback(asked_done)
        return out

    def cancel(self, conversation_id: str) -> bool:
        """Cancel the conversation's running turn; False when none runs."""
        check_id(conversation_id)
        live = self._live.get(conversation_id)
        if live is None:
            return False
        try:
            return bool(live.ref.ask(CancelRunningTurn(), timeout=ASK_TIMEOUT))
        except pykka.ActorDeadError:
            return False

    def events(self, conversation_id: str, after_seq: int = 0, limit: int = 200) -> list[Event]:
        check_id(conversation_id)
        return self.store.events(conversation_id, after_seq, limit)

    def answer(self, request_id: str, answer: str) -> bool:
        """Forward a permission answer to the gate; False when no such request is pending."""
        if answer not in ANSWERS:
            raise ConversationError(
                "invalid-message", f"answer must be one of {', '.join(sorted(ANSWERS))}"
            )
        if not isinstance(request_id, str) or len(request_id) > 128:
            raise ConversationError("invalid-message", "request_id is not a request id")
        # The turn hears the answer before the gate does: the call can only end
        # after the gate's answer, so its settlement is always this answer, never
        # the "allowed" inferred from the call's outcome (a race otherwise).
        cid = self._requests.get(request_id)
        live = self._live.get(cid) if cid is not None else None
        if live is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                live.ref.tell(SettlePermission(request_id, answer))
        policy = self._rt.child("policy", PolicyActor).within(ASK_TIMEOUT)
        found = policy.call(PolicyActor.answer, request_id, answer)
        self._requests.pop(request_id, None)
        return found is not False

    def list(self, limit: int = 100) -> list[ConversationInfo]:
        return self.store.list(limit)

    def show(self, conversation_id: str) -> dict[str, Any] | None:
        check_id(conversation_id)
        loaded = self.store.load(conversation_id)
        if loaded is None:
            return None
        turns: list[TurnRow] = self.store.turns(conversation_id)
        return {
            "info": loaded.info,
            "messages": loaded.messages,
            "turns": turns,
            "live": conversation_id in self._live,
        }

    def delete(self, conversation_id: str) -> bool:
        check_id(conversation_id)
        live = self._live.pop(conversation_id, None)
        if live is not None:
            with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                live.ref.stop(block=True, timeout=5)
        self._channel_of.pop(conversation_id, None)
        return self.store.delete(conversation_id)

    def live(self) -> int:
        """How many TurnActors run now."""
        return len(self._live)

    def channels(self) -> dict[str, Channel]:
        return dict(self._channels)

    def crash(self, conversation_id: str) -> None:
        """Tests: make the conversation's TurnActor fail."""
        live = self._live.get(conversation_id)
        if live is not None:
            live.ref.tell("crash")

    # -- conversations' channels ------------------------------------------------------------
    def _known_channel(self, cid: str) -> str | None:
        """The conversation's channel (None: no such conversation), from memory once seen."""
        channel = self._channel_of.get(cid)
        if channel is not None:
            self._channel_of.move_to_end(cid)
            return channel
        channel = self.store.channel_of(cid)
        if channel is not None:
            self._remember_channel(cid, channel)
        return channel

    def _remember_channel(self, cid: str, channel: str) -> None:
        self._channel_of[cid] = channel
        if len(self._channel_of) > CHANNELS_REMEMBERED:
            self._channel_of.popitem(last=False)

    # -- children ---------------------------------------------------------------------------
    def _actor(self, cid: str) -> _Live:
        live = self._live.get(cid)
        if live is not None and live.ref.is_alive():
            self._live.move_to_end(cid)
            live.evicting = False
            return live
        deps = self._deps
        assert deps is not None
        ref = TurnActor.start(cid, deps, self.actor_ref)
        live = _Live(ref)
        self._live[cid] = live
        self._live.move_to_end(cid)
        self._evict()
        return live

    def _evict(self) -> None:
        """Over max_live: ask the least recently used to stop if idle (a busy one stays)."""
        excess = len(self._live) - self._rt.config.conversations.max_live
        for live in self._live.values():
            if excess <= 0:
                return
            if not live.evicting:
                live.evicting = True
                with contextlib.suppress(pykka.ActorDeadError):
                    live.ref.tell(EvictIfIdle())
            excess -= 1

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Route):
            self._route(message.event)
        elif isinstance(message, TurnActorIdle):
            live = self._live.get(message.conversation_id)
            if (
                live is not None
                and live.ref.actor_urn == message.urn
                and (live.send_no <= message.send_no)
            ):
                del self._live[message.conversation_id]
                live.ref.stop(block=False)
        elif isinstance(message, TurnActorCrashed):
            self._crashed(message)
        else:
            return super().on_receive(message)
        return None

    def _route(self, event: PermissionRequest | BackgroundResult) -> None:
        cid = event.conversation_id
        if self._store is None or self._known_channel(cid) is None:
            return  # a call made outside any conversation (the CLI's tools call)
        if isinstance(event, PermissionRequest):
            self._requests[event.request_id] = cid
            if len(self._requests) > 10_000:
                self._requests.pop(next(iter(self._requests)))
            self._actor(cid).ref.tell(RelayPermission(event))
        else:
            self._actor(cid).ref.tell(DeliverBackground(event))

    def _crashed(self, message: TurnActorCrashed) -> None:
        cid = message.conversation_id
        live = self._live.get(cid)
        if live is None or live.ref.actor_urn != message.urn:
            return
        del self._live[cid]
        log.error("turn actor failed", extra={"conversation_id": cid, "error": message.error})
        now = time.monotonic()
        times = self._crashes.setdefault(cid, deque(maxlen=MAX_CRASHES))
        times.append(now)
        if len(times) == MAX_CRASHES and now - times[0] < CRASH_PERIOD:
            log.error(
                "turn actor keeps failing; left stopped until the next message",
                extra={"conversation_id": cid},
            )
            return
        # The new actor ends the crashed turn as interrupted while it starts.
        self._actor(cid)


async def send_on_loop(
    conversations: ChildRef[Conversations], msg: SendMessage, timeout: float
) -> Accepted:
    """:meth:`Conversations.send` for async code: the message is stored by the actor
    (``submit``), and the loop, not that actor's thread, waits for the TurnActor to take
    the turn. Raises what ``send`` does, ChildUnavailable, or TimeoutError after ``timeout``."""
    taken = await conversations.within(timeout).acall(Conversations.submit, msg)
    async with asyncio.timeout(timeout):
        return await asyncio.wrap_future(taken)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"

"""Conversations: the supervisor of one TurnActor per live conversation, and what clients call.

Clients reach it through the conversations port (``actors/conversation/port.py``).

Lifecycle, in order:

1. ``on_start``: open the conversation tables in ``chalie.db``, close what a
   crash left open (turns left running end ``interrupted``; tool calls left
   without a result get an ``interrupted`` result), and subscribe to the
   event bus for background results only (a conversation may have no live
   TurnActor to hear its own); permission requests and how they ended reach the
   running turn's actor directly from the PolicyActor, their one owner.
2. :meth:`submit` validates and stores the message (a seen ``client_msg_id``
   starts nothing), creates the conversation's TurnActor on demand (it loads
   the history from storage) and hands it the turn.
   Each TurnActor is a child of this supervisor (:class:`actors.process.supervisor.Supervisor`),
   made from the :class:`chalie.process.supervision.OnDemand` template it is started with
   (:data:`chalie_app.root.TURNS`: transient).
3. A TurnActor idle for ``conversations.idle_stop`` seconds reports it and is
   dismissed (a normal exit: not restarted), unless a message was sent to it meanwhile.
4. A TurnActor that fails ends its turn at once, from storage, with an
   ``internal-error`` event and a line the user sees; the supervisor then applies
   the template's rule: restarted after its backoff (the new actor goes on with
   any queued message), and past the intensity this supervisor escalates to its
   parent, which restarts it. A message for a conversation whose actor waits for
   its restart starts it at once.
5. ``on_stop``: stop every TurnActor at once (a running turn ends ``interrupted``),
   close the model clients on the loop, close the store.

The actor never blocks its mailbox on another actor: ``submit``, ``cancel``,
``answer`` and ``delete`` return a future that the TurnActor or the PolicyActor
completes (a delete removes the rows once the conversation's actor has stopped).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, TypeVar

import pykka

from actors.actor import tell_quietly
from actors.calls.dispatcher import DispatcherActor, DispatcherClient
from actors.conversation.turn import CRASH, Models, TurnActor, TurnDeps, TurnSettings, TurnStorage
from actors.future import CallbackFuture
from actors.gate.policy import PolicyActor
from actors.host import Host
from actors.process.supervisor import Supervisor
from chalie.calls.outbox import Outbox
from chalie.conversation import background, submission
from chalie.conversation.channels import Channel, resolve_channels
from chalie.conversation.compaction import SummaryStore
from chalie.conversation.leases import ConversationLeases
from chalie.conversation.quota import check_room, free_bytes
from chalie.conversation.requests import (
    ConversationError,
    SendMessage,
    check_id,
    check_send,
)
from chalie.conversation.store import ConversationInfo, ConversationStore, TurnRow
from chalie.memory import briefing
from chalie.process import telemetry
from chalie.process.supervision import OnDemand
from chalie.store.sql import Follower
from chalie.wire.actor_messages import (
    CancelRunningTurn,
    DeliverBackground,
    EvictIfIdle,
    HandOff,
    TurnActorIdle,
)
from chalie.wire.bus import Subscription
from chalie.wire.events import BackgroundResult, Event
from chalie.wire.messages import ANSWERS, Accepted, TurnContext
from chalie.wire.principals import Principal, may_answer

log = logging.getLogger("chalie.conversations")
K = TypeVar("K", bound=pykka.Actor)

ASK_TIMEOUT: Final = 10.0
# Conversations whose channel is kept in memory (least recently used dropped first).
CHANNELS_REMEMBERED: Final = 10_000


@dataclass(frozen=True)
class _Route:
    event: BackgroundResult


@dataclass(frozen=True)
class _FollowUp:
    """A background result reached an idle conversation: a turn tells the person."""

    conversation_id: str
    result: BackgroundResult


@dataclass(frozen=True)
class _Lease:
    """News of a conversation's lease on a shared store: another daemon waits for it
    (``wanted``: hand it over when its turns are done), or it is free for a message that
    waits here (``free``: take it, run the turns)."""

    conversation_id: str
    news: str  # "wanted" or "free"


@dataclass(frozen=True)
class _Prune:
    """Time to delete the agent conversations past [conversations] agent_retention_days."""


# How often the retention setting is applied (besides at start).
PRUNE_EVERY: Final = 3600.0


@dataclass
class _Live:
    """What this actor keeps of a live conversation (its actor is the child of that id)."""

    send_no: int = 0
    evicting: bool = False  # asked to stop if idle (over max_live); cleared on use


class _Hooks:
    """What the daemon's turns tell it (:class:`actors.conversation.turn.TurnHooks`); on TurnActor
    threads."""

    def __init__(self, rt: Host, conversations: pykka.ActorRef[Any]) -> None:
        self._rt = rt
        self._conversations = conversations

    def brief(self, context: TurnContext, message: str) -> str:
        rt = self._rt
        return briefing.for_turn(
            rt.services.memory, context, message, rt.config.accounts.zone, time.time()
        )

    def learn(self, turn_id: str, channel: str, used: frozenset[str]) -> None:
        """Learn what the turn used, where learning is on.

        Never waits: the examples go to discovery as tells. Elsewhere (an external
        agent, learning off) only the turn's find_tools record is dropped.
        """
        learning = self._rt.config.discovery
        if not learning.learn or channel not in learning.learn_channels:
            used = frozenset()
        discovery = self._rt.services.discovery
        if discovery is not None:
            discovery.learn_turn_soon(turn_id, channel, used)

    def follow_up(self, conversation_id: str, result: BackgroundResult) -> None:
        """The turn starts from the Conversations actor's own thread."""
        with contextlib.suppress(pykka.ActorDeadError):
            self._conversations.tell(_FollowUp(conversation_id, result))


class Conversations(Supervisor):
    """One TurnActor per live conversation, on demand; the API chat clients and MCP build on."""

    # The TurnActors do not depend on each other: a stop stops them all at once.
    STOP_TOGETHER = True

    def __init__(self, rt: Host, turns: OnDemand) -> None:
        super().__init__((), intensity=turns.intensity, period=turns.period)
        self._turns = turns
        self._rt = rt
        # The permission answers' one handle on the PolicyActor (it survives restarts).
        self._gate = rt.child("policy", PolicyActor)
        cfg = rt.config
        self._channels: dict[str, Channel] = resolve_channels(cfg.channels)
        self._channel_names = frozenset(self._channels)
        self._models = Models(cfg.models, rt.loop)
        # Least recently used first: a use moves a conversation to the end.
        self._live: OrderedDict[str, _Live] = OrderedDict()
        self._send_no = 0
        # The channel of conversations seen (it never changes): no read for each message.
        # cid -> (channel, owning principal id; '' for the owner's): neither ever changes.
        self._channel_of: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._store: ConversationStore | None = None
        self._outbox: Outbox | None = None
        self._summaries: SummaryStore | None = None
        self._sub: Subscription | None = None
        self._deps: TurnDeps | None = None
        self._leases: ConversationLeases | None = None
        # Messages taken here while another daemon held their conversation: cid -> turn id ->
        # (human_present, park_asks), for the TurnActor that runs them from the store.
        self._waiting_asks: dict[str, dict[str, tuple[bool, bool]]] = {}
        self._wanted: Follower | None = None

    # -- lifecycle ------------------------------------------------------------------
    def on_start(self) -> None:
        rt = self._rt
        store = ConversationStore(rt.db_path)
        self._store = store
        self._summaries = SummaryStore(rt.db_path) if rt.config.background.compaction else None
        outbox = Outbox(
            rt.db_path, max_age=rt.config.outbox.max_age, max_rows=rt.config.outbox.max_rows
        )
        self._outbox = outbox
        self._prune()
        leases = self._leases = ConversationLeases(rt.db_path)
        ref = self.actor_ref
        self._wanted = leases.follow(lambda cid: tell_quietly(ref, _Lease(cid, "wanted")))
        for cid in store.interrupted_conversations():
            if not leases.hold(cid):
                continue  # its turn runs on another daemon on the shared store
            try:
                recovered = store.recover(cid)
            finally:
                leases.drop(cid)
            for event in recovered:
                rt.events.publish(cid, event)
            log.warning(
                "a turn left running at the last stop ended interrupted",
                extra={"conversation_id": cid},
            )
        self._deps = TurnDeps(
            storage=TurnStorage(store, outbox, self._summaries),
            bus=rt.events,
            models=self._models,
            dispatcher=DispatcherClient(rt.child("dispatcher", DispatcherActor)),
            tools=rt.catalogue,
            settings=TurnSettings(
                channels=self._channels,
                idle_stop=rt.config.conversations.idle_stop,
                max_queued=rt.config.conversations.max_queued,
                zone=rt.config.accounts.zone,
            ),
            hooks=_Hooks(rt, self.actor_ref),
        )

        def route(event: Any) -> None:
            if not event.recorded:  # a TurnActor's record of one is already delivered
                tell_quietly(ref, _Route(event))

        # Background results only (a conversation may have no live TurnActor to hear its
        # own): permission requests reach the running turn's actor directly.
        self._sub = rt.events.subscribe(None, route, kinds=(BackgroundResult,))
        # Results the last run left undelivered (a background call it lost gets an
        # interrupted one, chalie_app.root.deliver_interrupted) reach their conversations
        # now, as any background result does, not when the person next writes there.
        for cid in outbox.waiting():
            self._wake(cid)
        super().on_start()

    def on_stop(self) -> None:
        self._close()
        super().on_stop()

    def on_failure(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close()
        super().on_failure(exc_type, exc, tb)

    def _close(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None
        if self._wanted is not None:
            self._wanted.close()
            self._wanted = None
        # The TurnActors first: a stopping one still writes its turn's end.
        self.stop_children()
        self._live = OrderedDict()
        if self._leases is not None:  # after the TurnActors' last writes: lets go of all
            self._leases.close()
            self._leases = None
        self._models.close()
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._summaries is not None:
            self._summaries.close()
            self._summaries = None
        if self._outbox is not None:
            self._outbox.close()
            self._outbox = None

    # -- what the TurnActors share ------------------------------------------------------
    @property
    def store(self) -> ConversationStore:
        if self._store is None:
            raise ConversationError("unavailable", "the conversations are not running")
        return self._store

    # -- the seam -------------------------------------------------------------------------
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
        cid = msg.conversation_id if msg.conversation_id is not None else new_id("c")
        try:
            placement = submission.place(msg, cid, self._placement(cid))
        except ConversationError as refused:
            if refused.code == "unknown-conversation":
                who = submission.sender(msg)
                log.warning(
                    "a message into another principal's conversation was refused",
                    extra={"conversation_id": cid, "principal": who.id, "scope": who.scope},
                )
            raise
        limits = self._rt.config.conversations
        check_room(
            placement.principal,
            submission.incoming_bytes(msg),
            placement.new,
            usage=store.usage,
            free=free_bytes(self._rt.config.home),  # the home's disk (the store's, on SQLite)
            min_free=limits.min_free_bytes,
            max_conversations=limits.agent_max_conversations,
            max_bytes=limits.agent_max_bytes,
        )
        if placement.new:
            store.create(
                cid, msg.channel, msg.origin, title=placement.title, principal=msg.principal
            )
            self._remember_channel(cid, (msg.channel, placement.owner_id))
        client_msg_id = msg.client_msg_id or new_id("m")
        turn_id = new_id("t")
        telemetry.turn_parent(turn_id, msg.traceparent)  # before its actor may start it
        seen = store.queue_turn(cid, turn_id, client_msg_id, msg.text)
        if seen is not None:
            return submission.duplicate(cid, seen.turn_id)
        got = self._actor(cid)
        if got is None:
            # Its turns run on another daemon now: the message waits in the store, queued,
            # and this daemon takes the conversation over once that one lets go of it.
            asks = (msg.human_present is True, msg.park_asks is True)
            self._waiting_asks.setdefault(cid, {})[turn_id] = asks
            self._want(cid)
            taken: concurrent.futures.Future[Accepted] = concurrent.futures.Future()
            taken.set_result(submission.decided(cid, turn_id, True))
            return taken
        self._send_no += 1
        live, ref = got
        live.send_no = self._send_no
        start, taken = submission.start(msg, turn_id, client_msg_id, self._send_no)
        # The TurnActor answers ``taken`` once it has decided (before the turn's first
        # step); the ask answers only if that actor died or failed before deciding.
        asked = ref.ask(start, block=False)
        assert isinstance(asked, CallbackFuture)  # a TurnActor's asks call back
        asked.add_done_callback(lambda done: submission.undecided(taken, done))
        return taken

    def cancel(self, conversation_id: str) -> concurrent.futures.Future[bool]:
        """Cancel the conversation's running turn; the future says whether one ran.

        Answered by the TurnActor; this actor does not wait for it.
        """
        check_id(conversation_id)
        out: concurrent.futures.Future[bool] = concurrent.futures.Future()
        ref = self.child(conversation_id)
        if ref is None:
            out.set_result(False)
            return out
        try:
            asked = ref.ask(CancelRunningTurn(), block=False)
        except pykka.ActorDeadError:
            out.set_result(False)
            return out
        assert isinstance(asked, CallbackFuture)  # a TurnActor's asks call back
        asked.add_done_callback(lambda done: _settle_bool(out, done))
        return out

    def events(self, conversation_id: str, after_seq: int = 0, limit: int = 200) -> list[Event]:
        check_id(conversation_id)
        return self.store.events(conversation_id, after_seq, limit)

    def answer(
        self, request_id: str, answer: str, by: Principal | None, content: Any = None
    ) -> concurrent.futures.Future[bool]:
        """Hand ``by``'s answer to the gate, the request's one owner; the future says
        whether the request was pending. The PolicyActor answers it (and refuses anyone
        but the owner, :func:`chalie.wire.principals.may_answer`); this actor does not wait.
        """
        if not may_answer(by, None):
            raise ConversationError("forbidden", "only the owner answers a permission request")
        if answer not in ANSWERS:
            raise ConversationError(
                "invalid-message", f"answer must be one of {', '.join(sorted(ANSWERS))}"
            )
        if not isinstance(request_id, str) or len(request_id) > 128:
            raise ConversationError("invalid-message", "request_id is not a request id")
        out: concurrent.futures.Future[bool] = concurrent.futures.Future()
        answered = self._gate.future(PolicyActor.answer, request_id, answer, by, content)
        assert isinstance(answered, CallbackFuture)  # the PolicyActor's answers call back
        answered.add_done_callback(lambda done: _settle_bool(out, done))
        return out

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

    def delete(self, conversation_id: str) -> concurrent.futures.Future[bool]:
        """Delete a conversation; the future says whether it existed.

        A live TurnActor is stopped first (without waiting here): its rows go once it
        has stopped, so nothing it writes while stopping outlives the delete.
        """
        check_id(conversation_id)
        out: concurrent.futures.Future[bool] = concurrent.futures.Future()
        self._channel_of.pop(conversation_id, None)
        if self._summaries is not None:
            self._summaries.delete(conversation_id)
        self._live.pop(conversation_id, None)

        def stopped() -> None:  # on this actor's thread
            self._channel_of.pop(conversation_id, None)
            self._let_go(conversation_id)
            try:
                out.set_result(self.store.delete(conversation_id))
            except Exception as exc:
                out.set_exception(exc)

        if not self.dismiss_child(conversation_id, then=stopped):
            stopped()
        return out

    def live(self) -> int:
        """How many TurnActors run now."""
        return len(self._live)

    def channels(self) -> dict[str, Channel]:
        return dict(self._channels)

    def crash(self, conversation_id: str) -> None:
        """Tests: make the conversation's TurnActor fail."""
        ref = self.child(conversation_id)
        if ref is not None:
            ref.tell(CRASH)

    # -- conversations' channels ------------------------------------------------------------
    def _known_channel(self, cid: str) -> str | None:
        """The conversation's channel (None: no such conversation), from memory once seen."""
        placed = self._placement(cid)
        return None if placed is None else placed[0]

    def _placement(self, cid: str) -> tuple[str, str] | None:
        """The conversation's channel and owner id (None: no such conversation)."""
        placed = self._channel_of.get(cid)
        if placed is not None:
            self._channel_of.move_to_end(cid)
            return placed
        placed = self.store.placement(cid)
        if placed is not None:
            self._remember_channel(cid, placed)
        return placed

    def _remember_channel(self, cid: str, placed: tuple[str, str]) -> None:
        self._channel_of[cid] = placed
        if len(self._channel_of) > CHANNELS_REMEMBERED:
            self._channel_of.popitem(last=False)

    # -- children ---------------------------------------------------------------------------
    def _actor(self, cid: str) -> tuple[_Live, pykka.ActorRef[TurnActor]] | None:
        """The conversation's TurnActor, started now if it is not running; None when another
        daemon on the shared store holds the conversation's lease (runs its turns)."""
        live = self._live.get(cid)
        if live is None:
            if not self.has_child(cid) and not self._hold(cid):
                return None
            live = self._live[cid] = _Live()
        self._live.move_to_end(cid)
        live.evicting = False
        ref = self.child(cid)
        if ref is None or not ref.is_alive():
            if self.has_child(cid):
                # Failed, and waiting for its restart: a message starts it now.
                self.restart_child(cid)
            else:
                self.add_child(self._turns.spec(cid, lambda: self._start_turn_actor(cid)))
            ref = self.child(cid)
            if ref is None:  # its start failed (the supervisor's rule applies)
                raise ConversationError("unavailable", "the conversation could not start")
            self._evict()
        return live, ref

    def _start_turn_actor(self, cid: str) -> pykka.ActorRef[TurnActor]:
        """The TurnActor for ``cid`` (the template's start; on this actor's thread)."""
        deps = self._deps
        assert deps is not None
        live = self._live.get(cid)
        return TurnActor.start(
            cid,
            deps,
            self.actor_ref,
            live.send_no if live else 0,
            asks=self._waiting_asks.pop(cid, None),
        )

    def child_forgotten(self, id: str) -> None:
        self._live.pop(id, None)
        self._let_go(id)

    # -- the conversations' leases (chalie.conversation.leases) -------------------------------
    def _hold(self, cid: str) -> bool:
        return self._leases is not None and self._leases.hold(cid)

    def _let_go(self, cid: str) -> None:
        """The conversation's TurnActor has stopped: its lease goes, unless a new one runs."""
        if self._leases is not None and cid not in self._live and not self.has_child(cid):
            self._leases.drop(cid)

    def _want(self, cid: str) -> None:
        leases, ref = self._leases, self.actor_ref
        if leases is not None:
            leases.want(cid, lambda: tell_quietly(ref, _Lease(cid, "free")))

    def _lease_free(self, cid: str) -> None:
        """The conversation's lease was let go of elsewhere: its TurnActor starts here and
        runs the turns waiting in the store (or this daemon waits again)."""
        if self._store is None or cid in self._live or self._known_channel(cid) is None:
            return
        try:
            if self._actor(cid) is None:
                self._want(cid)  # taken again meanwhile
        except ConversationError:
            log.warning(
                "a conversation handed over could not start", extra={"conversation_id": cid}
            )

    def _wanted_here(self, cid: str) -> None:
        ref = self.child(cid) if cid in self._live else None
        if ref is not None:
            tell_quietly(ref, HandOff())

    def _evict(self) -> None:
        """Over max_live: ask the least recently used to stop if idle (a busy one stays)."""
        excess = len(self._live) - self._rt.config.conversations.max_live
        for cid, live in self._live.items():
            if excess <= 0:
                return
            ref = self.child(cid)
            if not live.evicting and ref is not None:
                live.evicting = True
                tell_quietly(ref, EvictIfIdle())
            excess -= 1

    def _follow_up(self, message: _FollowUp) -> None:
        cid = message.conversation_id
        channel = self._known_channel(cid)
        if channel is None:
            return
        try:
            self.submit(
                SendMessage(
                    conversation_id=cid,
                    channel=channel,
                    text=background.follow_up_text(message.result),
                    client_msg_id=background.follow_up_id(message.result),
                    origin=background.ORIGIN,
                )
            )
        except ConversationError as exc:
            log.warning(
                "a background result could not start a turn: %s",
                exc.message,
                extra={"conversation_id": cid},
            )

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Prune):
            self._prune()
        elif isinstance(message, _FollowUp):
            self._follow_up(message)
        elif isinstance(message, _Route):
            self._route(message.event)
        elif isinstance(message, _Lease) and message.news == "wanted":
            self._wanted_here(message.conversation_id)
        elif isinstance(message, _Lease):
            self._lease_free(message.conversation_id)
        elif isinstance(message, TurnActorIdle):
            cid = message.conversation_id
            live = self._live.get(cid)
            ref = self.child(cid)
            if (
                live is not None
                and ref is not None
                and ref.actor_urn == message.urn
                and live.send_no <= message.send_no
            ):
                del self._live[cid]
                self.dismiss_child(cid, then=lambda: self._let_go(cid))
        else:
            return super().on_receive(message)
        return None

    def _prune(self) -> None:
        """Delete agent conversations idle past the retention (none live now); re-armed."""
        days = self._rt.config.conversations.agent_retention_days
        if days <= 0:
            return
        self.schedule(PRUNE_EVERY, _Prune())
        try:
            idle = self.store.agents_idle_since(time.time() - days * 86400.0)
        except Exception:
            log.exception("could not look for agent conversations past their retention")
            return
        gone = [cid for cid in idle if cid not in self._live]
        for cid in gone:
            self.delete(cid)
        if gone:
            log.info(
                "agent conversations past their retention were deleted",
                extra={"count": len(gone), "days": days},
            )

    def _route(self, event: BackgroundResult) -> None:
        ref = self._wake(event.conversation_id)
        if ref is not None:
            tell_quietly(ref, DeliverBackground(event))

    def _wake(self, cid: str) -> pykka.ActorRef[TurnActor] | None:
        """The conversation's TurnActor, started if need be (it takes the conversation's
        results waiting in the outbox as it starts); None when there is none to start."""
        if self._store is None or self._known_channel(cid) is None:
            return None  # a call made outside any conversation (the CLI's tools call)
        try:
            got = self._actor(cid)
        except ConversationError:
            return None  # kept in the outbox: the conversation's next actor takes it
        # None: leased by another daemon; kept in the outbox for the next actor too.
        return None if got is None else got[1]


def _settle_bool(out: concurrent.futures.Future[bool], done: Any) -> None:
    """Complete ``out`` with an answered pykka future's value as a bool (or its error).

    A dead actor means nothing ran (False); any other failure is passed on.
    """
    try:
        value = done.get(timeout=10)
    except pykka.ActorDeadError:
        value = False
    except BaseException as exc:
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            out.set_exception(exc)
        return
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        out.set_result(value is not False and bool(value))


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"

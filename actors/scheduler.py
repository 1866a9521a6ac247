"""Scheduler: reminders (and the background passes) on timers that survive restarts.

One actor under the supervisor. Its state is chalie.db's ``reminders`` table
and one timer in its own inbox (:class:`actors.timers.TimerInbox`) for the
earliest due reminder, however many are pending: 10,000 pending reminders
cost one heap entry and one wake a minute.

Lifecycle, in order:

1. ``on_start`` opens the table and arms the timer. A reminder whose time
   passed while the daemon was down is due at once; it fires marked late.
2. On a wake it fires every due reminder: the firing is recorded first
   (the next time of a recurring one, or ``done``) and claimed by this scheduler
   (a compare-and-set: one daemon of several on a shared store fires it); then a
   turn starts with the reminder's text, as
   whoever set it: the owner's on the ``subconscious`` channel; an agent's on
   ``external_agent`` as that agent's token (its memory key, its gate, its
   trail id), framed as set by that agent, its text marked untrusted
   (:func:`framed`). An agent's reminder whose token is revoked or gone is
   cancelled instead. Either way no human is there: asks become denials.
3. When that turn ends, its answer goes to the owner's chat conversation as
   a background result (stored in the outbox first, so a client that is
   offline gets it on resume), and is kept as the reminder's last answer; the
   claim ends. A firing whose claimant died first (a kill -9 mid-turn, on this
   daemon's last run or on another daemon) is taken over and fired again at the
   next wake (chalie.schedule.store); a wait on a live claimant's lease wakes
   this scheduler the moment that claimant dies. A reminder added on another
   daemon wakes it too (a notice on a shared store).
4. ``add``/``cancel`` re-arm the timer. The clock is injectable: a test's
   clock jumps and wakes the actor, so nothing sleeps.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import pykka

from actors.actor import SupervisedActor
from actors.timers import TimerInbox
from chalie.calls import untrusted
from chalie.calls.envelope import render
from chalie.calls.outbox import Outbox
from chalie.conversation.follow import TurnOutcome, follow_turn
from chalie.conversation.port import ConversationsPort
from chalie.conversation.requests import SendMessage
from chalie.conversation.store import ConversationStore
from chalie.gate.tokens import TokenStore
from chalie.memory.book import MemoryRequestError
from chalie.memory.records import Provenance
from chalie.memory.reflection import ReflectionLedger, parse_memories, reflection_request, utc_day
from chalie.memory.whose import UNKNOWN_AGENT, agent_name, is_agent, principal_of
from chalie.providers.client import ModelClient
from chalie.result import ToolResult
from chalie.schedule.clock import Clock, WallClock
from chalie.schedule.port import ReminderError
from chalie.schedule.rules import (
    RuleError,
    RuleKind,
    first_time,
    next_time,
    shortest_gap,
    zone,
)
from chalie.schedule.store import ADDED, CLAIM_LEASE, MAX_TEXT, Reminder, ReminderStore, Shown
from chalie.services import LoopService
from chalie.store.sql import (
    Connection,
    Follower,
    LeaseWait,
    StoreError,
    follow,
    open_connection,
    wait_for_lease,
)
from chalie.store.store_place import Place
from chalie.wire.bus import EventBus
from chalie.wire.events import BackgroundResult
from chalie.wire.principals import Principal

log = logging.getLogger("chalie.scheduler")

# The longest the actor waits without looking at the table and the clock again
# (a wall-clock change, a row written by another process).
MAX_WAIT: Final = 60.0
# A reminder fired this long after its time is late.
LATE_AFTER: Final = 60.0
FIRE_BATCH: Final = 100
# The longest a reminder's turn is followed (its channel's guards end it sooner).
TURN_TIMEOUT: Final = 900.0
ORIGIN: Final = "scheduler"
CHANNEL: Final = "subconscious"
# An agent's reminder runs on the agent's channel, as the agent.
AGENT_CHANNEL: Final = "external_agent"


class _Wake:
    """The timer's message: look for due reminders."""


@dataclass(frozen=True)
class _Gone:
    """A claimant waited on (another daemon's scheduler) is gone: its firings are orphans."""

    claimant: str


@dataclass(frozen=True)
class ReminderLimits:
    """What reminders may cost: the shortest repeat, a principal's pending reminders, and
    the model turns all of them may start in one UTC day ([background])."""

    min_interval: float = 60.0
    per_principal: int = 100
    turns_per_day: int = 200


@dataclass(frozen=True)
class Reflection:
    """The reflection pass's settings and reach (None on the Scheduler: no reflection)."""

    idle: float
    tokens_per_day: int
    model: Any  # chalie.process.config.ModelConfig of [models.default]
    services: Any  # chalie.services.Services (its memory)


@dataclass(frozen=True)
class _Reflected:
    conversation_id: str
    # Whose memories the pass stores: the conversation's principal (chalie.memory.whose).
    principal: str
    upto: int
    updated: float
    response: Any
    error: BaseException | None


class _Answered:
    def __init__(self, reminder_id: int, conversation_id: str, text: str, late: bool) -> None:
        self.reminder_id = reminder_id
        self.conversation_id = conversation_id
        self.text = text
        self.late = late


def framed(reminder: Reminder, due: float, late: bool, agent: Principal | None = None) -> str:
    """The reminder turn's user message. ``agent``: the agent token that set it, whose text
    is data written by others (chalie.calls.untrusted), never the person's request."""
    tz = zone(reminder.zone)
    when = dt.datetime.fromtimestamp(due, tz).strftime("%Y-%m-%d %H:%M %Z")
    lateness = " It is late: Chalie was not running when it was due." if late else ""
    if agent is None:
        return (
            f"[reminder {reminder.id}, due {when}]{lateness}\n"
            f"The person asked to be reminded: {reminder.text}\n"
            "Write the reminder for them in one or two sentences."
        )
    return (
        f"[reminder {reminder.id}, due {when}, set by {agent.shown()}]{lateness}\n"
        "An agent set this reminder, not the person. Its text follows.\n"
        f"{untrusted.WARNING_LINE}\n"
        f"{untrusted.clean(reminder.text)}\n"
        f"[end of the agent's text]\n"
        "Write the reminder for the agent in one or two sentences."
    )


class Scheduler(SupervisedActor):
    def __init__(
        self,
        db_path: Place,
        events: EventBus,
        port: ConversationsPort,
        loop: LoopService,
        *,
        clock: Clock | None = None,
        enabled: bool = True,
        outbox_max_age: float | None = None,
        reflection: Reflection | None = None,
        limits: ReminderLimits | None = None,
    ) -> None:
        super().__init__()
        self._limits = limits or ReminderLimits()
        self._day = ""
        self._day_turns = 0
        self._reflection = reflection
        self._ledger: ReflectionLedger | None = None
        self._reflecting: str | None = None
        self._model: ModelClient | None = None
        self.reflections = 0
        self._db_path = db_path
        self._events = events
        self._port = port
        self._loop = loop
        self._clock: Clock = clock or WallClock()
        self._enabled = enabled
        self._outbox_max_age = outbox_max_age
        self._store: ReminderStore | None = None
        self._tokens: TokenStore | None = None
        self._outbox: Outbox | None = None
        self._conn: Connection | None = None
        self._timer: int | None = None
        self._started = 0.0
        self._following = 0  # reminder turns started, not yet answered
        self._claimant = uuid.uuid4().hex[:16]  # this run's claims (chalie.schedule.store)
        self._added: Follower | None = None
        self._claimants: dict[str, LeaseWait] = {}  # live claimants elsewhere, waited on
        self.fires = 0
        self.wakes = 0

    @staticmethod
    def _create_actor_inbox() -> Any:
        return TimerInbox()

    @property
    def _timers(self) -> TimerInbox:
        inbox = self.actor_inbox
        assert isinstance(inbox, TimerInbox)
        return inbox

    # -- lifecycle ---------------------------------------------------------------------
    def on_start(self) -> None:
        self._store = ReminderStore(self._db_path, claimant=self._claimant)
        self._tokens = TokenStore(self._db_path)
        self._outbox = (
            Outbox(self._db_path)
            if self._outbox_max_age is None
            else Outbox(self._db_path, max_age=self._outbox_max_age)
        )
        self._conn = open_connection(self._db_path)
        if self._reflection is not None:
            self._ledger = ReflectionLedger(self._db_path)
            self._conversations_store = ConversationStore(self._db_path)
            self._model = ModelClient("default", self._reflection.model)
        self._started = self._clock.now()
        me = self.actor_ref
        self._clock.on_jump(lambda: _tell(me, _Wake()))
        self._added = follow(self._db_path, ADDED, lambda _payload: _tell(me, _Wake()))
        self._arm()

    def on_end(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._added is not None:
            self._added.close()
            self._added = None
        waits, self._claimants = list(self._claimants.values()), {}
        for wait in waits:
            wait.close()
        model, self._model = self._model, None
        if model is not None:
            with contextlib.suppress(Exception):
                self._loop.submit(model.aclose()).result(5)
        for closable in (self._store, self._outbox, self._conn, self._ledger, self._tokens):
            if closable is not None:
                with contextlib.suppress(Exception):
                    closable.close()
        self._store = self._outbox = self._conn = self._tokens = None
        self._ledger = None

    # -- the timer ---------------------------------------------------------------------
    def _arm(self) -> None:
        assert self._store is not None
        if self._timer is not None:
            self._timers.cancel(self._timer)
            self._timer = None
        due = self._store.next_due()
        wait = MAX_WAIT if due is None else min(MAX_WAIT, max(0.0, due - self._clock.now()))
        self._timer = self._timers.add(wait, _Wake())

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, _Wake):
            self.wakes += 1
            if self._enabled:
                self._fire_due()
                self._take_over()  # after: a firing another claimed meanwhile is waited on
            self._reflect_if_due()
            self._arm()
            return None
        if isinstance(message, _Answered):
            self._deliver(message)
            return None
        if isinstance(message, _Gone):
            self._claimants.pop(message.claimant, None)
            return self.on_receive(_Wake())
        if isinstance(message, _Reflected):
            self._reflected(message)
            return None
        return super().on_receive(message)

    # -- firing ------------------------------------------------------------------------
    def _fire_due(self) -> None:
        assert self._store is not None
        now = self._clock.now()
        for reminder in self._store.due(now, FIRE_BATCH):
            due = reminder.next_fire or now
            late = due < self._started or now - due > LATE_AFTER
            try:
                following = next_time(
                    reminder.kind, reminder.rule, reminder.created, zone(reminder.zone), now
                )
            except RuleError:
                following = None
            if not self._store.fired(
                reminder.id, at=now, late=late, next_fire=following, due=reminder.next_fire
            ):
                continue  # another daemon on the shared store claimed this firing
            self.fires += 1
            if self._turn_allowed(now):
                self._start_turn(reminder, due, late)
            else:
                log.warning(
                    "reminder turns of the day are spent: the reminder is delivered as written",
                    extra={"reminder": reminder.id, "per_day": self._limits.turns_per_day},
                )
                self._following += 1
                _tell(self.actor_ref, _Answered(reminder.id, "", reminder.text, late))
        if self._store.due(now, 1):
            _tell(self.actor_ref, _Wake())  # more than one batch was due

    def _take_over(self) -> None:
        """Fire again the firings whose claimant died before delivering their answer, and
        wait (no polling) on the leases of the claimants that live, to be woken when one
        dies."""
        assert self._store is not None
        gone, live = self._store.orphaned()
        now = self._clock.now()
        for reminder, claimant in gone:
            if not self._store.reclaim(reminder.id, claimant):
                continue  # another scheduler took it over
            log.warning(
                "a reminder fired by a scheduler that stopped before answering fires again",
                extra={"reminder": reminder.id},
            )
            self.fires += 1
            due = reminder.last_fired or now
            self._start_turn(reminder, due, True, firing=reminder.fired)
        for claimant in live - set(self._claimants):
            self._claimants[claimant] = wait_for_lease(
                self._db_path, CLAIM_LEASE + claimant, self._gone(claimant)
            )

    def _gone(self, claimant: str) -> Callable[[], None]:
        """What a wait on a live claimant's lease calls when it is free: look again."""
        me = self.actor_ref

        def gone() -> None:  # on the wait's thread
            _tell(me, _Gone(claimant))

        return gone

    def _turn_allowed(self, now: float) -> bool:
        """Whether one more reminder turn fits today's budget (counted if it does)."""
        day = utc_day(now)
        if day != self._day:
            self._day, self._day_turns = day, 0
        if self._day_turns >= self._limits.turns_per_day:
            return False
        self._day_turns += 1
        return True

    def _setter(self, reminder: Reminder) -> Principal | bool | None:
        """Who the reminder's turn runs as: None (the owner), the agent token that set it,
        or False when that token is revoked or gone (the reminder is not run)."""
        if not is_agent(reminder.principal):
            return None
        assert self._tokens is not None
        token_id = agent_name(reminder.principal)
        found = next((t for t in self._tokens.list() if t.id == token_id), None)
        if found is None or not found.active or found.scope == "owner":
            return False
        return found.principal()

    def _start_turn(
        self, reminder: Reminder, due: float, late: bool, *, firing: int | None = None
    ) -> None:
        """The reminder's turn, through the conversations port, followed to its end on the
        loop. ``firing``: which firing it is (default: the one after the row's)."""
        rid, me = reminder.id, self.actor_ref
        who = self._setter(reminder)
        if who is False:
            assert self._store is not None
            self._store.cancel(rid)
            self._store.delivered(rid)
            log.warning(
                "an agent's reminder was cancelled: its token is revoked or gone",
                extra={"reminder": rid, "principal": reminder.principal},
            )
            return
        agent = who if isinstance(who, Principal) else None
        msg = SendMessage(
            conversation_id=None,
            channel=CHANNEL if agent is None else AGENT_CHANNEL,
            text=framed(reminder, due, late, agent),
            client_msg_id=f"reminder-{rid}-{reminder.fired + 1 if firing is None else firing}",
            origin=ORIGIN,
            principal=agent,
        )

        def ended(fut: concurrent.futures.Future[TurnOutcome]) -> None:
            try:
                outcome = fut.result()
            except BaseException as exc:  # refused, unavailable, timed out: say it anyway
                log.warning("a reminder's turn did not answer: %r", exc, extra={"reminder": rid})
                _tell(me, _Answered(rid, "", reminder.text, late))
                return
            end = outcome.finished
            text = end.text if end.reason == "final" and end.text else reminder.text
            _tell(me, _Answered(rid, outcome.accepted.conversation_id, text, late))

        try:
            self._loop.submit(follow_turn(self._port, msg, timeout=TURN_TIMEOUT)).add_done_callback(
                ended
            )
        except RuntimeError as exc:  # the loop is stopping
            log.warning("a reminder's turn could not start: %s", exc, extra={"reminder": rid})
            return
        self._following += 1
        log.info("reminder fired", extra={"reminder": rid, "late": late})

    def _deliver(self, answered: _Answered) -> None:
        assert self._store is not None and self._outbox is not None
        self._following = max(0, self._following - 1)
        reminder = self._store.get(answered.reminder_id)
        if reminder is None:
            return
        self._store.answered(reminder.id, answered.text)
        target = self._chat_conversation(reminder)
        if target is None:
            self._store.delivered(reminder.id)
            log.info(
                "a reminder's answer has no chat conversation to go to",
                extra={"reminder": reminder.id},
            )
            return
        envelope = render(
            "reminder",
            ToolResult.success(
                answered.text[:MAX_TEXT],
                meta={"id": reminder.id, "late": answered.late, "text": reminder.text[:200]},
            ),
        )
        result = BackgroundResult(
            call_id=f"reminder-{reminder.id}-{reminder.fired}",
            conversation_id=target,
            tool="reminder",
            envelope=envelope,
            status="success",
        )
        result = self._outbox.put(result)
        self._store.delivered(reminder.id)  # kept in the outbox: the firing is done
        self._events.publish(target, result)

    def _chat_conversation(self, reminder: Reminder) -> str | None:
        """Where the owner hears the reminder: the chat it was set in, else their latest chat.

        An agent's reminder goes back only to the agent's own conversation.
        """
        assert self._conn is not None
        if is_agent(reminder.principal):
            return reminder.conversation_id
        try:
            if reminder.conversation_id:
                row = self._conn.execute(
                    "SELECT id FROM conversations WHERE id = ? AND channel = 'chat'",
                    (reminder.conversation_id,),
                ).fetchone()
                if row:
                    return str(row[0])
            row = self._conn.execute(
                "SELECT id FROM conversations WHERE channel = 'chat' "
                "AND origin NOT LIKE 'mcp:%' ORDER BY updated DESC LIMIT 1"
            ).fetchone()
        except StoreError:  # no conversations table yet
            return None
        return str(row[0]) if row else None

    # -- reflection -------------------------------------------------------------------
    def _reflect_if_due(self) -> None:
        """One conversation at a time: the one idle longest with news since its last pass."""
        settings, ledger, model = self._reflection, self._ledger, self._model
        if settings is None or ledger is None or model is None or self._reflecting is not None:
            return
        now = self._clock.now()
        if ledger.spent(utc_day(now)) >= settings.tokens_per_day:
            return
        for cid, updated in ledger.due(now, settings.idle, 1):
            loaded = self._conversations_store.load(cid)
            if loaded is None:
                continue
            messages = loaded.messages
            info = loaded.info
            whose = principal_of(info.channel, info.origin, info.principal)
            request = reflection_request(messages[ledger.upto(cid) :], agent=is_agent(whose))
            if request is None or whose == UNKNOWN_AGENT:  # no agent to keep them for
                ledger.done(cid, len(messages), updated)
                continue
            self._reflecting = cid
            me, upto = self.actor_ref, len(messages)

            def done(
                fut: Any,
                me: Any = me,
                cid: str = cid,
                whose: str = whose,
                upto: int = upto,
                updated: float = updated,
            ) -> None:
                try:
                    reply: Any = fut.result()
                    _tell(me, _Reflected(cid, whose, upto, updated, reply, None))
                except BaseException as exc:
                    _tell(me, _Reflected(cid, whose, upto, updated, None, exc))

            self._loop.submit(model.complete(request, lambda _text: None)).add_done_callback(done)
            return

    def _reflected(self, message: _Reflected) -> None:
        self._reflecting = None
        settings, ledger = self._reflection, self._ledger
        if settings is None or ledger is None:
            return
        if message.error is not None:
            log.warning(
                "a reflection pass failed: %s",
                message.error,
                extra={"conversation_id": message.conversation_id},
            )
            # tried: not again until the conversation has news
            ledger.done(message.conversation_id, message.upto, message.updated)
            return
        response = message.response
        usage = getattr(response, "usage", None)
        tokens = int(getattr(usage, "total", 0) or 0) or len(getattr(response, "text", "")) // 4
        ledger.spend(utc_day(self._clock.now()), tokens)
        desk = getattr(settings.services, "memory", None)
        stored = 0
        if desk is not None:
            for draft in parse_memories(getattr(response, "text", "")):
                try:
                    desk.book.store_memory(
                        draft,
                        Provenance(
                            principal=message.principal,
                            source="reflection",
                            conversation_id=message.conversation_id,
                            untrusted=desk.untrusted_in(message.conversation_id),
                        ),
                    )
                    stored += 1
                except MemoryRequestError:
                    continue
        ledger.done(message.conversation_id, message.upto, message.updated)
        self.reflections += 1
        log.info(
            "reflection pass stored memories",
            extra={"conversation_id": message.conversation_id, "stored": stored, "tokens": tokens},
        )

    # -- the API (the reminder ability and the CLI, through a ChildRef) ------------------
    def add(
        self,
        text: str,
        kind: RuleKind,
        rule: str,
        zone_name: str,
        principal: str,
        conversation_id: str | None,
    ) -> Reminder:
        assert self._store is not None
        text = " ".join(text.split())
        if not text or len(text) > MAX_TEXT:
            raise ReminderError("invalid-param", f"a reminder's text is 1 to {MAX_TEXT} characters")
        limits = self._limits
        try:
            tz = zone(zone_name)
            now = self._clock.now()
            first = first_time(kind, rule, now, tz)
            gap = shortest_gap(rule, now, tz) if kind == "every" else None
        except RuleError as exc:
            raise ReminderError(
                "invalid-param", str(exc), "pass at= (ISO time), after= (10m) or every= (RRULE)"
            ) from None
        if gap is not None and gap < limits.min_interval:
            raise ReminderError(
                "invalid-param",
                f"that rule repeats every {gap:g} s; a reminder repeats at most once every "
                f"{limits.min_interval:g} s",
                "choose a rule that repeats less often (FREQ=HOURLY, a cron line...)",
            )
        pending = self._store.listed(principal=principal, limit=limits.per_principal)
        if len(pending) >= limits.per_principal:
            raise ReminderError(
                "quota-exceeded",
                f"{limits.per_principal} reminders are pending already, the most one may have",
                "cancel some first (list shows them)",
            )
        reminder = self._store.add(
            text=text,
            kind=kind,
            rule=rule,
            zone=zone_name,
            principal=principal,
            conversation_id=conversation_id,
            created=now,
            next_fire=first,
        )
        self._arm()
        return reminder

    def cancel(self, reminder_id: int, principal: str | None = None) -> bool:
        assert self._store is not None
        done = self._store.cancel(reminder_id, principal)
        self._arm()
        return done

    def list(
        self, principal: str | None = None, pending_only: bool = True, limit: int = 100
    ) -> builtins.list[Reminder]:
        assert self._store is not None
        return self._store.listed(principal=principal, pending_only=pending_only, limit=limit)

    def get(self, reminder_id: int) -> Reminder | None:
        assert self._store is not None
        return self._store.get(reminder_id)

    def shown(self, view: Shown, limit: int = 100) -> builtins.list[Reminder]:
        assert self._store is not None
        return self._store.shown(view, limit)

    def status(self) -> dict[str, Any]:
        assert self._store is not None
        return {
            "pending": self._store.pending_count(),
            "next_due": self._store.next_due(),
            "fires": self.fires,
            "wakes": self.wakes,
            "timers": len(self._timers),
            "following": self._following,
            "reflections": self.reflections,
        }


def _tell(ref: pykka.ActorRef[Any], message: Any) -> None:
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)

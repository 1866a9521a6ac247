"""The scheduler part of the tree: the Scheduler's child spec, its client (the reminder
ability's port, ``Services.scheduler``) and the operator's reminder commands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final

import msgspec

from actors.child_ref import ChildRef
from chalie.memory.whose import OWNER
from chalie.process import control
from chalie.process.control import Args
from chalie.process.routing import Route
from chalie.process.supervision import ChildSpec
from chalie.schedule.clock import Clock
from chalie.schedule.port import ReminderError
from chalie.schedule.rules import RuleKind
from chalie.schedule.store import Reminder
from chalie.wire.messages import ControlReply

CALL_TIMEOUT: Final = 10.0

if TYPE_CHECKING:
    from actors.host import Host as Runtime  # what the root's Runtime has


class SchedulerClient:
    """The reminder ability's and the CLI's way to the Scheduler: calls through its ChildRef."""

    def __init__(self, ref: ChildRef[Any]) -> None:
        self._ref = ref.within(CALL_TIMEOUT)

    def add(
        self,
        text: str,
        kind: RuleKind,
        rule: str,
        zone_name: str,
        principal: str,
        conversation_id: str | None,
    ) -> Reminder:
        from actors.scheduler import Scheduler

        found: Reminder = self._ref.call(
            Scheduler.add, text, kind, rule, zone_name, principal, conversation_id
        )
        return found

    def cancel(self, reminder_id: int, principal: str | None = None) -> bool:
        from actors.scheduler import Scheduler

        return bool(self._ref.call(Scheduler.cancel, reminder_id, principal))

    def list(
        self, principal: str | None = None, pending_only: bool = True, limit: int = 100
    ) -> list[Reminder]:
        from actors.scheduler import Scheduler

        found: list[Reminder] = self._ref.call(Scheduler.list, principal, pending_only, limit)
        return found


class RemindersListArgs(Args):
    all: bool = False
    limit: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 100


class ReminderIdArgs(Args):
    id: Annotated[int, msgspec.Meta(ge=1)]


class ReminderAddArgs(Args):
    text: Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]
    kind: RuleKind
    rule: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    zone: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "UTC"


class ReminderCommands:
    """The operator's reminder commands (the operator is the owner)."""

    def __init__(self, desk: SchedulerClient) -> None:
        self.desk = desk

    def routes(self) -> list[Route[Any]]:
        return [
            Route("reminders.list", RemindersListArgs, self.list),
            Route("reminders.add", ReminderAddArgs, self.add),
            Route("reminders.cancel", ReminderIdArgs, self.cancel),
        ]

    def add(self, args: ReminderAddArgs) -> ControlReply:
        try:
            found = self.desk.add(args.text, args.kind, args.rule, args.zone, OWNER, None)
        except ReminderError as exc:
            return control.failure(exc.code, str(exc))
        return control.success(msgspec.to_builtins(found))

    def list(self, args: RemindersListArgs) -> ControlReply:
        rows = self.desk.list(None, not args.all, args.limit)
        return control.success([msgspec.to_builtins(r) for r in rows])

    def cancel(self, args: ReminderIdArgs) -> ControlReply:
        if not self.desk.cancel(args.id):
            return control.failure("reminder-not-found", f"no pending reminder {args.id}")
        return control.success({"id": args.id, "cancelled": True})


def scheduler_parts(rt: Runtime, clock: Clock | None) -> tuple[ChildSpec, list[Route[Any]]]:
    from actors.conversation.conversations import Conversations
    from actors.conversation.port import ActorConversations
    from actors.scheduler import Reflection, ReminderLimits, Scheduler

    cfg = rt.config
    model = cfg.models.get("default")
    reflection = (
        Reflection(
            idle=cfg.background.reflection_idle,
            tokens_per_day=cfg.background.reflection_tokens_per_day,
            model=model,
            services=rt.services,
        )
        if cfg.background.reflection and model is not None
        else None
    )
    ref = rt.child("scheduler", Scheduler)
    desk = SchedulerClient(ref)
    rt.services.scheduler = desk
    spec = ChildSpec(
        "scheduler",
        lambda: Scheduler.start(
            rt.db_path,
            rt.events,
            # the one way to the conversations; the reminder's turn is followed by follow_turn
            ActorConversations(rt.child("conversations", Conversations), rt.events),
            rt.loop,
            clock=clock,
            enabled=cfg.background.reminders,
            outbox_max_age=cfg.outbox.max_age,
            reflection=reflection,
            limits=ReminderLimits(
                cfg.background.reminder_min_interval,
                cfg.background.reminders_per_principal,
                cfg.background.reminder_turns_per_day,
            ),
        ),
        shutdown=10.0,
    )
    return spec, ReminderCommands(desk).routes()

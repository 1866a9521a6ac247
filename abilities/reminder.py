"""reminder: remind the person of something at a time, after a delay, or on a recurring rule.

A reminder fires a turn on the subconscious channel whose answer reaches the
owner's chat conversation; one missed while Chalie was down fires at the
next start, marked late. Discoverable; ``list`` is internal, ``set`` and
``cancel`` follow the channel's policy.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from chalie.ability import Ability
from chalie.memory.whose import principal_of
from chalie.personal.zone import own_zone
from chalie.result import ToolResult
from chalie.schedule.port import ReminderError, SchedulerPort
from chalie.schedule.rules import RuleError, RuleKind, zone
from chalie.schedule.store import MAX_TEXT, Reminder
from chalie.schedule.words import in_words

Short = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class ReminderParams(msgspec.Struct, forbid_unknown_fields=True):
    """Set, list or cancel reminders."""

    action: Literal["set", "list", "cancel"]
    text: (
        Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT, description="set: what")]
        | None
    ) = None
    at: (
        Annotated[Short, msgspec.Meta(description="set: <YYYY-MM-DDTHH:MM>, the person's time")]
        | None
    ) = None
    after: Annotated[Short, msgspec.Meta(description="set: <delay>: N m, N h or N d")] | None = None
    every: (
        Annotated[
            Short,
            msgspec.Meta(description="set: recurring, <RRULE> or <five-field cron>"),
        ]
        | None
    ) = None
    # None: the person's own zone ([accounts] zone), as a person means "6pm".
    zone: Annotated[Short, msgspec.Meta(description="IANA time zone of at/every")] | None = None
    id: Annotated[int, msgspec.Meta(ge=1, description="cancel: the reminder's id")] | None = None


def shown(r: Reminder) -> dict[str, object]:
    tz = zone(r.zone)
    out: dict[str, object] = {"id": r.id, "text": r.text, "rule": f"{r.kind} {r.rule}"}
    if r.next_fire is not None:
        out["next"] = dt.datetime.fromtimestamp(r.next_fire, tz).isoformat(timespec="minutes")
    out["zone"] = r.zone
    return out


class ReminderTool(Ability):
    name = "reminder"
    summary = (
        "Sets reminders for later: once on a given day, after a delay, or on a repeating "
        "schedule; lists the pending ones; cancels one by id. When one is due, Chalie tells "
        "the person in their chat."
    )
    tooltip = "Set and manage reminders"
    examples = (
        "remind me to call mum this evening",
        "set a reminder in 20 minutes to take the pizza out",
        "remind me every Monday morning to send the report",
        "what reminders do I have",
        "cancel the dentist reminder",
        "remind me on 24 December to buy a present",
        "nudge me every weekday to stand up and stretch",
    )
    Params = ReminderParams
    actions = {"set": ("text",), "list": (), "cancel": ("id",)}
    internal_actions = frozenset({"list"})
    timeout = 15.0

    def in_words(self, params: Mapping[str, Any]) -> str | None:
        """When a reminder being set fires, in words ("fires every day at 09:00; next ...")."""
        if params.get("action") != "set":
            return None
        kinds: tuple[RuleKind, ...] = ("at", "after", "every")
        given = [(k, params[k]) for k in kinds if params.get(k)]
        if len(given) != 1:
            return None
        kind, rule = given[0]
        try:
            tz = zone(str(params.get("zone") or own_zone(self.services)))
            return "fires " + in_words(kind, str(rule), time.time(), tz)
        except RuleError as exc:
            return f"the rule cannot be read ({exc}): the call will be refused"

    def _who(self) -> str:
        assert self.context is not None
        memory = getattr(self.services, "memory", None)
        principal = getattr(memory, "principal", None)
        if callable(principal):
            return str(principal(self.context))
        return principal_of(self.context.channel, "")

    def run(self, params: ReminderParams) -> ToolResult:
        desk: SchedulerPort | None = getattr(self.services, "scheduler", None)
        if desk is None or self.context is None:
            return ToolResult.error(
                "service-unavailable",
                "Reminders are not available in this runtime.",
                hint="tell the user reminders are unavailable right now.",
                meta={"action": params.action},
            )
        who = self._who()
        if params.action == "list":
            rows = desk.list(principal=who)
            return ToolResult.success(
                {"reminders": [shown(r) for r in rows]},
                meta={"action": "list", "count": len(rows)},
            )
        if params.action == "cancel":
            assert params.id is not None
            if not desk.cancel(params.id, who):
                return ToolResult.error(
                    "reminder-not-found",
                    f"No pending reminder {params.id} is yours.",
                    hint="list the reminders to find the id.",
                    meta={"action": "cancel"},
                )
            return ToolResult.success({"cancelled": params.id}, meta={"action": "cancel"})
        at = params.at
        if at is not None and params.after is not None and params.every is None:
            # "Remind me in two hours to stretch": the 1.5B model sent the person's delay
            # and a time it worked out itself (the prompt says the day, not the hour).
            # The delay is what the person said.
            at = None
        given: list[tuple[RuleKind, str]] = [
            (k, v)
            for k, v in (("at", at), ("after", params.after), ("every", params.every))
            if v is not None
        ]
        if len(given) != 1:
            return ToolResult.error(
                "invalid-param",
                "set needs exactly one of at, after or every.",
                hint=(
                    "pass at= <YYYY-MM-DDTHH:MM>, after= <a delay: N m, h or d> "
                    "or every= <RRULE or cron>."
                ),
                meta={"action": "set"},
            )
        assert params.text is not None
        kind, rule = given[0]
        try:
            reminder = desk.add(
                params.text,
                kind,
                rule,
                params.zone or own_zone(self.services),
                who,
                self.context.conversation_id,
            )
        except ReminderError as exc:
            return ToolResult.error(exc.code, str(exc), hint=exc.hint, meta={"action": "set"})
        return ToolResult.success(
            {"set": shown(reminder)}, meta={"action": "set", "id": reminder.id}
        )

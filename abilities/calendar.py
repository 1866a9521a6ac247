"""calendar: events from CalDAV calendars and ICS subscriptions; free/busy; create, change, delete.

Reading (``list``, ``free_busy``) covers every calendar account unless one is
named; recurrences are expanded and times shown in ``zone``. Writing
(``create_event``, ``update_event``, ``delete_event``) goes to a CalDAV
account (ICS subscriptions are read-only). Each action is its own
permission (``calendar.delete_event`` ...), so the writes ask by default.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from chalie.ability import Ability
from chalie.accounts.failure import AccountFailure
from chalie.calls.untrusted import success as untrusted_success
from chalie.result import ToolResult

if TYPE_CHECKING:
    from chalie.personal.runtime import PersonalRuntime

MAX_RANGE_DAYS = 366
Text = Annotated[str, msgspec.Meta(max_length=2000)]
Short = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Moment = Annotated[
    str,
    msgspec.Meta(
        min_length=10,
        max_length=40,
        # Short enough to be shown in a compact tool listing (chalie.providers.signatures):
        # without it the 1.5B model listed "tomorrow" with no start (so today). A time
        # without an offset is in ``zone``.
        description="<YYYY-MM-DD> (all day) or <YYYY-MM-DDTHH:MM>",
    ),
]


class CalendarParams(msgspec.Struct, forbid_unknown_fields=True):
    """Read or change the user's calendars."""

    action: Literal["list", "free_busy", "create_event", "update_event", "delete_event"] = "list"
    start: Moment | None = None
    end: Moment | None = None
    zone: (
        Annotated[
            str,
            msgspec.Meta(max_length=64, description="IANA zone for times; default: the user's"),
        ]
        | None
    ) = None
    account: Short | None = None
    calendar: Short | None = None
    id: (
        Annotated[str, msgspec.Meta(max_length=1024, description="an event id from list")] | None
    ) = None
    title: Short | None = None
    location: Text | None = None
    description: Text | None = None
    recurrence: (
        Annotated[str, msgspec.Meta(max_length=300, description="RRULE, e.g. FREQ=WEEKLY;COUNT=4")]
        | None
    ) = None
    min_minutes: Annotated[int, msgspec.Meta(ge=5, le=1440)] = 30
    occurrence: (
        Annotated[
            str,
            msgspec.Meta(
                min_length=10,
                max_length=40,
                description="update_event / delete_event: only this occurrence of a "
                "recurring event (its occurrence, as list shows it); without it the whole "
                "series changes or goes",
            ),
        ]
        | None
    ) = None


class Calendar(Ability):
    name = "calendar"
    summary = (
        "The user's own calendar: the appointments on it for a day or a week, "
        "free time for a meeting, and adding, moving, changing or cancelling an appointment."
    )
    tooltip = "Calendar: events, free time, scheduling"
    examples = (
        "what's on my calendar tomorrow",
        "do I have any meetings this afternoon",
        "find a free slot on Thursday for a one-hour meeting",
        "add dentist appointment on Friday at 3pm to my calendar",
        "move my dentist appointment to next Tuesday",
        "cancel the team lunch event next week",
        "show my schedule for next week",
        "schedule a weekly standup meeting every Monday at 9",
    )
    Params = CalendarParams
    actions = {
        "list": (),
        "free_busy": (),
        "create_event": ("title", "start"),
        "update_event": ("id",),
        "delete_event": ("id",),
    }
    timeout = 60.0

    def reach(self, params: Mapping[str, Any]) -> str | None:
        """A delete is sensitive: only an allow of ``calendar.delete_event`` itself covers it."""
        if params.get("action") != "delete_event":
            return None
        occurrence = params.get("occurrence")
        which = f"the occurrence {occurrence} of" if occurrence else "every occurrence of"
        account = params.get("account") or "the default account"
        return f"deletes {which} calendar event {params.get('id')!s} in {account!s}"

    def run(self, params: CalendarParams) -> ToolResult:
        from chalie.personal.runtime import with_accounts

        return with_accounts(self, lambda rt: self._run(rt, params))

    def _run(self, rt: PersonalRuntime, p: CalendarParams) -> ToolResult:
        from chalie.personal import calendar as ical
        from chalie.personal import calendars

        zone_name = p.zone or rt.settings.zone
        zone = ical.zone_of(zone_name)
        meta = {"action": p.action}
        if p.action in ("list", "free_busy"):
            lo, hi = self._range(p, zone)
            got = calendars.window(rt, p.account, lo, hi, zone, p.calendar)
            body: dict[str, Any] = {
                "zone": zone_name,
                "from": lo.isoformat(timespec="minutes"),
                "to": hi.isoformat(timespec="minutes"),
            }
            if p.action == "list":
                body["events"] = got.occurrences
                body["count"] = len(got.occurrences)
            else:
                busy = ical.busy_blocks(got.occurrences, lo, hi, zone)
                free = ical.free_slots(busy, lo, hi, dt.timedelta(minutes=p.min_minutes))
                body["busy"] = [
                    {
                        "start": s.isoformat(timespec="minutes"),
                        "end": e.isoformat(timespec="minutes"),
                    }
                    for s, e in busy
                ]
                body["free"] = [
                    {
                        "start": s.isoformat(timespec="minutes"),
                        "end": e.isoformat(timespec="minutes"),
                    }
                    for s, e in free
                ]
            if got.skipped:
                body["skipped"] = got.skipped[:20]
            if got.unavailable:
                body["unavailable"] = got.unavailable
            # Titles and descriptions come from invitations others wrote.
            return untrusted_success(body, meta={**meta, "events": len(got.occurrences)})
        if p.action == "create_event":
            assert p.title is not None and p.start is not None
            start = ical.parse_moment(p.start, zone, "start")
            end = None if p.end is None else ical.parse_moment(p.end, zone, "end")
            if end is None or end == start:
                # No end, or one equal to the start (the real 1.5B model's way of giving
                # none): an hour, or the whole day for a date.
                timed = isinstance(start, dt.datetime)
                end = start + (dt.timedelta(hours=1) if timed else dt.timedelta(days=1))
            made = calendars.create(
                rt,
                p.account,
                p.calendar,
                title=p.title,
                start=start,
                end=end,
                location=p.location or "",
                description=p.description or "",
                recurrence=p.recurrence or "",
            )
            return ToolResult.success({"created": made}, meta=meta)
        assert p.id is not None
        if p.action == "delete_event":
            when = (
                None
                if p.occurrence is None
                else ical.parse_moment(p.occurrence, zone, "occurrence")
            )
            return ToolResult.success(calendars.delete(rt, p.account, p.id, when), meta=meta)
        changes = {
            "title": p.title,
            "start": None if p.start is None else ical.parse_moment(p.start, zone, "start"),
            "end": None if p.end is None else ical.parse_moment(p.end, zone, "end"),
            "location": p.location,
            "description": p.description,
            "recurrence": p.recurrence,
        }
        if all(v is None for v in changes.values()):
            return ToolResult.error(
                "missing-params",
                "update_event needs at least one field to change.",
                hint="pass title, start, end, location, description or recurrence with the id.",
                meta={"param": "title"},
            )
        when = None
        if p.occurrence is not None:
            if p.recurrence is not None:
                return ToolResult.error(
                    "invalid-param",
                    "one occurrence has no recurrence of its own.",
                    hint="drop occurrence= to change the series' recurrence.",
                    meta={"param": "recurrence"},
                )
            when = ical.parse_moment(p.occurrence, zone, "occurrence")
        return ToolResult.success(
            {"updated": calendars.update(rt, p.account, p.id, when, **changes)}, meta=meta
        )

    @staticmethod
    def _range(p: CalendarParams, zone: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
        from chalie.personal import calendar as ical

        if p.start is None:
            lo = dt.datetime.combine(dt.datetime.now(zone).date(), dt.time(), zone)
        else:
            lo = ical.as_datetime(ical.parse_moment(p.start, zone, "start"), zone)
        if p.end is None:
            hi = lo + dt.timedelta(days=1)
        else:
            end = ical.parse_moment(p.end, zone, "end")
            # An end date is inclusive for people: "until Friday" means through Friday.
            hi = ical.as_datetime(end, zone)
            if not isinstance(end, dt.datetime):
                hi += dt.timedelta(days=1)
        if hi <= lo:
            raise AccountFailure("invalid-param", "end must be after start", param="end")
        if hi - lo > dt.timedelta(days=MAX_RANGE_DAYS):
            raise AccountFailure(
                "invalid-param",
                f"the range is over {MAX_RANGE_DAYS} days",
                hint="ask for at most a year at a time.",
                param="end",
            )
        return lo, hi

"""clock: the current date and time in an IANA time zone, and conversion between zones."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from typing import Annotated, Literal

import msgspec

from chalie.ability import Ability
from chalie.result import ToolResult

Zone = Annotated[
    str, msgspec.Meta(min_length=1, max_length=64, description="<Region/City> IANA time zone name")
]


class ClockParams(msgspec.Struct, forbid_unknown_fields=True):
    """Read the clock in a zone, or convert a time from one zone to another."""

    action: Literal["now", "convert"] = "now"
    zone: Zone = "UTC"
    time: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=64, description="<ISO 8601 date-time> to convert (convert only)"
            ),
        ]
        | None
    ) = None
    to_zone: Zone | None = None


def _zone(name: str) -> zoneinfo.ZoneInfo | ToolResult:
    try:
        if name.startswith(("/", ".")) or ".." in name:
            raise ValueError(name)
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return ToolResult.error(
            "invalid-param",
            f"{name!r} is not an IANA time zone.",
            hint="use a name like Europe/Malta, America/New_York or UTC.",
            meta={"param": "zone"},
        )


def _describe(moment: dt.datetime, zone: str) -> dict[str, object]:
    offset = moment.utcoffset() or dt.timedelta()
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return {
        "zone": zone,
        "iso": moment.isoformat(timespec="seconds"),
        "date": moment.strftime("%Y-%m-%d"),
        "time": moment.strftime("%H:%M:%S"),
        "weekday": moment.strftime("%A"),
        "utc_offset": f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}",
        "abbreviation": moment.tzname(),
    }


class Clock(Ability):
    name = "clock"
    summary = (
        "Tells the current date, time and weekday in any IANA time zone, and converts "
        "a date-time from one time zone to another."
    )
    tooltip = "Current time and time-zone conversion"
    examples = (
        "what time is it in Tokyo right now",
        "what's today's date",
        "convert 3pm London time to New York time",
        "which day of the week is it in Sydney",
        "what is the time difference between Malta and California",
        "if it's 9am in Berlin, what time is it in Singapore",
        "current UTC time",
    )
    Params = ClockParams
    actions = {"now": (), "convert": ("time", "to_zone")}
    aliases = {
        "timezone": "zone",
        "time_zone": "zone",
        "tz": "zone",
        "location": "zone",
        "from_zone": "zone",
        "target_zone": "to_zone",
        "datetime": "time",
    }
    timeout = 5.0
    # Pure and bounded: run on the dispatcher's thread (actors/executors/immediate.py).
    isolation = "immediate"

    def run(self, params: ClockParams) -> ToolResult:
        src = _zone(params.zone)
        if isinstance(src, ToolResult):
            return src
        if params.action == "now":
            return ToolResult.success(
                _describe(dt.datetime.now(src), params.zone), meta={"action": "now"}
            )
        assert params.time is not None and params.to_zone is not None
        dst = _zone(params.to_zone)
        if isinstance(dst, ToolResult):
            return dst
        try:
            moment = dt.datetime.fromisoformat(params.time)
        except ValueError:
            return ToolResult.error(
                "invalid-param",
                f"{params.time!r} is not an ISO 8601 date-time.",
                hint="pass time like 2026-11-30T15:00 (the zone goes in zone=).",
                meta={"param": "time"},
            )
        moment = moment.replace(tzinfo=src) if moment.tzinfo is None else moment.astimezone(src)
        return ToolResult.success(
            {
                "from": _describe(moment, params.zone),
                "to": _describe(moment.astimezone(dst), params.to_zone),
            },
            meta={"action": "convert"},
        )

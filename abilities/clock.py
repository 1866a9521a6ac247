"""clock: the current date and time in an IANA time zone, and conversion between zones.

A zone may be written as a model or a person would write it: the IANA name
(``Asia/Tokyo``), a city or country that has one zone (``Tokyo``, ``new york``,
``Singapore``), or a common abbreviation (``CET``, ``PST``). No zone means the
person's own (``[accounts] zone``). A time to convert may be a whole ISO 8601
date-time or only a time of day (``9am``, ``09:00``, ``21:30``), which is today's
in the zone it is given in.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import zoneinfo
from typing import Annotated, Final, Literal

import msgspec

from chalie.ability import Ability
from chalie.personal.zone import own_zone
from chalie.result import ToolResult

Zone = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=64,
        description="<Region/City> IANA zone or a city; convert: where the time is given",
    ),
]
# Named apart from zone: the real 1.5B model swapped the two when both read "a zone".
ToZone = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=64, description="convert: the zone or city to convert into"
    ),
]


class ClockParams(msgspec.Struct, forbid_unknown_fields=True):
    """Read the clock in a zone, or convert a time from one zone to another."""

    action: Literal["now", "convert"] = "now"
    # None: the person's own zone ([accounts] zone).
    zone: Zone | None = None
    time: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=64,
                description="convert: <HH:MM> today, or <YYYY-MM-DDTHH:MM> for another day",
            ),
        ]
        | None
    ) = None
    to_zone: ToZone | None = None


# Places people name whose zone is not named after them (or is named after another city).
PLACES: Final[dict[str, str]] = {
    "beijing": "Asia/Shanghai",
    "china": "Asia/Shanghai",
    "hong kong": "Asia/Hong_Kong",
    "india": "Asia/Kolkata",
    "mumbai": "Asia/Kolkata",
    "delhi": "Asia/Kolkata",
    "new delhi": "Asia/Kolkata",
    "bangalore": "Asia/Kolkata",
    "japan": "Asia/Tokyo",
    "korea": "Asia/Seoul",
    "south korea": "Asia/Seoul",
    "uk": "Europe/London",
    "england": "Europe/London",
    "britain": "Europe/London",
    "germany": "Europe/Berlin",
    "france": "Europe/Paris",
    "spain": "Europe/Madrid",
    "italy": "Europe/Rome",
    "malta": "Europe/Malta",
    "valletta": "Europe/Malta",
    "ireland": "Europe/Dublin",
    "portugal": "Europe/Lisbon",
    "netherlands": "Europe/Amsterdam",
    "switzerland": "Europe/Zurich",
    "geneva": "Europe/Zurich",
    "munich": "Europe/Berlin",
    "frankfurt": "Europe/Berlin",
    "hamburg": "Europe/Berlin",
    "milan": "Europe/Rome",
    "barcelona": "Europe/Madrid",
    "russia": "Europe/Moscow",
    "turkey": "Europe/Istanbul",
    "egypt": "Africa/Cairo",
    "israel": "Asia/Jerusalem",
    "dubai": "Asia/Dubai",
    "uae": "Asia/Dubai",
    "thailand": "Asia/Bangkok",
    "vietnam": "Asia/Ho_Chi_Minh",
    "hanoi": "Asia/Bangkok",
    "indonesia": "Asia/Jakarta",
    "philippines": "Asia/Manila",
    "new zealand": "Pacific/Auckland",
    "wellington": "Pacific/Auckland",
    "canberra": "Australia/Sydney",
    "san francisco": "America/Los_Angeles",
    "california": "America/Los_Angeles",
    "seattle": "America/Los_Angeles",
    "las vegas": "America/Los_Angeles",
    "washington": "America/New_York",
    "washington dc": "America/New_York",
    "boston": "America/New_York",
    "miami": "America/New_York",
    "atlanta": "America/New_York",
    "dallas": "America/Chicago",
    "houston": "America/Chicago",
    "austin": "America/Chicago",
    "brazil": "America/Sao_Paulo",
    "rio de janeiro": "America/Sao_Paulo",
    "argentina": "America/Argentina/Buenos_Aires",
    "buenos aires": "America/Argentina/Buenos_Aires",
    "montreal": "America/Toronto",
    "quebec": "America/Toronto",
    "ottawa": "America/Toronto",
    "hawaii": "Pacific/Honolulu",
    "south africa": "Africa/Johannesburg",
    "cape town": "Africa/Johannesburg",
    "kenya": "Africa/Nairobi",
    "nigeria": "Africa/Lagos",
    "gmt": "Etc/GMT",
    "utc": "UTC",
    "z": "UTC",
    "cet": "CET",
    "cest": "CET",
    "est": "America/New_York",
    "edt": "America/New_York",
    "et": "America/New_York",
    "cst": "America/Chicago",
    "cdt": "America/Chicago",
    "mst": "America/Denver",
    "mdt": "America/Denver",
    "pst": "America/Los_Angeles",
    "pdt": "America/Los_Angeles",
    "pt": "America/Los_Angeles",
    "jst": "Asia/Tokyo",
    "ist": "Asia/Kolkata",
    "bst": "Europe/London",
    "aest": "Australia/Sydney",
}


@functools.cache
def _cities() -> dict[str, str]:
    """Each IANA zone by the last part of its name (``tokyo`` -> ``Asia/Tokyo``), where the
    part names one zone only; the canonical areas win over the legacy ones."""
    areas = ("Africa", "America", "Antarctica", "Asia", "Atlantic", "Australia", "Europe")
    out: dict[str, str] = {}
    for name in sorted(zoneinfo.available_timezones()):
        if "/" not in name:
            continue
        out[name.lower().replace("_", " ")] = name
        city = name.rsplit("/", 1)[1].replace("_", " ").lower()
        if name.split("/", 1)[0] in areas or city not in out:
            out.setdefault(city, name)
    return out


def zone_name(text: str) -> str | None:
    """The IANA zone a person or a model meant by ``text``; None when there is none."""
    name = text.strip()
    if name.startswith(("/", ".")) or ".." in name or "\x00" in name:
        return None
    try:
        zoneinfo.ZoneInfo(name)
        return name
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        pass
    key = " ".join(re.split(r"[\s_,]+", name.lower())).strip()
    for candidate in (key, key.split(" ")[0] if "," in name else key):
        if candidate in PLACES:
            return PLACES[candidate]
        if candidate in _cities():
            return _cities()[candidate]
    # "Tokyo, Japan", "Berlin Germany": the place before the country
    first = re.split(r"[,(]", name.lower())[0].strip()
    return PLACES.get(first) or _cities().get(first)


def _zone(name: str, param: str = "zone") -> tuple[str, zoneinfo.ZoneInfo] | ToolResult:
    found = zone_name(name)
    if found is not None:
        return found, zoneinfo.ZoneInfo(found)
    return ToolResult.error(
        "invalid-param",
        f"{name[:64]!r} is not a time zone or a place with one.",
        hint=f"pass {param} as the Region/City IANA name of the place the user asked about.",
        meta={"param": param},
    )


_TIME_OF_DAY: Final = re.compile(
    r"^\s*(\d{1,2})(?:[:.h](\d{2}))?(?::(\d{2}))?\s*(am|pm|a\.m\.|p\.m\.)?\s*$", re.I
)


# A convert's time that means this moment (the 1.5B model sent "now" for "the time in Sydney").
_NOW_WORDS: Final = frozenset({"now", "current", "current time", "right now", "today"})


def _moment(text: str, zone: zoneinfo.ZoneInfo) -> dt.datetime | None:
    """A date-time (ISO 8601), a time of day today in ``zone``, or "now"; None when none."""
    if text.strip().lower() in _NOW_WORDS:
        return dt.datetime.now(zone).replace(microsecond=0)
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        m = _TIME_OF_DAY.match(text)
        if m is None:
            return None
        hour, minute, second = int(m[1]), int(m[2] or 0), int(m[3] or 0)
        half = (m[4] or "").lower().replace(".", "")
        if half and not 1 <= hour <= 12:
            return None
        if half == "pm" and hour != 12:
            hour += 12
        elif half == "am" and hour == 12:
            hour = 0
        if hour > 23 or minute > 59 or second > 59:
            return None
        today = dt.datetime.now(zone).date()
        return dt.datetime.combine(today, dt.time(hour, minute, second), tzinfo=zone)
    return moment.replace(tzinfo=zone) if moment.tzinfo is None else moment.astimezone(zone)


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
    # A convert's missing parts have one obvious reading each: no time is this moment, no
    # to_zone is the person's own zone, and neither is the time now in zone (the 1.5B
    # model answered "What's the time in Sydney?" with convert and zone alone).
    actions = {"now": (), "convert": ()}
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
    # Pure and bounded: run on the dispatcher's thread (actors/calls/executors/immediate.py).
    isolation = "immediate"

    def run(self, params: ClockParams) -> ToolResult:
        src = _zone(params.zone or own_zone(self.services))
        if isinstance(src, ToolResult):
            return src
        src_name, src_zone = src
        if params.action == "now" or (params.time is None and params.to_zone is None):
            return ToolResult.success(
                _describe(dt.datetime.now(src_zone), src_name), meta={"action": "now"}
            )
        dst = _zone(params.to_zone or own_zone(self.services), "to_zone")
        if isinstance(dst, ToolResult):
            return dst
        dst_name, dst_zone = dst
        moment = _moment(params.time or "now", src_zone)
        if moment is None:
            return ToolResult.error(
                "invalid-param",
                f"{(params.time or '')[:64]!r} is neither a date-time nor a time of day.",
                hint="pass time as the time the user gave, as HH:MM or an ISO 8601 date-time.",
                meta={"param": "time"},
            )
        return ToolResult.success(
            {
                "from": _describe(moment, src_name),
                "to": _describe(moment.astimezone(dst_zone), dst_name),
            },
            meta={"action": "convert"},
        )

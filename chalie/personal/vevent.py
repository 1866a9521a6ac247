"""The common VEVENT, read and expanded without icalendar: a cheap path for most objects.

Parsing one calendar object with icalendar costs about a millisecond and a
half, and expanding one series with recurring-ical-events about two; a month
view over a few hundred objects spends most of its time there. Most objects
are plain: VEVENTs whose times are dates, UTC, floating, or in an IANA zone,
an RRULE of days, weeks, months or years, EXDATEs, overrides by
RECURRENCE-ID, and text. :func:`read` reads exactly that subset (into
:class:`Light` events) and answers ``None`` for anything else (a TZID that is
no IANA zone, RDATE, a RANGE, a sub-daily rule, a value it cannot read, a
DTSTART the rule does not produce...): the caller then parses the object with
icalendar, which also names what is broken. Declining is always safe; a test
holds the two paths to the same answers.

Expansion (:func:`occurrences`) uses dateutil's rrule on the event's own wall
clock (a 09:00 Europe/Berlin series stays 09:00 across the DST change), drops
EXDATEs and the instances an override replaces, and adds the overrides.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from dateutil import rrule as du

Moment = dt.date | dt.datetime
# Components a calendar object may hold on this path; anything else declines it.
_KNOWN: Final = frozenset({"VCALENDAR", "VEVENT", "VTIMEZONE", "STANDARD", "DAYLIGHT", "VALARM"})
_SKIPPED: Final = frozenset({"VTIMEZONE", "STANDARD", "DAYLIGHT", "VALARM"})
_FREQS: Final = frozenset({"DAILY", "WEEKLY", "MONTHLY", "YEARLY"})
_RULE_PARTS: Final = frozenset(
    {"FREQ", "UNTIL", "COUNT", "INTERVAL", "BYDAY", "BYMONTHDAY", "BYYEARDAY", "BYWEEKNO",
     "BYMONTH", "BYSETPOS", "WKST"}
)  # fmt: skip
_TIME_PROPS: Final = frozenset({"DTSTART", "DTEND", "RECURRENCE-ID"})
_TEXT_PROPS: Final = frozenset({"UID", "SUMMARY", "LOCATION", "DESCRIPTION", "STATUS", "TRANSP"})
# Present in a VEVENT, these need the full parser.
_DECLINED: Final = frozenset({"RDATE", "EXRULE"})
_STAMP: Final = re.compile(r"(\d{4})(\d{2})(\d{2})(?:T(\d{2})(\d{2})(\d{2})(Z?))?")
_DURATION: Final = re.compile(
    r"([+-])?P(?:(\d+)W|(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?)"
)
_NAME: Final = re.compile(r"[A-Za-z0-9-]+")
_READ_PROPS: Final = _TIME_PROPS | _TEXT_PROPS | {"RRULE", "DURATION", "EXDATE"} | _DECLINED
_UNESCAPE: Final = re.compile(r"\\([\\;,nN])")
# A series whose rule starts further back than this is left to the full parser.
MAX_STEPS: Final = 200_000
UTC: Final = zoneinfo.ZoneInfo("UTC")


@dataclass(frozen=True, slots=True)
class Light:
    """One VEVENT of the common subset (a master, a single event, or an override)."""

    uid: str
    start: Moment
    end: Moment  # DTEND, or DTSTART + DURATION, or the RFC 5545 default
    rule: du.rrule | None
    exdates: frozenset[Moment]
    recurrence_id: Moment | None
    summary: str
    location: str
    description: str
    status: str
    transp: str


@dataclass(frozen=True, slots=True)
class Series:
    """One UID's events: its master (if any) and its overrides by RECURRENCE-ID."""

    uid: str
    master: Light | None
    overrides: tuple[Light, ...]

    @property
    def recurring(self) -> bool:
        return self.master is None or self.master.rule is not None or bool(self.overrides)


class _Decline(Exception):
    pass


@lru_cache(maxsize=512)
def _zone(name: str) -> zoneinfo.ZoneInfo:
    if not name or name.startswith(("/", ".")) or ".." in name or len(name) > 64:
        raise _Decline
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise _Decline from None


def _moment(value: str, params: dict[str, str]) -> Moment:
    m = _STAMP.fullmatch(value.strip())
    kind = params.get("VALUE", "").upper()
    if m is None or kind not in ("", "DATE", "DATE-TIME"):
        raise _Decline
    y, mo, d, hh, mm, ss, z = m.groups()
    try:
        if hh is None:
            if kind == "DATE-TIME" or "TZID" in params:
                raise _Decline
            return dt.date(int(y), int(mo), int(d))
        if kind == "DATE":
            raise _Decline
        moment = dt.datetime(int(y), int(mo), int(d), int(hh), int(mm), int(ss))
    except ValueError:
        raise _Decline from None
    if z:
        if "TZID" in params:
            raise _Decline
        return moment.replace(tzinfo=UTC)
    if "TZID" in params:
        return moment.replace(tzinfo=_zone(params["TZID"]))
    return moment


def _duration(value: str) -> dt.timedelta:
    m = _DURATION.fullmatch(value.strip())
    if m is None or value.strip() in ("P", "PT", "+P", "-P"):
        raise _Decline
    sign, w, d, h, mi, s = m.groups()
    delta = dt.timedelta(
        weeks=int(w or 0), days=int(d or 0), hours=int(h or 0), minutes=int(mi or 0),
        seconds=int(s or 0),
    )  # fmt: skip
    return -delta if sign == "-" else delta


def _text(value: str) -> str:
    return _UNESCAPE.sub(lambda m: "\n" if m.group(1) in "nN" else m.group(1), value)


def _same_kind(a: Moment, b: Moment) -> bool:
    if isinstance(a, dt.datetime) != isinstance(b, dt.datetime):
        return False
    if isinstance(a, dt.datetime) and isinstance(b, dt.datetime):
        return (a.tzinfo is None) == (b.tzinfo is None)
    return True


def _naive(moment: Moment) -> dt.datetime:
    """The rule's clock for an all-day (a date) event: midnight, no zone."""
    if isinstance(moment, dt.datetime):
        return moment
    return dt.datetime.combine(moment, dt.time())


_MONTH_DAYS: Final = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _numbers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise _Decline from None


def _never(parts: dict[str, str]) -> bool:
    """A rule whose BY parts no date can meet (the 30th of February).

    dateutil would look for one up to the year 9999: seconds of CPU for a rule
    someone else wrote into an invitation.
    """
    months = _numbers(parts["BYMONTH"]) if "BYMONTH" in parts else list(range(1, 13))
    if any(not 1 <= m <= 12 for m in months):
        raise _Decline
    if "BYMONTHDAY" in parts:
        longest = max(_MONTH_DAYS[m - 1] for m in months)
        if all(d == 0 or abs(d) > longest for d in _numbers(parts["BYMONTHDAY"])):
            return True
    if "BYYEARDAY" in parts and all(d == 0 or abs(d) > 366 for d in _numbers(parts["BYYEARDAY"])):
        return True
    return "BYWEEKNO" in parts and all(w == 0 or abs(w) > 53 for w in _numbers(parts["BYWEEKNO"]))


def _rule(value: str, start: Moment) -> du.rrule | None:
    """The RRULE as dateutil's; None when it can never occur (the event is its DTSTART)."""
    parts: dict[str, str] = {}
    for part in value.split(";"):
        key, sep, v = part.partition("=")
        key = key.upper()
        if not sep or key in parts or key not in _RULE_PARTS:
            raise _Decline
        parts[key] = v
    if parts.get("FREQ", "").upper() not in _FREQS:
        raise _Decline
    if "UNTIL" in parts:
        until = _moment(parts["UNTIL"], {})
        # UNTIL must speak the DTSTART's kind (a date, UTC for a zoned start, floating).
        if isinstance(start, dt.datetime) and start.tzinfo is not None:
            if not (isinstance(until, dt.datetime) and until.tzinfo is not None):
                raise _Decline
        elif not _same_kind(until, start):
            raise _Decline
    if _never(parts):
        return None  # RFC 5545: DTSTART is always the first instance
    first = _naive(start)
    try:
        # cache: the instances found once are kept, each later month view reads them again
        rule = du.rrulestr("RRULE:" + value, dtstart=first, forceset=False, cache=True)
    except (ValueError, TypeError, OverflowError, KeyError, IndexError):
        raise _Decline from None
    if not isinstance(rule, du.rrule):
        raise _Decline
    # RFC 5545 counts DTSTART as the first instance even when the rule would not produce
    # it; dateutil does not. Only series that start on their own rule take this path.
    produced = next(iter(rule), None)
    if produced != first:
        raise _Decline
    return rule


def _event(props: list[tuple[str, dict[str, str], str]]) -> Light:
    seen: dict[str, tuple[dict[str, str], str]] = {}
    exdates: list[Moment] = []
    rrule_text: str | None = None
    duration: dt.timedelta | None = None
    for name, params, value in props:
        if name in _DECLINED:
            raise _Decline
        if name == "EXDATE":
            exdates.extend(_moment(v, params) for v in value.split(","))
            continue
        if name == "RECURRENCE-ID" and "RANGE" in params:
            raise _Decline
        if name in _TIME_PROPS or name in _TEXT_PROPS or name in ("RRULE", "DURATION"):
            if name in seen:
                raise _Decline
            seen[name] = (params, value)
            if name == "RRULE":
                rrule_text = value
            elif name == "DURATION":
                duration = _duration(value)
    if "DTSTART" not in seen or "UID" not in seen:
        raise _Decline
    start = _moment(seen["DTSTART"][1], seen["DTSTART"][0])
    if "DTEND" in seen:
        if duration is not None:
            raise _Decline
        end = _moment(seen["DTEND"][1], seen["DTEND"][0])
        if not _same_kind(end, start):
            raise _Decline
    elif duration is not None:
        if not isinstance(start, dt.datetime) and duration % dt.timedelta(days=1):
            raise _Decline
        end = start + duration
    else:
        end = start + dt.timedelta(days=1) if not isinstance(start, dt.datetime) else start
    rid = None
    if "RECURRENCE-ID" in seen:
        rid = _moment(seen["RECURRENCE-ID"][1], seen["RECURRENCE-ID"][0])
        if rrule_text is not None:
            raise _Decline
    if any(not _same_kind(x, start) for x in exdates):
        raise _Decline
    return Light(
        uid=_text(seen["UID"][1]),
        start=start,
        end=end,
        rule=None if rrule_text is None else _rule(rrule_text, start),
        exdates=frozenset(exdates),
        recurrence_id=rid,
        summary=_text(seen.get("SUMMARY", ({}, ""))[1]),
        location=_text(seen.get("LOCATION", ({}, ""))[1]),
        description=_text(seen.get("DESCRIPTION", ({}, ""))[1]),
        status=_text(seen.get("STATUS", ({}, ""))[1]),
        transp=_text(seen.get("TRANSP", ({}, ""))[1]),
    )


def _lines(text: str) -> Iterator[str]:
    unfolded = text.replace("\r\n", "\n").replace("\n ", "").replace("\n\t", "")
    for line in unfolded.split("\n"):
        if line.strip():
            yield line


def _split(line: str) -> tuple[str, dict[str, str], str] | None:
    """(NAME, params, value) of a property this path reads; None for any other property."""
    m = _NAME.match(line)
    if m is None:
        raise _Decline
    name = m.group(0).upper()
    if name not in _READ_PROPS:
        return None
    params: dict[str, str] = {}
    i, n = m.end(), len(line)
    while i < n and line[i] == ";":
        eq = line.find("=", i + 1)
        if eq < 0:
            raise _Decline
        key = line[i + 1 : eq].upper()
        i = eq + 1
        if i < n and line[i] == '"':
            close = line.find('"', i + 1)
            if close < 0:
                raise _Decline
            value, i = line[i + 1 : close], close + 1
        else:
            stop = i
            while stop < n and line[stop] not in ";:":
                stop += 1
            value, i = line[i:stop], stop
        params[key] = value
    if i >= n or line[i] != ":":
        raise _Decline
    return name, params, line[i + 1 :]


def read(text: str) -> list[Series] | None:
    """The object's events grouped by UID, or None when it is not of the common subset."""
    try:
        return _read(text)
    except _Decline:
        return None


def _read(text: str) -> list[Series]:
    stack: list[str] = []
    events: list[Light] = []
    current: list[tuple[str, dict[str, str], str]] | None = None
    for line in _lines(text):
        upper = line[:6].upper()
        if upper == "BEGIN:":
            comp = line[6:].strip().upper()
            if comp not in _KNOWN or (not stack and comp != "VCALENDAR"):
                raise _Decline
            if comp == "VEVENT":
                if stack != ["VCALENDAR"]:
                    raise _Decline
                current = []
            stack.append(comp)
            continue
        if line[:4].upper() == "END:":
            comp = line[4:].strip().upper()
            if not stack or stack[-1] != comp:
                raise _Decline
            stack.pop()
            if comp == "VEVENT":
                assert current is not None
                events.append(_event(current))
                current = None
            continue
        if not stack:
            raise _Decline
        if stack[-1] != "VEVENT":
            if stack[-1] == "VTIMEZONE" and line[:5].upper() == "TZID:":
                _zone(line[5:].strip())  # a zone of its own making: the full parser
            continue
        assert current is not None
        prop = _split(line)
        if prop is not None:
            current.append(prop)
    if stack or not events:
        raise _Decline
    groups: dict[str, list[Light]] = {}
    for e in events:
        groups.setdefault(e.uid, []).append(e)
    out: list[Series] = []
    for uid, group in groups.items():
        masters = [e for e in group if e.recurrence_id is None]
        overrides = tuple(e for e in group if e.recurrence_id is not None)
        if len(masters) > 1:
            raise _Decline
        master = masters[0] if masters else None
        if master is not None and overrides:
            if master.rule is None:
                raise _Decline
            for o in overrides:
                assert o.recurrence_id is not None
                if not _same_kind(o.recurrence_id, master.start):
                    raise _Decline
        out.append(Series(uid, master, overrides))
    return out


# -- expansion -------------------------------------------------------------------------------


def key(moment: Moment) -> Moment:
    """A moment compared as an instant (aware), a wall time (floating) or a day (a date)."""
    if isinstance(moment, dt.datetime) and moment.tzinfo is not None:
        return moment.astimezone(UTC)
    return moment


def _local(moment: dt.datetime, like: Moment, zone: dt.tzinfo) -> dt.datetime:
    """``moment`` (aware) on the clock of ``like``: aware stays aware, else the display zone's."""
    if isinstance(like, dt.datetime) and like.tzinfo is not None:
        return moment
    return moment.astimezone(zone).replace(tzinfo=None)


def starts(
    event: Light, lo: dt.datetime, hi: dt.datetime, zone: dt.tzinfo, limit: int
) -> Iterator[tuple[Moment, Moment]]:
    """(start, end) of the master's instances that may overlap [lo, hi), EXDATEs dropped.

    Candidates, not answers: the caller keeps those that overlap (the same test as for
    single events). At most ``limit`` of them.
    """
    assert event.rule is not None
    length: dt.timedelta = event.end - event.start  # type: ignore[operator]
    window_lo = _local(lo, event.start, zone) - max(length, dt.timedelta()) - dt.timedelta(days=1)
    window_hi = _local(hi, event.start, zone) + dt.timedelta(days=1)
    excluded = {key(x) for x in event.exdates}
    count = 0
    steps = 0
    for at in event.rule:
        steps += 1
        if steps > MAX_STEPS:
            raise OverflowError("the series has too many instances before the window")
        if at < window_lo:
            continue
        if at >= window_hi:
            break
        first: Moment = at if isinstance(event.start, dt.datetime) else at.date()
        if isinstance(first, dt.datetime) and isinstance(event.start, dt.datetime):
            first = first.replace(tzinfo=event.start.tzinfo)
        if key(first) in excluded:
            continue
        last: Moment = first + length
        yield first, last
        count += 1
        if count >= limit:
            break

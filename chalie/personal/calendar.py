"""Events: parse iCalendar, expand recurrences in a range, free/busy, build and change VEVENTs.

Pure functions over text (icalendar parses, recurring-ical-events expands
RRULE/RDATE/EXDATE and overridden instances). A calendar object that does
not parse, or one event in it that cannot be expanded, is skipped and named
in ``skipped``: one malformed VEVENT never hides the rest of the calendar.

Times come back in the zone the caller asks for, as ISO 8601 with the
offset of that moment (so a weekly 09:00 Europe/Berlin meeting reads 08:00Z
before the DST change and 07:00Z after it). All-day events stay dates
(``end`` exclusive, as iCalendar has it). Floating times are read in the
display zone.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import uuid
import zoneinfo
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import icalendar
import recurring_ical_events

from chalie.accounts.failure import AccountFailure
from chalie.personal import vevent

# icalendar's own types say a property may be any of a dozen things; the code below checks
# what it reads (a DTSTART that is not a date or date-time is skipped as broken), so the
# parsed objects are handled as Any here.
Event = Any
Ical = Any
MAX_TEXT: Final = 500
MAX_OCCURRENCES: Final = 2000
PRODID: Final = "-//Chalie//personal abilities//EN"
# Parts an RRULE may carry (RFC 5545 3.3.10); anything else is refused before it is stored.
RRULE_PARTS: Final = frozenset(
    {"FREQ", "UNTIL", "COUNT", "INTERVAL", "BYSECOND", "BYMINUTE", "BYHOUR", "BYDAY",
     "BYMONTHDAY", "BYYEARDAY", "BYWEEKNO", "BYMONTH", "BYSETPOS", "WKST"}
)  # fmt: skip


@dataclass(frozen=True)
class Source:
    """Where an event comes from: for ids, names and errors."""

    account: str
    calendar: str
    href: str
    etag: str = ""


@dataclass
class Parsed:
    """One calendar object: its events grouped by UID.

    Read by :mod:`.vevent` when the object is of the common subset (``light``), else
    by icalendar (``fast``: single events; ``recurring``: a calendar per series).
    """

    source: Source
    fast: list[Event]  # single, non-recurring events: no expansion needed
    recurring: dict[str, Ical]  # uid -> a calendar of that uid's events
    light: list[vevent.Series] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.fast) + len(self.recurring) + len(self.light)


def zone_of(name: str) -> zoneinfo.ZoneInfo:
    try:
        if name.startswith(("/", ".")) or ".." in name:
            raise ValueError(name)
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise AccountFailure(
            "invalid-param",
            f"{name[:64]!r} is not an IANA time zone",
            hint="use a name like Europe/Malta, America/New_York or UTC.",
            param="zone",
        ) from None


def parse_moment(text: str, zone: dt.tzinfo, param: str) -> dt.datetime | dt.date:
    """An ISO date (kept a date) or date-time (naive: in ``zone``) from the model."""
    raw = text.strip()
    try:
        if len(raw) == 10:
            return dt.date.fromisoformat(raw)
        moment = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise AccountFailure(
            "invalid-param",
            f"{param}={raw[:40]!r} is not an ISO 8601 date or date-time",
            hint=f"pass {param} as <YYYY-MM-DD> or <YYYY-MM-DDTHH:MM> (the zone goes in zone=).",
            param=param,
        ) from None
    return moment.replace(tzinfo=zone) if moment.tzinfo is None else moment


def as_datetime(value: dt.datetime | dt.date, zone: dt.tzinfo) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=zone)
    return dt.datetime.combine(value, dt.time(), zone)


def utc_stamp(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")


# -- parsing ---------------------------------------------------------------------------------


def _broken(event: Event) -> str | None:
    for name, why in getattr(event, "errors", ()):
        if name in ("DTSTART", "DTEND", "DURATION", "RRULE", "RDATE", "EXDATE", "RECURRENCE-ID"):
            return f"{name}: {why}"[:200]
    if event.get("DTSTART") is None:
        return "no DTSTART"
    return None


def parse(
    text: str, source: Source, skipped: list[dict[str, str]], *, full: bool = False
) -> Parsed | None:
    """One calendar object; None (and a line in ``skipped``) when it does not parse at all.

    The common subset is read by :func:`vevent.read`; anything else (or ``full``) by icalendar.
    """
    if not full:
        light = vevent.read(text)
        if light is not None:
            return Parsed(source, [], {}, light)
    try:
        cal = icalendar.Calendar.from_ical(text)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        skipped.append({"id": source.href, "reason": f"does not parse: {str(exc)[:160]}"})
        return None
    if not isinstance(cal, icalendar.Calendar):
        skipped.append({"id": source.href, "reason": "not a VCALENDAR"})
        return None
    zones = list(cal.walk("VTIMEZONE"))
    by_uid: dict[str, list[Event]] = {}
    for event in cal.walk("VEVENT"):
        uid = str(event.get("UID", "")) or f"no-uid-{len(by_uid)}"
        why = _broken(event)
        if why is not None:
            skipped.append({"id": source.href, "uid": uid[:200], "reason": why})
            continue
        by_uid.setdefault(uid, []).append(event)
    fast: list[Event] = []
    recurring: dict[str, Ical] = {}
    for uid, events in by_uid.items():
        if len(events) == 1 and not any(k in events[0] for k in ("RRULE", "RDATE")):
            fast.append(events[0])
            continue
        one = icalendar.Calendar()
        for z in zones:
            one.add_component(z)
        for e in events:
            one.add_component(e)
        recurring[uid] = one
    return Parsed(source, fast, recurring)


# -- reading without parsing ----------------------------------------------------------------

_EVENT_PROP: Final = re.compile(
    r"^(DTSTART|DTEND|DURATION|RRULE|RDATE|RECURRENCE-ID)[;:][^\n]*$", re.MULTILINE
)
_DAY: Final = re.compile(r":(\d{4})(\d{2})(\d{2})")
SLACK: Final = dt.timedelta(days=2)  # zone offsets, read as dates


def span(text: str) -> tuple[dt.date, dt.date] | None:
    """The dates one single, non-recurring event spans, read without parsing; else None.

    Parsing a calendar object costs about 1.7 ms (icalendar); a month view over a
    calendar of hundreds of events parses only the objects this says may overlap it,
    and everything it cannot judge (a series, an override, DURATION, several
    events, odd text). A wrong guess costs a parse, never an event: the dates are
    compared with two days of slack on each side, and the parsed event decides.
    """
    unfolded = text.replace("\r\n", "\n").replace("\n ", "").replace("\n\t", "")
    if unfolded.count("BEGIN:VEVENT") != 1:
        return None
    block = unfolded.split("BEGIN:VEVENT", 1)[1].split("END:VEVENT", 1)[0]
    days: dict[str, dt.date] = {}
    for m in _EVENT_PROP.finditer(block.split("BEGIN:VALARM", 1)[0]):
        name = m.group(1)
        if name not in ("DTSTART", "DTEND") or name in days:
            return None
        d = _DAY.search(m.group(0))
        if d is None:
            return None
        try:
            days[name] = dt.date(int(d.group(1)), int(d.group(2)), int(d.group(3)))
        except ValueError:
            return None
    if "DTSTART" not in days:
        return None
    return days["DTSTART"], days.get("DTEND", days["DTSTART"])


def may_overlap(found: tuple[dt.date, dt.date] | None, lo: dt.datetime, hi: dt.datetime) -> bool:
    if found is None:
        return True
    start, end = found
    return start <= (hi + SLACK).date() and end >= (lo - SLACK).date()


@dataclass
class Stored:
    """One calendar object as the cache keeps it: its text, its span, its parse once made."""

    source: Source
    text: str
    span: tuple[dt.date, dt.date] | None
    parsed: Parsed | None = None
    notes: list[dict[str, str]] = field(default_factory=list)
    tried: bool = False
    # Two calls may read one cached object at once (inline abilities run on a pool).
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def of(cls, text: str, source: Source) -> Stored:
        return cls(source, text, span(text))

    def get(self) -> Parsed | None:
        with self._lock:
            if not self.tried:
                self.parsed = parse(self.text, self.source, self.notes)
                self.tried = True
            return self.parsed


# -- expansion -------------------------------------------------------------------------------


def _end_of(event: Event, start: dt.date | dt.datetime) -> dt.date | dt.datetime:
    end = event.get("DTEND")
    if end is not None:
        value: dt.date | dt.datetime = end.dt
        return value
    duration = event.get("DURATION")
    if duration is not None:
        delta: dt.timedelta = duration.dt
        return start + delta
    return start + dt.timedelta(days=1) if not isinstance(start, dt.datetime) else start


def _text(event: Event, key: str) -> str:
    value = event.get(key)
    return "" if value is None else str(value)[:MAX_TEXT]


def _zone_name(value: dt.date | dt.datetime) -> str:
    if not isinstance(value, dt.datetime):
        return "all-day"
    if value.tzinfo is None:
        return "floating"
    key = getattr(value.tzinfo, "key", None)
    return str(key or value.tzinfo.tzname(value) or "UTC")


def _show(value: dt.date | dt.datetime, zone: dt.tzinfo) -> str:
    if not isinstance(value, dt.datetime):
        return value.isoformat()
    moment = value if value.tzinfo else value.replace(tzinfo=zone)
    return moment.astimezone(zone).isoformat(timespec="minutes")


def occurrence(
    event: Event,
    source: Source,
    zone: dt.tzinfo,
    *,
    recurring: bool,
    start: dt.date | dt.datetime | None = None,
    end: dt.date | dt.datetime | None = None,
) -> dict[str, Any]:
    first: dt.date | dt.datetime = event["DTSTART"].dt if start is None else start
    last = _end_of(event, first) if end is None else end
    rid = event.get("RECURRENCE-ID")
    return shape(
        uid=str(event.get("UID", "")),
        title=_text(event, "SUMMARY"),
        location=_text(event, "LOCATION"),
        description=_text(event, "DESCRIPTION"),
        status=str(event.get("STATUS", "")),
        transp=str(event.get("TRANSP", "")),
        own_start=event["DTSTART"].dt,
        first=first,
        last=last,
        source=source,
        zone=zone,
        recurring=recurring,
        occurrence=None if rid is None else rid.dt,
    )


def shape(
    *,
    uid: str,
    title: str,
    location: str,
    description: str,
    status: str,
    transp: str,
    own_start: dt.date | dt.datetime,
    first: dt.date | dt.datetime,
    last: dt.date | dt.datetime,
    source: Source,
    zone: dt.tzinfo,
    recurring: bool,
    occurrence: dt.date | dt.datetime | None = None,
) -> dict[str, Any]:
    """One occurrence as ``list`` shows it, whichever parser read the event.

    An occurrence of a series names which one it is (``occurrence``: its start as the
    series has it, which an override may have moved): update and delete take that.
    """
    out: dict[str, Any] = {
        "id": source.href,
        "uid": uid[:200],
        "title": title[:MAX_TEXT] or "(no title)",
        "start": _show(first, zone),
        "end": _show(last, zone),
        "all_day": not isinstance(first, dt.datetime),
        "event_zone": _zone_name(own_start),
        "calendar": source.calendar,
        "account": source.account,
    }
    for text, name in ((location, "location"), (description, "description")):
        if text:
            out[name] = text[:MAX_TEXT]
    if recurring:
        out["recurring"] = True
        out["occurrence"] = _show(first if occurrence is None else occurrence, zone)
    if status:
        out["status"] = status.lower()
    if transp.upper() == "TRANSPARENT":
        out["busy"] = False
    return out


def _light_occurrence(
    event: vevent.Light,
    source: Source,
    zone: dt.tzinfo,
    first: dt.date | dt.datetime,
    last: dt.date | dt.datetime,
    *,
    recurring: bool,
) -> dict[str, Any]:
    return shape(
        occurrence=event.recurrence_id,
        uid=event.uid,
        title=event.summary,
        location=event.location,
        description=event.description,
        status=event.status.upper(),
        transp=event.transp,
        own_start=event.start,
        first=first,
        last=last,
        source=source,
        zone=zone,
        recurring=recurring,
    )


def _expand_light(
    series: vevent.Series,
    source: Source,
    lo: dt.datetime,
    hi: dt.datetime,
    zone: dt.tzinfo,
    out: list[tuple[dt.datetime, dict[str, Any]]],
) -> None:
    master = series.master
    if master is not None and not series.recurring:
        if _overlaps(master.start, master.end, lo, hi, zone):
            found = _light_occurrence(
                master, source, zone, master.start, master.end, recurring=False
            )
            out.append((as_datetime(master.start, zone), found))
        return
    # A lone override (an invitation to one instance) reads as a single event.
    recurring = master is not None or len(series.overrides) > 1
    replaced = {vevent.key(o.recurrence_id) for o in series.overrides if o.recurrence_id}
    if master is not None:
        for first, last in vevent.starts(master, lo, hi, zone, MAX_OCCURRENCES):
            if vevent.key(first) in replaced or not _overlaps(first, last, lo, hi, zone):
                continue
            found = _light_occurrence(master, source, zone, first, last, recurring=True)
            out.append((as_datetime(first, zone), found))
    for o in series.overrides:
        if _overlaps(o.start, o.end, lo, hi, zone):
            found = _light_occurrence(o, source, zone, o.start, o.end, recurring=recurring)
            out.append((as_datetime(o.start, zone), found))


def _overlaps(
    start: dt.date | dt.datetime,
    end: dt.date | dt.datetime,
    lo: dt.datetime,
    hi: dt.datetime,
    zone: dt.tzinfo,
) -> bool:
    s, e = as_datetime(start, zone), as_datetime(end, zone)
    if e <= s:
        return lo <= s < hi
    return s < hi and e > lo


def expand(
    parsed: Iterable[Parsed],
    lo: dt.datetime,
    hi: dt.datetime,
    zone: dt.tzinfo,
    skipped: list[dict[str, str]],
) -> list[dict[str, Any]]:
    """Every occurrence overlapping [lo, hi), sorted by start; failures go to ``skipped``."""
    out: list[tuple[dt.datetime, dict[str, Any]]] = []
    for p in parsed:
        for series in p.light:
            try:
                _expand_light(series, p.source, lo, hi, zone, out)
            except Exception as exc:  # one event's bad data must not hide the others
                skipped.append(
                    {
                        "id": p.source.href,
                        "uid": series.uid[:200],
                        "reason": f"cannot expand: {str(exc)[:160]}",
                    }
                )
        for event in p.fast:
            first = event["DTSTART"].dt
            last = _end_of(event, first)
            if _overlaps(first, last, lo, hi, zone):
                out.append(
                    (as_datetime(first, zone), occurrence(event, p.source, zone, recurring=False))
                )
        for uid, cal in p.recurring.items():
            try:
                found = recurring_ical_events.of(cal).between(lo, hi)
                for occ in found:
                    first = occ["DTSTART"].dt
                    last = occ["DTEND"].dt if "DTEND" in occ else _end_of(occ, first)
                    out.append(
                        (
                            as_datetime(first, zone),
                            occurrence(occ, p.source, zone, recurring=True, start=first, end=last),
                        )
                    )
            except Exception as exc:  # one event's bad data must not hide the others
                skipped.append(
                    {
                        "id": p.source.href,
                        "uid": uid[:200],
                        "reason": f"cannot expand: {str(exc)[:160]}",
                    }
                )
    out.sort(key=lambda pair: (pair[0], pair[1]["title"]))
    return [o for _, o in out[:MAX_OCCURRENCES]]


def busy_blocks(
    occurrences: Iterable[Mapping[str, Any]], lo: dt.datetime, hi: dt.datetime, zone: dt.tzinfo
) -> list[tuple[dt.datetime, dt.datetime]]:
    """Merged busy intervals inside [lo, hi): transparent and cancelled events do not count."""
    spans: list[tuple[dt.datetime, dt.datetime]] = []
    for o in occurrences:
        if o.get("busy") is False or o.get("status") == "cancelled":
            continue
        s = as_datetime(_from_shown(o["start"]), zone)
        e = as_datetime(_from_shown(o["end"]), zone)
        s, e = max(s, lo), min(e, hi)
        if e > s:
            spans.append((s, e))
    spans.sort()
    merged: list[tuple[dt.datetime, dt.datetime]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def _from_shown(text: str) -> dt.date | dt.datetime:
    return dt.date.fromisoformat(text) if len(text) == 10 else dt.datetime.fromisoformat(text)


def free_slots(
    busy: list[tuple[dt.datetime, dt.datetime]],
    lo: dt.datetime,
    hi: dt.datetime,
    minimum: dt.timedelta,
) -> list[tuple[dt.datetime, dt.datetime]]:
    out: list[tuple[dt.datetime, dt.datetime]] = []
    at = lo
    for s, e in busy:
        if s - at >= minimum:
            out.append((at, s))
        at = max(at, e)
    if hi - at >= minimum:
        out.append((at, hi))
    return out


# -- writing ---------------------------------------------------------------------------------


def check_rrule(text: str) -> Any:
    raw = text.strip().removeprefix("RRULE:")
    try:
        rule = icalendar.vRecur.from_ical(raw)
    except (ValueError, TypeError):
        rule = None
    if rule is None or "FREQ" not in rule or not set(rule).issubset(RRULE_PARTS):
        raise AccountFailure(
            "invalid-param",
            f"recurrence={raw[:80]!r} is not an RFC 5545 RRULE",
            hint="pass recurrence as an RFC 5545 RRULE: FREQ=<DAILY|WEEKLY|MONTHLY|YEARLY>;...",
            param="recurrence",
        )
    return rule


def _set_times(
    event: Event,
    start: dt.date | dt.datetime,
    end: dt.date | dt.datetime,
) -> None:
    for key in ("DTSTART", "DTEND", "DURATION"):
        event.pop(key, None)
    event.add("DTSTART", start)
    event.add("DTEND", end)


def check_span(start: dt.date | dt.datetime, end: dt.date | dt.datetime) -> None:
    if isinstance(start, dt.datetime) != isinstance(end, dt.datetime):
        raise AccountFailure(
            "invalid-param",
            "start and end must both be dates (all-day) or both date-times",
            param="end",
        )
    if end <= start:  # type: ignore[operator]
        raise AccountFailure("invalid-param", "end must be after start", param="end")


def new_event(
    *,
    title: str,
    start: dt.date | dt.datetime,
    end: dt.date | dt.datetime,
    location: str = "",
    description: str = "",
    recurrence: str = "",
    now: dt.datetime | None = None,
) -> tuple[str, str]:
    """(uid, the calendar object's text) for one new event; zones included as VTIMEZONEs."""
    check_span(start, end)
    uid = f"{uuid.uuid4()}@chalie"
    cal = icalendar.Calendar()
    cal.add("PRODID", PRODID)
    cal.add("VERSION", "2.0")
    event = icalendar.Event()
    event.add("UID", uid)
    event.add("DTSTAMP", now or dt.datetime.now(dt.UTC))
    event.add("SUMMARY", title)
    _set_times(event, start, end)
    if location:
        event.add("LOCATION", location)
    if description:
        event.add("DESCRIPTION", description)
    if recurrence:
        event.add("RRULE", check_rrule(recurrence))
    cal.add_component(event)
    cal.add_missing_timezones()
    return uid, cal.to_ical().decode()


def changed_event(
    text: str,
    source: Source,
    *,
    title: str | None,
    start: dt.date | dt.datetime | None,
    end: dt.date | dt.datetime | None,
    location: str | None,
    description: str | None,
    recurrence: str | None,
) -> str:
    """The object's text with its master event changed (a series changes as a whole)."""
    cal = _stored(text, source)
    masters = [e for e in cal.walk("VEVENT") if "RECURRENCE-ID" not in e]
    if not masters or _broken(masters[0]):
        raise AccountFailure(
            "account-bad-response",
            "the stored event has no usable VEVENT",
            account=source.account,
        )
    event: Event = masters[0]
    old_start = event["DTSTART"].dt
    _edit(
        event,
        old_start,
        _end_of(event, old_start),
        title=title,
        start=start,
        end=end,
        location=location,
        description=description,
    )
    if recurrence is not None:
        event.pop("RRULE", None)
        if recurrence:
            event.add("RRULE", check_rrule(recurrence))
    return _written(cal, event, event)


def _stored(text: str, source: Source) -> Ical:
    """The stored object, parsed; refused as the server's bad answer when it does not parse."""
    try:
        cal: Ical = icalendar.Calendar.from_ical(text)
    except (ValueError, KeyError, IndexError, TypeError):
        raise AccountFailure(
            "account-bad-response", "the stored event does not parse", account=source.account
        ) from None
    return cal


def _edit(
    event: Event,
    old_start: Any,  # the event's times as icalendar gives them (.dt): dates or date-times
    old_end: Any,
    *,
    title: str | None,
    start: dt.date | dt.datetime | None,
    end: dt.date | dt.datetime | None,
    location: str | None,
    description: str | None,
) -> None:
    """Apply a change to one VEVENT: its times (a moved start keeps the length), then each
    text field given (an empty one is removed)."""
    if start is not None or end is not None:
        new_start = start if start is not None else old_start
        if end is None:
            end = new_start + (old_end - old_start)
        check_span(new_start, end)
        _set_times(event, new_start, end)
    for key, value in (("SUMMARY", title), ("LOCATION", location), ("DESCRIPTION", description)):
        if value is not None:
            event.pop(key, None)
            if value:
                event.add(key, value)


def _written(cal: Ical, event: Event, sequenced: Event) -> str:
    """The object's text after ``event`` changed: its SEQUENCE one past ``sequenced``'s (the
    event itself, or the series' master for a new override), its DTSTAMP now."""
    seq = str(sequenced.get("SEQUENCE", 0))
    event.pop("SEQUENCE", None)
    event.add("SEQUENCE", (int(seq) if seq.isdigit() else 0) + 1)
    event.pop("DTSTAMP", None)
    event.add("DTSTAMP", dt.datetime.now(dt.UTC))
    cal.add_missing_timezones()
    return str(cal.to_ical().decode())


def _series(text: str, source: Source) -> tuple[Ical, Event]:
    """The stored object and its series' master; refused when the event happens once."""
    cal = _stored(text, source)
    masters = [e for e in cal.walk("VEVENT") if "RECURRENCE-ID" not in e]
    if not masters or _broken(masters[0]) or not any(k in masters[0] for k in ("RRULE", "RDATE")):
        raise AccountFailure(
            "invalid-param",
            "occurrence= is for a recurring event; this one happens once",
            hint="change or delete it without occurrence=.",
            param="occurrence",
        )
    return cal, masters[0]


def _overrides(cal: Ical) -> list[Event]:
    return [e for e in cal.subcomponents if e.name == "VEVENT" and "RECURRENCE-ID" in e]


def _same(a: dt.date | dt.datetime, b: dt.date | dt.datetime) -> bool:
    return as_datetime(a, dt.UTC) == as_datetime(b, dt.UTC)


def _occurrence_of(
    cal: Ical, master: Event, when: dt.date | dt.datetime, source: Source
) -> dt.date | dt.datetime:
    """Which occurrence ``when`` names, as the series has it (its RECURRENCE-ID).

    ``when`` is what ``list`` showed: the ``occurrence`` (or, for an occurrence nobody
    moved, its ``start``); an overridden one is also found by its moved start. A moment
    that is none of these is refused.
    """
    first = master["DTSTART"].dt
    if isinstance(first, dt.datetime):
        if not isinstance(when, dt.datetime):
            when = dt.datetime.combine(when, first.timetz())
        target: dt.date | dt.datetime = (
            when.astimezone(first.tzinfo) if first.tzinfo else when.replace(tzinfo=None)
        )
    else:
        target = when.date() if isinstance(when, dt.datetime) else when
    overrides = _overrides(cal)
    for o in overrides:
        if _same(o["RECURRENCE-ID"].dt, target):
            return target
    for o in overrides:  # an override found by where it was moved to
        if "DTSTART" in o and _same(o["DTSTART"].dt, target):
            rid: dt.date | dt.datetime = o["RECURRENCE-ID"].dt
            return rid
    lo = as_datetime(target, dt.UTC) - dt.timedelta(minutes=1)
    probe = icalendar.Calendar()
    for z in cal.walk("VTIMEZONE"):
        probe.add_component(z)
    probe.add_component(master)
    starts = [o["DTSTART"].dt for o in recurring_ical_events.of(probe).between(lo, lo + SLACK)]
    if not any(_same(s, target) for s in starts):
        raise AccountFailure(
            "item-not-found",
            f"the series has no occurrence starting {when.isoformat()}",
            account=source.account,
            hint="pass occurrence= as list showed it for that occurrence.",
            param="occurrence",
        )
    return target


def without_occurrence(text: str, source: Source, when: dt.date | dt.datetime) -> str:
    """The object's text with one occurrence of its series excluded (EXDATE), its override gone.

    ``when`` names the occurrence as ``list`` shows it (see :func:`_occurrence_of`). A
    non-recurring event, or a moment that is no occurrence of the series, is refused
    (nothing is written).
    """
    cal, master = _series(text, source)
    target = _occurrence_of(cal, master, when, source)
    master.add("EXDATE", target)
    for override in _overrides(cal):
        if _same(override["RECURRENCE-ID"].dt, target):
            cal.subcomponents.remove(override)
    return str(cal.to_ical().decode())


# Properties of a series' master that belong to the series, not to one occurrence.
_SERIES_ONLY: Final = frozenset(
    {"RRULE", "RDATE", "EXDATE", "EXRULE", "DTSTART", "DTEND", "DURATION", "RECURRENCE-ID",
     "SEQUENCE", "DTSTAMP"}
)  # fmt: skip


def changed_occurrence(
    text: str,
    source: Source,
    when: dt.date | dt.datetime,
    *,
    title: str | None,
    start: dt.date | dt.datetime | None,
    end: dt.date | dt.datetime | None,
    location: str | None,
    description: str | None,
) -> str:
    """The object's text with one occurrence changed: an override (RFC 5545 RECURRENCE-ID).

    The first change of an occurrence copies the master's details into a new VEVENT
    with the master's UID; a later one changes that override. The rest of the series
    stays as it was.
    """
    cal, master = _series(text, source)
    target = _occurrence_of(cal, master, when, source)
    found = [o for o in _overrides(cal) if _same(o["RECURRENCE-ID"].dt, target)]
    series_start = master["DTSTART"].dt
    length = _end_of(master, series_start) - series_start
    if found:
        event: Event = found[0]
        old_start = event["DTSTART"].dt
        old_end = _end_of(event, old_start)
    else:
        event = icalendar.Event()
        for key, value in master.items():
            if key not in _SERIES_ONLY:
                event.add(key, value)
        event.add("RECURRENCE-ID", target)
        old_start, old_end = target, target + length
        _set_times(event, old_start, old_end)
        for alarm in master.subcomponents:
            event.add_component(alarm)
        cal.add_component(event)
    _edit(
        event,
        old_start,
        old_end,
        title=title,
        start=start,
        end=end,
        location=location,
        description=description,
    )
    return _written(cal, event, master)

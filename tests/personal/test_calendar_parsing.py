"""The pure iCalendar side: the no-parse span, expansion, free/busy, building events."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from chalie.accounts.failure import AccountFailure
from chalie.personal import calendar as ical

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
WITH_ZONE = """BEGIN:VCALENDAR
VERSION:2.0
PRODID:x
BEGIN:VTIMEZONE
TZID:Europe/Berlin
BEGIN:DAYLIGHT
DTSTART:19810329T020000
RRULE:FREQ=YEARLY;BYMONTH=3;BYDAY=-1SU
TZOFFSETFROM:+0100
TZOFFSETTO:+0200
END:DAYLIGHT
END:VTIMEZONE
BEGIN:VEVENT
UID:a
DTSTART;TZID=Europe/Berlin:20250402T090000
DTEND;TZID=Europe/Berlin:2025040
 2T100000
SUMMARY:Folded end
BEGIN:VALARM
TRIGGER:-PT15M
ACTION:DISPLAY
END:VALARM
END:VEVENT
END:VCALENDAR
"""


def test_span_reads_the_event_not_its_time_zone() -> None:
    assert ical.span(WITH_ZONE) == (dt.date(2025, 4, 2), dt.date(2025, 4, 2))
    assert ical.span(WITH_ZONE.replace("SUMMARY", "RRULE:FREQ=DAILY\nSUMMARY")) is None
    assert ical.span(WITH_ZONE.replace("DTEND", "DURATION:PT1H\nX-DTEND")) is None
    assert ical.span("BEGIN:VCALENDAR\nEND:VCALENDAR") is None
    assert ical.span(WITH_ZONE.replace("20250402T090000", "2025-04-0X")) is None


def test_only_objects_that_may_overlap_are_parsed() -> None:
    src = ical.Source("a", "c", "/a/c/x.ics")
    inside = ical.Stored.of(WITH_ZONE, src)
    lo = dt.datetime(2025, 4, 1, tzinfo=BERLIN)
    assert ical.may_overlap(inside.span, lo, lo + dt.timedelta(days=7))
    assert not ical.may_overlap(inside.span, lo + dt.timedelta(days=30), lo + dt.timedelta(days=60))
    assert not inside.tried
    parsed = inside.get()
    assert parsed is not None and inside.tried
    found = ical.expand([parsed], lo, lo + dt.timedelta(days=7), BERLIN, [])
    assert [(o["title"], o["start"], o["end"]) for o in found] == [
        ("Folded end", "2025-04-02T09:00+02:00", "2025-04-02T10:00+02:00")
    ]


def test_busy_blocks_merge_and_free_slots_respect_the_minimum() -> None:
    tz = dt.UTC
    day = dt.datetime(2025, 1, 6, 8, tzinfo=tz)
    occ = [
        {"start": "2025-01-06T09:00+00:00", "end": "2025-01-06T10:00+00:00"},
        {"start": "2025-01-06T09:30+00:00", "end": "2025-01-06T11:00+00:00"},
        {"start": "2025-01-06T12:00+00:00", "end": "2025-01-06T12:20+00:00", "busy": False},
        {"start": "2025-01-06T13:00+00:00", "end": "2025-01-06T13:10+00:00"},
    ]
    busy = ical.busy_blocks(occ, day, day + dt.timedelta(hours=8), tz)
    assert [(s.hour, s.minute, e.hour, e.minute) for s, e in busy] == [
        (9, 0, 11, 0),
        (13, 0, 13, 10),
    ]
    free = ical.free_slots(busy, day, day + dt.timedelta(hours=8), dt.timedelta(minutes=60))
    assert [(s.hour, e.hour) for s, e in free] == [(8, 9), (11, 13), (13, 16)]


def test_new_events_carry_their_zone_and_refuse_bad_input() -> None:
    start = dt.datetime(2025, 3, 30, 9, tzinfo=BERLIN)
    uid, text = ical.new_event(
        title="T", start=start, end=start + dt.timedelta(hours=1), recurrence="FREQ=WEEKLY;COUNT=2"
    )
    assert "BEGIN:VTIMEZONE" in text and "TZID=Europe/Berlin" in text and uid in text
    with pytest.raises(AccountFailure) as err:
        ical.new_event(title="T", start=start, end=start)
    assert err.value.param == "end"
    with pytest.raises(AccountFailure):
        ical.new_event(title="T", start=dt.date(2025, 1, 1), end=start)
    for rule in ("FREQ=SOMETIMES", "COUNT=3", "FREQ=DAILY;X-EVIL=1"):
        with pytest.raises(AccountFailure):
            ical.check_rrule(rule)
    with pytest.raises(AccountFailure):
        ical.zone_of("../../etc/passwd")

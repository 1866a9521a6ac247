"""The common-subset VEVENT reader: the same answers as icalendar, or it declines."""

from __future__ import annotations

import datetime as dt
import random
import zoneinfo

import pytest

from chalie.personal import calendar as ical
from chalie.personal import vevent

HEAD = "BEGIN:VCALENDAR\nVERSION:2.0\nPRODID:t\n"


def one(body: str) -> str:
    return HEAD + "BEGIN:VEVENT\nDTSTAMP:20250101T000000Z\n" + body + "END:VEVENT\nEND:VCALENDAR\n"


OVERRIDDEN = (
    HEAD + "BEGIN:VEVENT\nUID:o\nDTSTART;TZID=Europe/Malta:20250303T180000\n"
    "DTEND;TZID=Europe/Malta:20250303T190000\nRRULE:FREQ=WEEKLY;COUNT=6\nSUMMARY:Piano\n"
    "END:VEVENT\nBEGIN:VEVENT\nUID:o\nRECURRENCE-ID;TZID=Europe/Malta:20250317T180000\n"
    "DTSTART;TZID=Europe/Malta:20250318T200000\nDTEND;TZID=Europe/Malta:20250318T210000\n"
    "SUMMARY:Piano (moved)\nEND:VEVENT\nBEGIN:VEVENT\nUID:o\n"
    "RECURRENCE-ID;TZID=Europe/Malta:20250331T180000\nDTSTART;TZID=Europe/Malta:20250501T200000\n"
    "DTEND;TZID=Europe/Malta:20250501T210000\nSUMMARY:Piano (out)\nEND:VEVENT\nEND:VCALENDAR\n"
)
CORPUS = [
    one(
        "UID:w\nDTSTART;TZID=Europe/Berlin:20250320T090000\n"
        "DTEND;TZID=Europe/Berlin:20250320T100000\nRRULE:FREQ=WEEKLY;COUNT=4\nSUMMARY:Standup\n"
    ),
    one("UID:h\nDTSTART;VALUE=DATE:20250331\nDTEND;VALUE=DATE:20250401\nSUMMARY:Freedom Day\n"),
    one(
        "UID:ad\nDTSTART;VALUE=DATE:20250303\nRRULE:FREQ=WEEKLY;UNTIL=20250331\n"
        "EXDATE;VALUE=DATE:20250317\nSUMMARY:All-day weekly\n"
    ),
    one(
        "UID:fl\nDTSTART:20250305T080000\nDURATION:PT90M\nRRULE:FREQ=DAILY;COUNT=10;INTERVAL=2\n"
        "SUMMARY:Floating\\, with comma\\nand a line\nLOCATION:Here\nTRANSP:TRANSPARENT\n"
        "STATUS:tentative\n"
    ),
    one(
        "UID:u\nDTSTART:20250301T230000Z\nDTEND:20250302T010000Z\n"
        "RRULE:FREQ=MONTHLY;BYDAY=1SA;UNTIL=20251231T000000Z\nEXDATE:20250405T230000Z\n"
        "SUMMARY:Monthly\n"
    ),
    one(
        "UID:ny\nDTSTART;TZID=America/New_York:20250308T233000\n"
        "DTEND;TZID=America/New_York:20250309T033000\nRRULE:FREQ=DAILY;COUNT=5\n"
        "EXDATE;TZID=America/New_York:20250310T233000,20250311T233000\nSUMMARY:Across DST\n"
    ),
    OVERRIDDEN,
    one(
        "UID:y\nDTSTART;VALUE=DATE:20200315\nRRULE:FREQ=YEARLY\nSUMMARY:Birthday\n"
        "DESCRIPTION;LANGUAGE=en:Cake\\; and more\n"
    ),
    one(
        'UID:q\nDTSTART;TZID="Europe/Berlin":20250310T120000\n'
        "DTEND;TZID=Europe/Berlin:20250310T130000\n"
        'ATTENDEE;CN="Doe, John";ROLE=REQ-PARTICIPANT:mailto:j@example.com\nSUMMARY:Lunch\n'
        "BEGIN:VALARM\nTRIGGER:-PT15M\nACTION:DISPLAY\nDESCRIPTION:x\nEND:VALARM\n"
    ),
    one("UID:nd\nDTSTART:20250312T100000Z\nSUMMARY:No end\n"),
    one("UID:dd\nDTSTART;VALUE=DATE:20250314\nDURATION:P3D\nSUMMARY:Three days\n"),
]


def bench_like(i: int, rng: random.Random) -> str:
    """The shape of tools/bench/bench_personal.py's events."""
    zone = rng.choice(["Europe/Berlin", "Europe/Malta", "America/New_York", "UTC"])
    tz, z = ("", "Z") if zone == "UTC" else (f";TZID={zone}", "")
    day, month, hour = 1 + i % 28, 1 + (i // 28) % 4, 8 + i % 9
    rule = "RRULE:FREQ=WEEKLY;COUNT=40\n" if i % 10 == 0 else ""
    return one(
        f"UID:b{i}\nDTSTART{tz}:2025{month:02d}{day:02d}T{hour:02d}0000{z}\n"
        f"DTEND{tz}:2025{month:02d}{day:02d}T{hour:02d}4500{z}\n{rule}SUMMARY:Event {i}\n"
    )


def window(zone: zoneinfo.ZoneInfo) -> tuple[dt.datetime, dt.datetime]:
    return dt.datetime(2025, 3, 1, tzinfo=zone), dt.datetime(2025, 4, 1, tzinfo=zone)


@pytest.mark.parametrize("zone", ["Europe/Malta", "UTC", "America/Los_Angeles"])
def test_the_light_reader_answers_as_icalendar_does(zone: str) -> None:
    tz = zoneinfo.ZoneInfo(zone)
    lo, hi = window(tz)
    rng = random.Random(1)
    corpus = CORPUS + [bench_like(i, rng) for i in range(120)]
    src = ical.Source("a", "c", "/a/c/x.ics")
    for text in corpus:
        light_skips: list[dict[str, str]] = []
        full_skips: list[dict[str, str]] = []
        light = ical.parse(text, src, light_skips)
        full = ical.parse(text, src, full_skips, full=True)
        assert light is not None and full is not None
        assert light.light and not full.light  # each path really ran
        assert ical.expand([light], lo, hi, tz, light_skips) == ical.expand(
            [full], lo, hi, tz, full_skips
        ), text
        assert light_skips == full_skips == []


def test_overrides_replace_their_instance() -> None:
    tz = zoneinfo.ZoneInfo("Europe/Malta")
    parsed = ical.parse(OVERRIDDEN, ical.Source("a", "c", "/x"), [])
    assert parsed is not None and parsed.light
    got = ical.expand([parsed], *window(tz), tz, [])
    assert [(o["title"], o["start"][:16]) for o in got] == [
        ("Piano", "2025-03-03T18:00"),
        ("Piano", "2025-03-10T18:00"),
        ("Piano (moved)", "2025-03-18T20:00"),
        ("Piano", "2025-03-24T18:00"),
    ]  # 31 March moved to May: not in March


@pytest.mark.parametrize(
    "body",
    [
        "UID:r\nDTSTART:20250301T100000Z\nRDATE:20250305T100000Z\n",
        "UID:t\nDTSTART;TZID=W. Europe Standard Time:20250301T100000\n",
        "UID:m\nDTSTART:20250301T100000Z\nRRULE:FREQ=MINUTELY;COUNT=5\n",
        "UID:s\nDTSTART:20250301T100000Z\nRRULE:FREQ=WEEKLY;BYDAY=MO;COUNT=3\n",  # a Saturday
        "UID:x\nDTSTART:20250301T100000Z\nRRULE:FREQ=DAILY;X-NAME=1\n",
        "UID:z\nDTSTART;TZID=Europe/Berlin:20250301T100000\nRRULE:FREQ=DAILY;UNTIL=20250310\n",
        "UID:g\nDTSTART:2025-03-0X\n",
        "UID:k\nDTSTART:20250301T100000Z\nRECURRENCE-ID;RANGE=THISANDFUTURE:20250301T100000Z\n",
        "DTSTART:20250301T100000Z\n",  # no UID
        "UID:d\nDTSTART:20250301T100000Z\nDTEND:20250301T110000Z\nDURATION:PT1H\n",
    ],
)
def test_anything_outside_the_subset_is_declined_and_read_by_icalendar(body: str) -> None:
    text = one(body + "SUMMARY:Odd\n")
    assert vevent.read(text) is None
    parsed = ical.parse(text, ical.Source("a", "c", "/x"), [])
    assert parsed is None or not parsed.light  # icalendar read it (or named it broken)


def test_objects_with_other_components_or_broken_nesting_are_declined() -> None:
    assert vevent.read(HEAD + "BEGIN:VTODO\nUID:t\nEND:VTODO\nEND:VCALENDAR\n") is None
    assert (
        vevent.read(one("UID:a\nDTSTART:20250301T100000Z\n").replace("END:VCALENDAR", "")) is None
    )
    assert vevent.read("garbage") is None
    assert vevent.read(HEAD + "END:VCALENDAR\n") is None
    custom = one("UID:a\nDTSTART;TZID=Custom:20250301T100000\n").replace(
        "BEGIN:VEVENT", "BEGIN:VTIMEZONE\nTZID:Custom\nEND:VTIMEZONE\nBEGIN:VEVENT"
    )
    assert vevent.read(custom) is None


def test_a_series_from_long_ago_is_bounded() -> None:
    tz = zoneinfo.ZoneInfo("UTC")
    text = one("UID:old\nDTSTART:10000101T090000Z\nRRULE:FREQ=DAILY\nSUMMARY:Ancient\n")
    parsed = ical.parse(text, ical.Source("a", "c", "/x"), [])
    assert parsed is not None and parsed.light
    skipped: list[dict[str, str]] = []
    assert ical.expand([parsed], *window(tz), tz, skipped) == []
    assert skipped[0]["uid"] == "old" and skipped[0]["reason"].startswith("cannot expand")


def test_a_rule_no_date_can_meet_is_its_dtstart_alone() -> None:
    # dateutil would search for the 30th of February up to the year 9999 (seconds of CPU)
    tz = zoneinfo.ZoneInfo("UTC")
    text = one(
        "UID:never\nDTSTART:20250310T090000Z\nDTEND:20250310T100000Z\n"
        "RRULE:FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30\nSUMMARY:Never\n"
    )
    parsed = ical.parse(text, ical.Source("a", "c", "/x"), [])
    assert parsed is not None and parsed.light
    found = ical.expand([parsed], *window(tz), tz, [])
    assert [(o["title"], o["start"]) for o in found] == [("Never", "2025-03-10T09:00+00:00")]
    assert vevent.read(text.replace("BYMONTH=2", "BYMONTH=13")) is None

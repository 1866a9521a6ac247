"""calendar against Radicale (from PyPI) started by the test, and an ICS feed on loopback."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest

from abilities.calendar import Calendar, CalendarParams
from chalie.accounts.spec import Account
from chalie.accounts.store import AccountStore
from chalie.calls.untrusted import WARNING_LINE
from chalie.personal import calendar as ical
from chalie.personal.runtime import PersonalRuntime, PersonalSettings
from chalie.result import ToolResult
from chalie.services import Services
from tools.personal_servers import Radicale, http_server, make_calendar, put_object, radicale

pytestmark = pytest.mark.slow

WEEKLY_BERLIN = """BEGIN:VCALENDAR
VERSION:2.0
PRODID:test
BEGIN:VEVENT
UID:weekly-1@test
DTSTAMP:20250101T000000Z
DTSTART;TZID=Europe/Berlin:20250320T090000
DTEND;TZID=Europe/Berlin:20250320T100000
RRULE:FREQ=WEEKLY;COUNT=4
SUMMARY:Standup
END:VEVENT
END:VCALENDAR
"""
ALL_DAY = """BEGIN:VCALENDAR
VERSION:2.0
PRODID:test
BEGIN:VEVENT
UID:holiday-1@test
DTSTAMP:20250101T000000Z
DTSTART;VALUE=DATE:20250331
DTEND;VALUE=DATE:20250401
SUMMARY:Freedom Day
END:VEVENT
END:VCALENDAR
"""
NEW_YORK = """BEGIN:VCALENDAR
VERSION:2.0
PRODID:test
BEGIN:VEVENT
UID:ny-1@test
DTSTAMP:20250101T000000Z
DTSTART;TZID=America/New_York:20250402T090000
DTEND;TZID=America/New_York:20250402T103000
SUMMARY:Call with the New York office
LOCATION:Zoom
END:VEVENT
END:VCALENDAR
"""
MALFORMED = """BEGIN:VCALENDAR
VERSION:2.0
PRODID:test
BEGIN:VEVENT
UID:broken-1@test
DTSTAMP:20250101T000000Z
DTSTART:2025-04-0X
SUMMARY:Broken
END:VEVENT
END:VCALENDAR
"""


@pytest.fixture(scope="module")
def server() -> Iterator[Radicale]:
    with radicale() as srv:
        make_calendar(srv, "alice", "work", "Work")
        # Radicale refuses a malformed object on PUT (400); the ICS feed below carries one.
        for name, text in (("weekly", WEEKLY_BERLIN), ("holiday", ALL_DAY), ("ny", NEW_YORK)):
            put_object(srv, "alice", f"/alice/work/{name}.ics", text, "text/calendar")
        yield srv


def tool(
    book: AccountStore, server: Radicale, password: str = "secret", name: str = "work"
) -> Calendar:
    if book.get(name) is None:
        book.add(
            Account(name=name, kind="caldav", url=server.url + "/", username="alice"), password
        )
    return Calendar(None, Services(personal=PersonalRuntime(book, PersonalSettings())))


def created_id(result: ToolResult) -> str:
    """The id of the event a create_event call made."""
    assert result.ok, result.body
    made: str = json.loads(result.body)["created"]["id"]
    return made


def weekly_series(cal: Calendar, title: str) -> str:
    """Three weekly events from Monday 24 March 2025, 18:00 in Malta (across the DST change)."""
    return created_id(
        cal.run(
            CalendarParams(
                action="create_event",
                title=title,
                start="2025-03-24T18:00",
                zone="Europe/Malta",
                recurrence="FREQ=WEEKLY;COUNT=3",
            )
        )
    )


def events(result: ToolResult) -> dict[str, Any]:
    assert result.ok, result.body
    assert result.body.startswith(WARNING_LINE + "\n") and result.meta["untrusted"] is True
    data: dict[str, Any] = json.loads(result.body.split("\n", 1)[1])
    return data


def test_recurrences_expand_across_the_dst_change(book: AccountStore, server: Radicale) -> None:
    got = events(tool(book, server).run(CalendarParams(start="2025-03-01", end="2025-04-30")))
    standup = [(e["start"], e["end"]) for e in got["events"] if e["title"] == "Standup"]
    # 09:00 in Berlin is 08:00Z before 30 March, 07:00Z after
    assert standup == [
        ("2025-03-20T08:00+00:00", "2025-03-20T09:00+00:00"),
        ("2025-03-27T08:00+00:00", "2025-03-27T09:00+00:00"),
        ("2025-04-03T07:00+00:00", "2025-04-03T08:00+00:00"),
        ("2025-04-10T07:00+00:00", "2025-04-10T08:00+00:00"),
    ]
    in_berlin = events(
        tool(book, server).run(CalendarParams(start="2025-04-03", zone="Europe/Berlin"))
    )
    assert [e["start"] for e in in_berlin["events"]] == ["2025-04-03T09:00+02:00"]


def test_all_day_and_another_zone(book: AccountStore, server: Radicale) -> None:
    got = events(
        tool(book, server).run(
            CalendarParams(start="2025-03-31", end="2025-04-02", zone="Europe/Malta")
        )
    )
    by_title = {e["title"]: e for e in got["events"]}
    assert by_title["Freedom Day"]["all_day"] is True
    assert (by_title["Freedom Day"]["start"], by_title["Freedom Day"]["end"]) == (
        "2025-03-31",
        "2025-04-01",
    )
    ny = by_title["Call with the New York office"]
    assert ny["start"] == "2025-04-02T15:00+02:00" and ny["event_zone"] == "America/New_York"
    assert ny["location"] == "Zoom"


def test_free_busy_merges_events_into_busy_blocks(book: AccountStore, server: Radicale) -> None:
    result = tool(book, server).run(
        CalendarParams(
            action="free_busy",
            start="2025-04-03T08:00",
            end="2025-04-03T12:00",
            zone="Europe/Berlin",
            min_minutes=60,
        )
    )
    got = events(result)
    assert got["busy"] == [{"start": "2025-04-03T09:00+02:00", "end": "2025-04-03T10:00+02:00"}]
    assert got["free"] == [
        {"start": "2025-04-03T08:00+02:00", "end": "2025-04-03T09:00+02:00"},
        {"start": "2025-04-03T10:00+02:00", "end": "2025-04-03T12:00+02:00"},
    ]


def test_an_end_equal_to_the_start_is_read_as_no_end(book: AccountStore, server: Radicale) -> None:
    # What the real 1.5B model sent for "a meeting with Bob tomorrow at 10am".
    cal = tool(book, server)
    created_id(
        cal.run(
            CalendarParams(
                action="create_event",
                title="Meeting with Bob",
                start="2025-06-02T10:00",
                end="2025-06-02T10:00",
                zone="Europe/Malta",
            )
        )
    )
    day = events(cal.run(CalendarParams(start="2025-06-02", zone="Europe/Malta")))
    assert [(e["start"], e["end"]) for e in day["events"]] == [
        ("2025-06-02T10:00+02:00", "2025-06-02T11:00+02:00")
    ]


def test_create_update_delete_round_trip(book: AccountStore, server: Radicale) -> None:
    cal = tool(book, server)
    event_id = created_id(
        cal.run(
            CalendarParams(
                action="create_event",
                title="Dentist",
                start="2025-05-02T15:00",
                zone="Europe/Malta",
                location="Sliema",
            )
        )
    )

    def on_may_2() -> list[tuple[str, str, str]]:
        day = events(cal.run(CalendarParams(start="2025-05-02", zone="Europe/Malta")))
        return [(e["title"], e["start"], e["end"]) for e in day["events"]]

    assert on_may_2() == [("Dentist", "2025-05-02T15:00+02:00", "2025-05-02T16:00+02:00")]
    moved = cal.run(
        CalendarParams(
            action="update_event",
            id=event_id,
            start="2025-05-02T17:30",
            zone="Europe/Malta",
            title="Dentist (moved)",
        )
    )
    assert moved.ok, moved.body
    assert on_may_2() == [("Dentist (moved)", "2025-05-02T17:30+02:00", "2025-05-02T18:30+02:00")]
    weekly = cal.run(
        CalendarParams(
            action="create_event",
            title="Yoga",
            start="2025-06-02",
            recurrence="FREQ=WEEKLY;COUNT=3",
        )
    )
    assert weekly.ok
    june = events(cal.run(CalendarParams(start="2025-06-01", end="2025-06-30")))
    assert [e["start"] for e in june["events"] if e["title"] == "Yoga"] == [
        "2025-06-02",
        "2025-06-09",
        "2025-06-16",
    ]
    gone = cal.run(CalendarParams(action="delete_event", id=event_id))
    assert gone.ok
    assert events(cal.run(CalendarParams(start="2025-05-02")))["events"] == []
    again = cal.run(CalendarParams(action="delete_event", id=event_id))
    assert again.code == "item-not-found"
    # an id outside the account's calendars is refused before any request
    outside = cal.run(CalendarParams(action="delete_event", id="/bob/calendar/x.ics"))
    assert outside.code == "item-not-found"
    bad_rule = cal.run(
        CalendarParams(
            action="create_event", title="x", start="2025-06-02", recurrence="FREQ=SOMETIMES"
        )
    )
    assert bad_rule.code == "invalid-param" and bad_rule.meta["param"] == "recurrence"


def test_a_calendar_name_that_is_not_there_reads_the_only_calendar(
    book: AccountStore, server: Radicale
) -> None:
    cal = tool(book, server)
    assert events(cal.run(CalendarParams(start="2025-04-03", calendar="Work")))["count"] == 1
    # one calendar: a name that is not its own ("primary", a model's guess) can only mean it
    named = cal.run(CalendarParams(start="2025-04-03", calendar="primary", account="work"))
    assert events(named)["count"] == 1
    anywhere = cal.run(CalendarParams(start="2025-04-03", calendar="primary"))
    assert events(anywhere)["count"] == 1


def test_a_change_on_the_server_refetches_only_that_object(
    book: AccountStore, server: Radicale
) -> None:
    rt = PersonalRuntime(book, PersonalSettings())
    book.add(Account(name="work", kind="caldav", url=server.url + "/", username="alice"), "secret")
    cal = Calendar(None, Services(personal=rt))
    first = events(cal.run(CalendarParams(start="2025-04-02", end="2025-04-03")))
    assert sorted(e["title"] for e in first["events"]) == [
        "Call with the New York office",
        "Standup",
    ]
    state = rt.calendars.get(("work", "/alice/work/"))
    assert state is not None and state[0]  # cached under the collection's CTag
    before = {href: stored for href, (_, stored) in state[1].objects.items()}
    assert all(etag for etag, _ in state[1].objects.values())  # ETags were read
    put_object(
        server,
        "alice",
        "/alice/work/ny.ics",
        NEW_YORK.replace("New York office", "NY office"),
        "text/calendar",
    )
    again = events(cal.run(CalendarParams(start="2025-04-02", end="2025-04-03")))
    assert sorted(e["title"] for e in again["events"]) == ["Call with the NY office", "Standup"]
    after = rt.calendars.get(("work", "/alice/work/"))
    assert after is not None and after[0] != state[0]
    kept = {h for h, (_, stored) in after[1].objects.items() if stored is before.get(h)}
    assert "/alice/work/ny.ics" not in kept and "/alice/work/weekly.ics" in kept
    put_object(server, "alice", "/alice/work/ny.ics", NEW_YORK, "text/calendar")


def test_one_occurrence_of_a_series_can_be_deleted(book: AccountStore, server: Radicale) -> None:
    cal = tool(book, server)
    event_id = weekly_series(cal, "Piano")
    shown = events(cal.run(CalendarParams(start="2025-03-20", end="2025-04-10")))
    piano = [e["start"] for e in shown["events"] if e["title"] == "Piano"]
    # 18:00 in Malta: 17:00Z before the change on 30 March, 16:00Z after
    assert piano == ["2025-03-24T17:00+00:00", "2025-03-31T16:00+00:00", "2025-04-07T16:00+00:00"]
    gone = cal.run(CalendarParams(action="delete_event", id=event_id, occurrence=piano[1]))
    assert gone.ok, gone.body
    shown = events(cal.run(CalendarParams(start="2025-03-20", end="2025-04-10")))
    assert [e["start"] for e in shown["events"] if e["title"] == "Piano"] == [piano[0], piano[2]]
    wrong = cal.run(
        CalendarParams(action="delete_event", id=event_id, occurrence="2025-03-25T17:00Z")
    )
    assert wrong.code == "item-not-found" and wrong.meta["param"] == "occurrence"
    single = cal.run(
        CalendarParams(
            action="delete_event", id="/alice/work/ny.ics", occurrence="2025-04-02T13:00Z"
        )
    )
    assert single.code == "invalid-param"
    assert cal.run(CalendarParams(action="delete_event", id=event_id)).ok


def test_one_occurrence_of_a_series_can_be_changed_and_then_deleted(
    book: AccountStore, server: Radicale
) -> None:
    cal = tool(book, server)
    event_id = weekly_series(cal, "Choir")

    def choir() -> list[tuple[str, str, str]]:
        shown = events(cal.run(CalendarParams(start="2025-03-20", end="2025-04-10")))
        return [
            (e["title"], e["start"], e["occurrence"])
            for e in shown["events"]
            if e["title"].startswith("Choir")
        ]

    before = choir()
    assert [start for _, start, _ in before] == [occ for _, _, occ in before]
    second = before[1][2]  # 2025-03-31T16:00Z (18:00 in Malta, summer time)
    moved = cal.run(
        CalendarParams(
            action="update_event",
            id=event_id,
            occurrence=second,
            title="Choir (moved)",
            start="2025-04-01T19:00",
            zone="Europe/Malta",
        )
    )
    assert moved.ok, moved.body
    assert choir() == [
        before[0],
        ("Choir (moved)", "2025-04-01T17:00+00:00", second),  # 19:00 Malta; still that one
        before[2],
    ]
    # on the server: the series as it was, and one override naming its occurrence
    stored = json.loads(
        cal.run(CalendarParams(start="2025-03-20", end="2025-04-10")).body.split("\n", 1)[1]
    )
    assert {e["id"] for e in stored["events"] if e["title"].startswith("Choir")} == {event_id}
    text = server_text(server, event_id)
    assert text.count("RECURRENCE-ID") == 1 and text.count("RRULE:FREQ=WEEKLY;COUNT=3") == 1
    # the light reader takes the override as icalendar does
    src, utc = ical.Source("work", "Work", event_id), dt.UTC
    lo, hi = dt.datetime(2025, 3, 20, tzinfo=utc), dt.datetime(2025, 4, 10, tzinfo=utc)
    light, full = ical.parse(text, src, []), ical.parse(text, src, [], full=True)
    assert light is not None and light.light and full is not None
    assert ical.expand([light], lo, hi, utc, []) == ical.expand([full], lo, hi, utc, [])
    # changed again, named by where it was moved to: the same override, no second one
    again = cal.run(
        CalendarParams(
            action="update_event", id=event_id, occurrence="2025-04-01T17:00Z", location="Hall"
        )
    )
    assert again.ok, again.body
    assert server_text(server, event_id).count("RECURRENCE-ID") == 1
    assert choir()[1] == ("Choir (moved)", "2025-04-01T17:00+00:00", second)
    # refusals: a rule for one occurrence, a moment that is none, an event that happens once
    rule = cal.run(
        CalendarParams(
            action="update_event", id=event_id, occurrence=second, recurrence="FREQ=DAILY"
        )
    )
    assert rule.code == "invalid-param" and rule.meta["param"] == "recurrence"
    none = cal.run(
        CalendarParams(
            action="update_event", id=event_id, occurrence="2025-03-25T17:00Z", title="x"
        )
    )
    assert none.code == "item-not-found" and none.meta["param"] == "occurrence"
    once = cal.run(
        CalendarParams(
            action="update_event",
            id="/alice/work/ny.ics",
            occurrence="2025-04-02T13:00Z",
            title="x",
        )
    )
    assert once.code == "invalid-param"
    # deleting the overridden occurrence takes the override with it
    gone = cal.run(CalendarParams(action="delete_event", id=event_id, occurrence=second))
    assert gone.ok, gone.body
    assert choir() == [before[0], before[2]]
    assert "RECURRENCE-ID" not in server_text(server, event_id)
    assert cal.run(CalendarParams(action="delete_event", id=event_id)).ok


def server_text(server: Radicale, href: str) -> str:
    import httpx2

    got = httpx2.get(server.url + href, auth=("alice", server.users["alice"]))
    assert got.status_code == 200
    return got.text.replace("\r\n", "\n")


def test_permissions_come_from_the_action() -> None:
    cal = Calendar()
    assert cal.classify({"action": "list"}) == "list"
    assert cal.classify({"action": "delete_event", "id": "x"}) == "delete_event"


def test_wrong_password_and_unreachable_are_structured(
    book: AccountStore, server: Radicale
) -> None:
    bad = tool(book, server, password="wrong", name="bad").run(CalendarParams(account="bad"))
    assert bad.code == "auth-failed" and bad.meta["account"] == "bad"
    book.add(Account(name="dead", kind="caldav", url="http://127.0.0.1:9/"), None)
    dead = tool(book, server).run(CalendarParams(account="dead"))
    assert dead.code == "account-unreachable"
    # without an account named, the reachable ones answer and the others are named
    both = events(tool(book, server).run(CalendarParams(start="2025-04-03")))
    assert [e["title"] for e in both["events"]] == ["Standup"]
    assert {u["account"]: u["code"] for u in both["unavailable"]} == {
        "bad": "auth-failed",
        "dead": "account-unreachable",
    }


def test_an_ics_subscription_is_read_only_and_survives_a_malformed_vevent(
    book: AccountStore,
) -> None:
    broken = MALFORMED.split("BEGIN:VEVENT", 1)[1].split("END:VCALENDAR")[0]
    feed = ALL_DAY.replace("Freedom Day", "Feed holiday").replace(
        "END:VCALENDAR", "BEGIN:VEVENT" + broken + "END:VCALENDAR"
    )

    def route(path: str, query: Any, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if headers.get("If-None-Match") == '"v1"':
            return 304, {"ETag": '"v1"'}, b""
        return 200, {"Content-Type": "text/calendar", "ETag": '"v1"'}, feed.encode()

    with http_server(route) as srv:
        book.add(Account(name="holidays", kind="ics", url=srv.url + "/holidays.ics"), None)
        cal = Calendar(None, Services(personal=PersonalRuntime(book, PersonalSettings())))
        for _ in range(2):  # the second read is a 304 from the cache
            got = events(cal.run(CalendarParams(start="2025-03-31")))
            assert [e["title"] for e in got["events"]] == ["Feed holiday"]
            # the broken VEVENT is named, and hides nothing else
            assert [(x["uid"], x["reason"][:7]) for x in got["skipped"]] == [
                ("broken-1@test", "DTSTART")
            ]
        assert len(srv.hits) == 2
        refused = cal.run(
            CalendarParams(action="create_event", account="holidays", title="x", start="2025-03-31")
        )
        assert refused.code == "read-only-account"

"""Reminder rules: at, after, RRULE and cron, in their zones, across daylight saving."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from chalie.schedule.rules import Cron, RuleError, first_time, next_time, parse_delay, zone
from chalie.store.store_place import Place

MALTA = zone("Europe/Malta")
NOON_FRI = dt.datetime(2026, 3, 27, 12, 0, tzinfo=MALTA).timestamp()  # DST starts Sun 29 Mar


def local(ts: float | None, tz: dt.tzinfo = MALTA) -> str:
    assert ts is not None
    return dt.datetime.fromtimestamp(ts, tz).strftime("%Y-%m-%d %H:%M %z")


def test_at_is_read_in_the_zone_unless_it_has_an_offset() -> None:
    assert local(first_time("at", "2026-03-28T09:00", NOON_FRI, MALTA)) == "2026-03-28 09:00 +0100"
    at = first_time("at", "2026-03-28T09:00+00:00", NOON_FRI, MALTA)
    assert local(at) == "2026-03-28 10:00 +0100"
    with pytest.raises(RuleError, match="already passed"):
        first_time("at", "2026-03-27T11:00", NOON_FRI, MALTA)
    # a one-off is spent once it fired
    assert next_time("at", "2026-03-28T09:00", NOON_FRI, MALTA, at) is None


def test_delays() -> None:
    assert [parse_delay(t) for t in ("90", "45s", "10m", "1h30m", "2d")] == [
        90,
        45,
        600,
        5400,
        172800,
    ]
    for bad in ("", "0", "soon", "-5", "1y", "99999d"):
        with pytest.raises(RuleError):
            parse_delay(bad)
    assert first_time("after", "1h", NOON_FRI, MALTA) == NOON_FRI + 3600


def test_recurring_rules_keep_the_wall_clock_across_daylight_saving() -> None:
    for rule in ("0 8 * * *", "FREQ=DAILY;BYHOUR=8;BYMINUTE=0;BYSECOND=0"):
        first = first_time("every", rule, NOON_FRI, MALTA)
        second = next_time("every", rule, NOON_FRI, MALTA, first)
        third = next_time("every", rule, NOON_FRI, MALTA, second)  # type: ignore[arg-type]
        assert [local(first), local(second), local(third)] == [
            "2026-03-28 08:00 +0100",
            "2026-03-29 08:00 +0200",  # 23 hours later: the clocks went forward
            "2026-03-30 08:00 +0200",
        ], rule


def test_cron_fields() -> None:
    weekdays = Cron("30 9 * * mon-fri")
    assert local(weekdays.next_after(NOON_FRI, MALTA)) == "2026-03-30 09:30 +0200"  # Monday
    assert local(Cron("0 8 * * 7").next_after(NOON_FRI, MALTA)) == "2026-03-29 08:00 +0200"
    assert local(Cron("*/15 * * * *").next_after(NOON_FRI, MALTA)) == "2026-03-27 12:15 +0100"
    assert local(Cron("0 0 1 jan *").next_after(NOON_FRI, MALTA)) == "2027-01-01 00:00 +0100"
    for bad in ("* * *", "61 * * * *", "a b c d e", "0 8 * * funday", "*/0 * * * *"):
        with pytest.raises(RuleError):
            Cron(bad)
    with pytest.raises(RuleError, match="never fires"):
        first_time("every", "0 0 31 2 *", NOON_FRI, MALTA)


def test_bad_zones_and_rules_are_refused() -> None:
    for bad in ("Mars/Olympus", "../etc/passwd", "", "x" * 100):
        with pytest.raises(RuleError):
            zone(bad)
    for bad in ("FREQ=SOMETIMES", "RRULE:FREQ=DAILY;BYHOUR=99", "x" * 300):
        with pytest.raises(RuleError):
            first_time("every", bad, NOON_FRI, MALTA)


# -- the store, on SQLite and PostgreSQL --------------------------------------------------


def test_a_reminder_firing_is_claimed_once_by_one_of_two_daemons(store_place: Place) -> None:
    from chalie.schedule.store import ReminderStore

    a, b = ReminderStore(store_place), ReminderStore(store_place)
    made = _reminder(a, "stretch", 100.0, kind="every", rule="PT1H")
    assert b.get(made.id) == made and [r.id for r in b.due(100.0)] == [made.id]
    seen_a, seen_b = a.due(100.0)[0], b.due(100.0)[0]  # both daemons see it due
    claims = [
        s.fired(r.id, at=100.0, late=False, next_fire=3700.0, due=r.next_fire)
        for s, r in ((a, seen_a), (b, seen_b))
    ]
    assert claims == [True, False]
    after = b.get(made.id)
    assert after is not None and (after.fired, after.next_fire, after.state) == (
        1,
        3700.0,
        "pending",
    )
    assert a.fired(made.id, at=3700.0, late=True, next_fire=None, due=3700.0)
    assert a.get(made.id).state == "done" and a.next_due() is None  # type: ignore[union-attr]
    assert a.cancel(made.id) is False and a.pending_count() == 0
    a.close()
    b.close()


def _reminder(store: Any, text: str, at: float, *, kind: str = "at", rule: str = "x") -> Any:
    return store.add(
        text=text,
        kind=kind,
        rule=rule,
        zone="UTC",
        principal="owner",
        conversation_id=None,
        created=0.0,
        next_fire=at,
    )


def test_a_firing_whose_claimant_died_is_taken_over_once(store_place: Place) -> None:
    """A scheduler's claim lasts until it delivers; its store closing is what a kill -9 does
    to its session: the claim is an orphan, and exactly one other scheduler takes it over."""
    from chalie.schedule.store import ReminderStore

    a = ReminderStore(store_place, claimant="a")
    b, c = ReminderStore(store_place, claimant="b"), ReminderStore(store_place, claimant="c")
    made = _reminder(a, "call mum", 100.0)
    assert a.fired(made.id, at=100.0, late=False, next_fire=None, due=100.0)
    assert b.orphaned() == ([], {"a"})  # a lives: its firing is its own
    a.delivered(made.id)
    assert b.orphaned() == ([], set())  # delivered: nothing claimed
    other = _reminder(a, "water the plants", 200.0)
    assert a.fired(other.id, at=200.0, late=False, next_fire=None, due=200.0)
    a.close()  # dies before delivering
    (orphan, claimant), *_ = b.orphaned()[0]
    assert (orphan.id, orphan.text, orphan.fired, claimant) == (
        other.id,
        "water the plants",
        1,
        "a",
    )
    assert c.orphaned()[0] and [b.reclaim(other.id, "a"), c.reclaim(other.id, "a")] == [True, False]
    assert c.orphaned() == ([], {"b"})  # now b's, alive
    b.delivered(other.id)
    assert c.orphaned() == ([], set())
    b.close()
    c.close()

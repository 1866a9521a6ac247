"""Times in memory calls: ISO prefixes, ranges and relative words, read against a given clock."""

from __future__ import annotations

import datetime as dt

import pytest

from chalie.memory import when

# Thursday 10 December 2026, in the person's zone
NOW = dt.datetime(2026, 12, 10, 9, 0, tzinfo=when.zone("Europe/Malta"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11", ("2026-11", "2026-11")),
        ("2026", ("2026", "2026")),
        ("2026-11-05", ("2026-11-05", "2026-11-05")),
        ("2026-03..2026-05", ("2026-03", "2026-05")),
        ("2026-03-01/2026-03-15", ("2026-03-01", "2026-03-15")),
        ("2026-01 to 2026-02", ("2026-01", "2026-02")),
        ("today", ("2026-12-10", "2026-12-10")),
        ("yesterday", ("2026-12-09", "2026-12-09")),
        ("3 days ago", ("2026-12-07", "2026-12-07")),
        ("last friday", ("2026-12-04", "2026-12-04")),
        ("last thursday", ("2026-12-03", "2026-12-03")),
        ("this week", ("2026-12-07", "2026-12-10")),
        ("Last week", ("2026-11-30", "2026-12-06")),
        ("this month", ("2026-12", "2026-12")),
        ("last month", ("2026-11", "2026-11")),
        ("this year", ("2026", "2026")),
        ("last year", ("2025", "2025")),
        ("in March", ("2026-03", "2026-03")),
        ("March 2025", ("2025-03", "2025-03")),
        ("last 7 days", ("2026-12-04", "2026-12-10")),
    ],
)
def test_a_period_is_an_inclusive_pair_of_iso_prefixes(
    text: str, expected: tuple[str, str]
) -> None:
    assert when.period(text, NOW) == expected


def test_a_month_not_yet_begun_is_last_years() -> None:
    february = dt.datetime(2026, 2, 3, tzinfo=dt.UTC)
    assert when.period("in March", february) == ("2025-03", "2025-03")


@pytest.mark.parametrize("text", ["soonish", "2026-13", "2026-05..2026-03", "", "next week"])
def test_what_it_cannot_read_is_a_time_error(text: str) -> None:
    with pytest.raises(when.TimeError):
        when.period(text, NOW)


def test_a_stored_time_is_an_iso_prefix_or_a_day() -> None:
    assert when.happened("2026-11-05T18:30", NOW) == "2026-11-05T18:30"
    assert when.happened("2026-11", NOW) == "2026-11"
    assert when.happened("yesterday", NOW) == "2026-12-09"
    with pytest.raises(when.TimeError):
        when.happened("last week", NOW)

"""When a memory happened, and the periods a recall asks for, read in the person's time zone.

A memory's ``time`` is when it happened (an ISO date or date-time, or a month or a year
when that is all the person said); ``created`` is when it was stored. Neither replaces
the other: a memory without ``time`` happened, as far as anyone knows, when it was stored.

:func:`happened` reads a store's ``time``: ISO (``2026-11-05``, ``2026-11-05T18:30``,
``2026-11``, ``2026``) or a relative day (``today``, ``yesterday``, ``3 days ago``,
``last friday``), resolved against the person's clock and zone.

:func:`period` reads a recall's ``time`` into an inclusive (since, until) pair of ISO
prefixes: a day, a month, a year, a range (``2026-03..2026-05``, ``2026-03-01/2026-03-15``)
or a relative period (``today``, ``yesterday``, ``this week``, ``last week``,
``this month``, ``last month``, ``this year``, ``last year``, ``in March``,
``March 2026``, ``last 7 days``). The framework resolves them, never the model.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from typing import Final

MONTHS: Final = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
DAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
HINT: Final = (
    "pass time as 2026-11-05, 2026-11, 2026, a range 2026-03..2026-05, or words: today, "
    "yesterday, this week, last week, this month, last month, this year, last year, "
    "in March, March 2026, last 7 days."
)
_RANGE: Final = re.compile(r"^\s*(\S+)\s*(?:\.\.|/|\bto\b)\s*(\S+)\s*$")
_YEAR: Final = re.compile(r"^\d{4}$")
_MONTH: Final = re.compile(r"^\d{4}-\d{2}$")
_AGO: Final = re.compile(r"^(\d{1,3}) days? ago$")
_LAST_N: Final = re.compile(r"^(?:last|past) (\d{1,3}) days$")


class TimeError(ValueError):
    """A time the memory cannot read; its message names what it got."""


def zone(name: str | None) -> dt.tzinfo:
    if not name:
        return dt.UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return dt.UTC


def iso(value: str) -> str | None:
    """``value`` as a normalised ISO prefix (year, month, day or minute), or None."""
    value = value.strip()
    try:
        if _YEAR.match(value):
            return value
        if _MONTH.match(value):
            return dt.date(int(value[:4]), int(value[5:]), 1).isoformat()[:7]
        if len(value) == 10:
            return dt.date.fromisoformat(value).isoformat()
        return dt.datetime.fromisoformat(value).isoformat(timespec="minutes")[:16]
    except ValueError:
        return None


def _words(value: str) -> str:
    return " ".join(value.casefold().replace(",", " ").split())


def _month_named(word: str) -> int | None:
    for i, name in enumerate(MONTHS, 1):
        if word == name or (len(word) >= 3 and name.startswith(word)):
            return i
    return None


def happened(value: str, now: dt.datetime) -> str:
    """A store's ``time``: an ISO prefix, or a relative day resolved against ``now``."""
    found = iso(value)
    if found is not None:
        return found
    day = _day(_words(value), now.date())
    if day is None:
        raise TimeError(f"time {value[:40]!r} is not a date or a day this memory can read.")
    return day.isoformat()


def _day(words: str, today: dt.date) -> dt.date | None:
    if words == "today":
        return today
    if words == "yesterday":
        return today - dt.timedelta(days=1)
    m = _AGO.match(words)
    if m:
        return today - dt.timedelta(days=int(m.group(1)))
    if words.startswith("last ") and words[5:] in DAYS:
        back = (today.weekday() - DAYS.index(words[5:])) % 7 or 7
        return today - dt.timedelta(days=back)
    return None


def period(value: str, now: dt.datetime) -> tuple[str, str]:
    """A recall's ``time`` as an inclusive (since, until) pair of ISO prefixes."""
    m = _RANGE.match(value)
    if m and iso(m.group(1)) and iso(m.group(2)):
        since, until = iso(m.group(1)), iso(m.group(2))
        assert since is not None and until is not None
        if since[: len(until)] > until:
            raise TimeError(f"time range {value[:40]!r} ends before it starts.")
        return since, until
    found = iso(value)
    if found is not None:
        return found, found
    got = _relative(_words(value), now.date())
    if got is None:
        raise TimeError(f"time {value[:40]!r} is not a date, a period or a range.")
    return got


def _relative(words: str, today: dt.date) -> tuple[str, str] | None:
    day = _day(words, today)
    if day is not None:
        return day.isoformat(), day.isoformat()
    monday = today - dt.timedelta(days=today.weekday())
    if words == "this week":
        return monday.isoformat(), today.isoformat()
    if words == "last week":
        start = monday - dt.timedelta(days=7)
        return start.isoformat(), (monday - dt.timedelta(days=1)).isoformat()
    if words == "this month":
        return today.isoformat()[:7], today.isoformat()[:7]
    if words == "last month":
        last = today.replace(day=1) - dt.timedelta(days=1)
        return last.isoformat()[:7], last.isoformat()[:7]
    if words == "this year":
        return str(today.year), str(today.year)
    if words == "last year":
        return str(today.year - 1), str(today.year - 1)
    m = _LAST_N.match(words)
    if m:
        start = today - dt.timedelta(days=int(m.group(1)) - 1)
        return start.isoformat(), today.isoformat()
    parts = words.removeprefix("in ").split()
    month = _month_named(parts[0]) if parts else None
    if month is not None and len(parts) == 1:
        # the last such month that has begun: "in March" in February is last year's
        year = today.year if month <= today.month else today.year - 1
        return f"{year}-{month:02d}", f"{year}-{month:02d}"
    if month is not None and len(parts) == 2 and _YEAR.match(parts[1]):
        return f"{parts[1]}-{month:02d}", f"{parts[1]}-{month:02d}"
    return None

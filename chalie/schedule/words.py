"""How often a reminder fires, in words a person reads on an approval prompt.

``every day at 09:00``, ``every 10 minutes``, ``every Monday and Thursday at 08:30``,
``every month on the 1st at 09:00``, not ``FREQ=DAILY;BYHOUR=9``. The words are read
off the rule's own next firings (:data:`SAMPLES` of them, in the rule's zone), so an
RRULE and a cron line that fire alike read alike, and a rule the patterns below do
not fit still says how close its firings come and when the next is. Every answer
ends with the next firing, so a person can check the words against a date.
"""

from __future__ import annotations

import datetime as dt
import itertools
import zoneinfo
from typing import Final

from chalie.schedule.rules import RuleKind, firings, parse_at, parse_delay

SAMPLES: Final = 32
_WEEKDAYS: Final = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_UNITS: Final = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def in_words(kind: RuleKind, rule: str, created: float, tz: zoneinfo.ZoneInfo) -> str:
    """When a reminder fires, in words (raises chalie.schedule.rules.RuleError on a bad rule)."""
    if kind == "at":
        return f"once, {_moment(parse_at(rule, tz), tz)}"
    if kind == "after":
        delay = parse_delay(rule)
        return f"once, in {duration(delay)}, {_moment(created + delay, tz)}"
    times = firings(rule, created, tz, SAMPLES)
    if not times:
        return "never (the rule fires no more)"
    if len(times) == 1:
        return f"once, {_moment(times[0], tz)}"
    return f"{_repeats(times, tz)}; next {_moment(times[0], tz)}"


def duration(seconds: float) -> str:
    """``10 minutes``, ``1 hour 30 minutes``, ``2 days``: at most two units."""
    left, parts = round(seconds), []
    for name, size in _UNITS:
        count, left = divmod(left, size)
        if count:
            parts.append(f"{count} {name}" + ("s" if count != 1 else ""))
    return " ".join(parts[:2]) or "0 seconds"


def _repeats(times: list[float], tz: zoneinfo.ZoneInfo) -> str:
    gaps = {round(b - a) for a, b in itertools.pairwise(times)}
    if len(gaps) == 1 and (gap := gaps.pop()) < 86400:
        words = duration(gap)
        return "every " + (words[2:] if words.startswith("1 ") and " " not in words[2:] else words)
    local = [dt.datetime.fromtimestamp(t, tz) for t in times]
    clock = sorted({m.strftime("%H:%M") for m in local})
    days = sorted({m.date() for m in local})
    shortest = min(b - a for a, b in itertools.pairwise(times))
    if len(clock) <= 12:
        pattern = _days(days)
        if pattern is not None:
            return f"{pattern} at {_and(clock)}"
    return f"on an irregular schedule, at most every {duration(shortest)}"


def _days(days: list[dt.date]) -> str | None:
    """The dates' pattern (``every day``, ``every Monday and Friday``...) or None."""
    steps = {(b - a).days for a, b in itertools.pairwise(days)}
    if len(days) < 2:
        return None
    if steps == {1}:
        return "every day"
    weekdays = sorted({d.weekday() for d in days})
    if max(steps) <= 7 and _weekly(days):
        if weekdays == [0, 1, 2, 3, 4]:
            return "every weekday (Monday to Friday)"
        return "every " + _and([_WEEKDAYS[w] for w in weekdays])
    if len(steps) == 1:
        step = steps.pop()
        if step % 7 == 0:
            return f"every {step // 7} weeks on {_WEEKDAYS[days[0].weekday()]}"
        return f"every {step} days"
    if len({d.day for d in days}) == 1:
        months = {(b.year - a.year) * 12 + b.month - a.month for a, b in itertools.pairwise(days)}
        if months == {1}:
            return f"every month on the {_ordinal(days[0].day)}"
        if months == {12}:
            return f"every year on {days[0].day} {days[0]:%B}"
    return None


def _weekly(days: list[dt.date]) -> bool:
    """Whether the dates are the same weekdays every week (no week skipped or changed)."""
    seen = {d.weekday() for d in days}
    first, last = days[0], days[-1]
    expected = [
        first + dt.timedelta(days=n)
        for n in range((last - first).days + 1)
        if (first + dt.timedelta(days=n)).weekday() in seen
    ]
    return expected == days


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _moment(at: float, tz: zoneinfo.ZoneInfo) -> str:
    local = dt.datetime.fromtimestamp(at, tz)
    return f"on {local:%A} {local.day} {local:%B %Y} at {local:%H:%M} ({tz.key})"

"""When a reminder fires: once at a time, once after a delay, or on a recurrence rule, in a zone.

A rule is one of:

- ``at``: an ISO 8601 date-time; without an offset it is read in the zone;
- ``after``: a delay, ``90`` (seconds) or ``1h30m``, ``2d``, ``45s``;
- ``every``: an RFC 5545 RRULE (``FREQ=WEEKLY;BYDAY=MO;BYHOUR=8;BYMINUTE=0``),
  or a cron line of five fields (``30 8 * * mon-fri``: minute, hour, day of
  month, month, day of week).

Recurring rules are wall-clock rules in their zone: "08:00 every Monday in
Europe/Malta" stays 08:00 across daylight-saving changes. Times are kept and
compared as UTC epoch seconds.
"""

from __future__ import annotations

import datetime as dt
import itertools
import re
import zoneinfo
from typing import Final, Literal

from dateutil import rrule

RuleKind = Literal["at", "after", "every"]
RULE_KINDS: Final = ("at", "after", "every")
MAX_RULE: Final = 200
MAX_DELAY: Final = 10 * 365 * 86400.0
# A cron rule that matches nothing within this many days is refused.
CRON_HORIZON_DAYS: Final = 366 * 5
_DELAY: Final = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_DAYS: Final = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_MONTHS: Final = {
    m: i + 1
    for i, m in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
    )
}


class RuleError(ValueError):
    """A rule that cannot be read; the message says what is wrong and what would do."""


def zone(name: str) -> zoneinfo.ZoneInfo:
    try:
        if not name or name.startswith(("/", ".")) or ".." in name or len(name) > 64:
            raise ValueError(name)
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise RuleError(
            f"{name[:64]!r} is not an IANA time zone (e.g. Europe/Malta, UTC)"
        ) from None


def parse_delay(text: str) -> float:
    text = text.strip().lower().replace(" ", "")
    if text.isdigit():
        seconds = float(text)
    else:
        m = _DELAY.match(text)
        if not m or not any(m.groups()):
            raise RuleError(f"{text[:40]!r} is not a delay (90, 45s, 10m, 1h30m, 2d)")
        d, h, mi, s = (int(g or 0) for g in m.groups())
        seconds = float(d * 86400 + h * 3600 + mi * 60 + s)
    if not 0 < seconds <= MAX_DELAY:
        raise RuleError("a delay is more than 0 seconds and at most 10 years")
    return seconds


def parse_at(text: str, tz: zoneinfo.ZoneInfo) -> float:
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise RuleError(f"{text[:40]!r} is not an ISO 8601 date-time (2026-12-24T18:00)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=tz)
    return moment.timestamp()


# -- cron ------------------------------------------------------------------------------


def _field(text: str, low: int, high: int, names: dict[str, int] | None = None) -> frozenset[int]:
    out: set[int] = set()
    for part in text.lower().split(","):
        step = 1
        if "/" in part:
            part, _, step_text = part.partition("/")
            if not step_text.isdigit() or int(step_text) < 1:
                raise RuleError(f"bad step in cron field {text!r}")
            step = int(step_text)

        def value(v: str) -> int:
            if names and v in names:
                return names[v]
            if not v.isdigit():
                raise RuleError(f"bad value {v!r} in cron field {text!r}")
            return int(v)

        if part == "*":
            lo, hi = low, high
        elif "-" in part:
            a, _, b = part.partition("-")
            lo, hi = value(a), value(b)
        else:
            lo = hi = value(part)
        if not (low <= lo <= high and low <= hi <= high and lo <= hi):
            raise RuleError(f"cron field {text!r} is out of range {low}-{high}")
        out.update(range(lo, hi + 1, step))
    return frozenset(out)


class Cron:
    """Five cron fields; days match when day-of-month and day-of-week both allow them."""

    def __init__(self, text: str) -> None:
        parts = text.split()
        if len(parts) != 5:
            raise RuleError(
                f"a cron rule has five fields (minute hour day month weekday): {text!r}"
            )
        self.minutes = sorted(_field(parts[0], 0, 59))
        self.hours = sorted(_field(parts[1], 0, 23))
        self.days = _field(parts[2], 1, 31)
        self.months = _field(parts[3], 1, 12, _MONTHS)
        # 7 is Sunday too
        self.weekdays = frozenset(d % 7 for d in _field(parts[4], 0, 7, _DAYS))

    def next_after(self, after: float, tz: zoneinfo.ZoneInfo) -> float | None:
        local = dt.datetime.fromtimestamp(after, tz)
        day = local.date()
        for _ in range(CRON_HORIZON_DAYS):
            weekday = (day.weekday() + 1) % 7  # cron: 0 is Sunday
            if day.month in self.months and day.day in self.days and weekday in self.weekdays:
                for hour in self.hours:
                    for minute in self.minutes:
                        moment = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=tz)
                        ts = moment.timestamp()
                        if ts > after:
                            return ts
            day += dt.timedelta(days=1)
        return None


# -- the rule --------------------------------------------------------------------------


def _is_cron(text: str) -> bool:
    return len(text.split()) == 5 and "=" not in text


def _rrule(text: str, start: float, tz: zoneinfo.ZoneInfo) -> rrule.rrule:
    body = text.strip()
    if body.upper().startswith("RRULE:"):
        body = body[6:]
    try:
        dtstart = dt.datetime.fromtimestamp(start, tz).replace(microsecond=0)
        rule = rrule.rrulestr(body, dtstart=dtstart, forceset=False)
    except (ValueError, TypeError, KeyError) as exc:
        raise RuleError(f"not an RRULE ({exc}); e.g. FREQ=DAILY;BYHOUR=8;BYMINUTE=0") from None
    if not isinstance(rule, rrule.rrule):
        raise RuleError("one RRULE only")
    return rule


def check_every(text: str, start: float, tz: zoneinfo.ZoneInfo) -> None:
    """RuleError unless ``text`` is a recurrence that fires at least once after ``start``."""
    if len(text) > MAX_RULE:
        raise RuleError(f"a rule is at most {MAX_RULE} characters")
    if next_time("every", text, start, tz, start) is None:
        raise RuleError("the rule never fires after now")


def next_time(
    kind: RuleKind, rule: str, created: float, tz: zoneinfo.ZoneInfo, after: float
) -> float | None:
    """The first firing strictly after ``after``, or None when the rule is spent."""
    if kind == "at":
        at = parse_at(rule, tz)
        return at if at > after else None
    if kind == "after":
        at = created + parse_delay(rule)
        return at if at > after else None
    if _is_cron(rule):
        return Cron(rule).next_after(after, tz)
    found = _rrule(rule, created, tz).after(dt.datetime.fromtimestamp(after, tz), inc=False)
    return None if found is None else found.timestamp()


def firings(rule: str, start: float, tz: zoneinfo.ZoneInfo, samples: int = 32) -> list[float]:
    """A recurrence's next ``samples`` firings after ``start`` (fewer when it is spent)."""
    times: list[float] = []
    at = start
    for _ in range(samples):
        found = next_time("every", rule, start, tz, at)
        if found is None:
            break
        times.append(found)
        at = found
    return times


def shortest_gap(rule: str, start: float, tz: zoneinfo.ZoneInfo, samples: int = 32) -> float | None:
    """The shortest time between two of a recurrence's next ``samples`` firings after
    ``start`` (None: it fires once at most)."""
    times = firings(rule, start, tz, samples)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return min(gaps) if gaps else None


def first_time(kind: RuleKind, rule: str, created: float, tz: zoneinfo.ZoneInfo) -> float:
    """The first firing of a new reminder; RuleError if it has none."""
    if kind == "at":
        at = parse_at(rule, tz)
        if at <= created:
            raise RuleError("that time has already passed")
        return at
    if kind == "after":
        return created + parse_delay(rule)
    if len(rule) > MAX_RULE:
        raise RuleError(f"a rule is at most {MAX_RULE} characters")
    found = next_time(kind, rule, created, tz, created)
    if found is None:
        raise RuleError("the rule never fires after now")
    return found

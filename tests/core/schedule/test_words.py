"""How often a reminder fires, in the words its approval prompt shows (chalie.schedule.words)."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from chalie.schedule.rules import RuleError
from chalie.schedule.words import in_words

MALTA = zoneinfo.ZoneInfo("Europe/Malta")
# Sunday 6 December 2026, 22:00 in Malta.
NOW = dt.datetime(2026, 12, 6, 22, 0, tzinfo=MALTA).timestamp()


@pytest.mark.parametrize(
    ("kind", "rule", "words"),
    [
        (
            "every",
            "FREQ=DAILY;BYHOUR=9;BYMINUTE=0",
            "every day at 09:00; next on Monday 7 December",
        ),
        ("every", "0 9 * * *", "every day at 09:00; next on Monday 7 December"),
        ("every", "*/10 * * * *", "every 10 minutes; next on Sunday 6 December 2026 at 22:10"),
        ("every", "FREQ=SECONDLY", "every second;"),
        ("every", "FREQ=MINUTELY;INTERVAL=90", "every 1 hour 30 minutes;"),
        ("every", "30 8 * * mon-fri", "every weekday (Monday to Friday) at 08:30;"),
        ("every", "FREQ=WEEKLY;BYDAY=MO,TH;BYHOUR=8;BYMINUTE=30", "every Monday and Thursday"),
        ("every", "FREQ=WEEKLY;INTERVAL=2;BYDAY=MO;BYHOUR=9;BYMINUTE=0", "every 2 weeks on Monday"),
        ("every", "0 9 1 * *", "every month on the 1st at 09:00; next on Friday 1 January 2027"),
        ("every", "FREQ=YEARLY;BYMONTH=12;BYMONTHDAY=24;BYHOUR=18", "every year on 24 December"),
        ("every", "0 9-11 * * *", "every day at 09:00, 10:00 and 11:00;"),
        ("every", "FREQ=DAILY;COUNT=1;BYHOUR=9;BYMINUTE=0", "once, on Monday 7 December 2026"),
        ("after", "20m", "once, in 20 minutes, on Sunday 6 December 2026 at 22:20"),
        ("at", "2026-12-24T18:00", "once, on Thursday 24 December 2026 at 18:00 (Europe/Malta)"),
    ],
)
def test_a_rule_reads_as_words(kind: str, rule: str, words: str) -> None:
    said = in_words(kind, rule, NOW, MALTA)  # type: ignore[arg-type]
    assert said.startswith(words), said
    assert "FREQ" not in said and "*" not in said


def test_a_rule_across_a_clock_change_keeps_its_wall_clock_words() -> None:
    march = dt.datetime(2027, 3, 20, 12, 0, tzinfo=MALTA).timestamp()  # DST on 28 March
    assert in_words("every", "0 7 * * *", march, MALTA).startswith("every day at 07:00;")


def test_a_bad_rule_is_a_rule_error() -> None:
    with pytest.raises(RuleError):
        in_words("every", "FREQ=NEVERLY", NOW, MALTA)

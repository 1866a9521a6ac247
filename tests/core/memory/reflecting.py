"""What the reflection tests share: a harness whose reflections the test drives by a manual
clock, on a daily token budget, and the scheduler's status."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from actors.scheduler import Scheduler
from chalie.schedule.clock import ManualClock
from tests.core.conversation.harness import Harness


def reflection_harness(clock: ManualClock, tokens_per_day: int) -> Iterator[Harness]:
    """A fixture's body: reflections after 60 s idle on ``clock``, closed at the end."""
    harness = Harness(
        extra_toml="[background]\nreflection_idle = 60.0\n"
        f"reflection_tokens_per_day = {tokens_per_day}\n",
        clock=clock,
    )
    try:
        yield harness
    finally:
        harness.close()


def scheduler_status(h: Harness) -> dict[str, Any]:
    found: dict[str, Any] = h.rt.child("scheduler", Scheduler).within(10).call(Scheduler.status)
    return found

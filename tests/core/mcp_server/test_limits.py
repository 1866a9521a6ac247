"""Per-token limits refuse at once with a retry time; they never queue."""

from __future__ import annotations

import pytest

from chalie.mcp_server.limits import Refused, TokenLimits


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_requests_past_the_minute_budget_are_refused_with_retry_after() -> None:
    clock = Clock()
    limits = TokenLimits(requests_per_minute=60, max_concurrent_turns=2, clock=clock)
    for _ in range(60):
        limits.admit("a")
    with pytest.raises(Refused) as err:
        limits.admit("a")
    assert err.value.limit == "requests_per_minute" and err.value.retry_after == 1
    limits.admit("b")  # another token has its own budget
    clock.now += 1.0
    limits.admit("a")


def test_turn_slots_are_per_token_and_released() -> None:
    limits = TokenLimits(requests_per_minute=60, max_concurrent_turns=2)
    limits.begin_turn("a")
    limits.begin_turn("a")
    with pytest.raises(Refused) as err:
        limits.begin_turn("a")
    assert err.value.limit == "max_concurrent_turns" and err.value.retry_after >= 1
    limits.begin_turn("b")
    limits.end_turn("a")
    limits.begin_turn("a")
    assert limits.turns("a") == 2


def test_idle_buckets_are_forgotten_so_many_tokens_stay_bounded() -> None:
    clock = Clock()
    limits = TokenLimits(requests_per_minute=60, max_concurrent_turns=1, clock=clock)
    for i in range(5000):
        limits.admit(f"t{i}")
        clock.now += 0.1
    assert len(limits) < 2500  # 1200 live (120 s idle) + one sweep period

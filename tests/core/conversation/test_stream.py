"""DeltaThrottle: the first delta after a short wait, then one joined delta per window; what is
held goes out on flush (a failure) or is taken (the end, stored with the answer)."""

from __future__ import annotations

from typing import Any

from chalie.conversation.stream import DeltaThrottle


class Clock:
    """The two loop methods the throttle uses, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Any, list[bool]]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, fn: Any) -> Any:
        cancelled = [False]
        self.timers.append((when, fn, cancelled))

        class Handle:
            def cancel(self) -> None:
                cancelled[0] = True

        return Handle()

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, fn, cancelled in due:
            if not cancelled[0]:
                fn()

    def pending(self) -> int:
        return sum(1 for t in self.timers if not t[2][0])


def throttle(
    window: float = 0.04, first_wait: float = 0.01
) -> tuple[DeltaThrottle, Clock, list[str]]:
    clock, out = Clock(), []
    made = DeltaThrottle(clock, out.append, window, first_wait)  # type: ignore[arg-type]
    return made, clock, out


def test_the_first_delta_waits_briefly_and_the_next_ones_wait_for_the_window() -> None:
    t, clock, out = throttle()
    t.add("Hel")
    t.add("lo")
    assert out == [] and clock.pending() == 1
    clock.advance(0.01)
    assert out == ["Hello"]
    t.add(", wor")
    t.add("ld")
    assert out == ["Hello"] and clock.pending() == 1  # one timer, however many deltas
    clock.advance(0.039)
    assert out == ["Hello"]
    clock.advance(0.001)
    assert out == ["Hello", ", world"] and clock.pending() == 0


def test_an_answer_that_ends_within_the_first_wait_is_taken_whole_and_never_sent() -> None:
    t, clock, out = throttle()
    t.add("It is ")
    t.add("noon.")
    assert t.take() == "It is noon."
    clock.advance(1.0)
    assert out == [] and clock.pending() == 0
    assert t.take() == ""


def test_flush_passes_on_what_is_held_and_cancels_the_timer() -> None:
    t, clock, out = throttle(first_wait=0.0)
    t.add("a")
    t.add("b")
    t.add("c")
    t.flush()
    assert out == ["a", "bc"] and clock.pending() == 0
    t.flush()  # nothing held: nothing sent
    clock.advance(1.0)
    assert out == ["a", "bc"]


def test_after_a_quiet_window_the_next_delta_goes_at_once_again() -> None:
    t, clock, out = throttle(first_wait=0.0)
    t.add("one")
    clock.advance(0.5)
    t.add("two")
    assert out == ["one", "two"] and clock.pending() == 0


def test_empty_deltas_are_not_events() -> None:
    t, clock, out = throttle()
    t.add("")
    t.flush()
    assert out == [] and clock.pending() == 0


def test_nothing_is_lost_or_reordered_over_many_windows() -> None:
    t, clock, out = throttle()
    sent = [f"w{i} " for i in range(500)]
    for i, piece in enumerate(sent):
        t.add(piece)
        clock.advance(0.003 if i % 7 else 0.05)
    t.flush()
    assert "".join(out) == "".join(sent)
    assert len(out) < len(sent) // 3

"""What a recall shows: at least k, more while the top is flat, within a token budget."""

from __future__ import annotations

import pytest

from chalie.memory.fusion import ASKS, asks, lift, within_budget
from chalie.memory.records import Memory, Recalled


def hits(*scores: float, text: str = "a memory of about eight tokens long") -> list[Recalled]:
    return [
        Recalled(memory=Memory(id=i + 1, principal="owner", kind="fact", text=text), score=s)
        for i, s in enumerate(scores)
    ]


def test_a_steep_top_shows_the_first_five() -> None:
    shown = within_budget(hits(1.0, 0.9, 0.8, 0.7, 0.6, 0.3, 0.2, 0.1), 5, 400)
    assert [h.memory.id for h in shown] == [1, 2, 3, 4, 5]


def test_a_flat_top_shows_more_while_it_stays_flat() -> None:
    shown = within_budget(hits(0.5, 0.5, 0.49, 0.48, 0.47, 0.46, 0.45, 0.2, 0.19), 5, 400)
    assert [h.memory.id for h in shown] == [1, 2, 3, 4, 5, 6, 7]


def test_the_budget_stops_a_flat_top_but_never_the_first_five() -> None:
    long = "word " * 80  # ~100 tokens each
    shown = within_budget(hits(*[0.5] * 10, text=long), 5, 600)
    assert len(shown) == 6
    assert len(within_budget(hits(*[0.5] * 10, text=long), 5, 10)) == 5
    assert within_budget([], 5, 400) == []


def test_a_memory_that_ends_on_a_question_weighs_less_than_a_statement() -> None:
    def memory(mid: int, text: str) -> Memory:
        return Memory(id=mid, principal="owner", kind="event", text=text)

    rows = {
        1: memory(1, 'Gina said on 1 May 2023: "Wow! What did you get?"'),
        2: memory(2, 'Gina said on 1 May 2023: "I designed the shop\'s front window."'),
        3: memory(3, "Should I call the plumber?"),
    }
    scores = lift({1: 0.3, 2: 0.3, 3: 0.3}, [1, 2, 3], rows, "what did Gina design")
    assert scores[2] == 0.3
    assert scores[1] == scores[3] == pytest.approx(0.3 * (1 - ASKS))
    assert asks('"Really?" ') and asks("where now?\u201d") and not asks("A fact. Or not")

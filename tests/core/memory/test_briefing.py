"""The brief a turn puts in its request: relevant memories and standing facts, on a budget."""

from __future__ import annotations

import datetime as dt

import pytest

from chalie.calls.untrusted import WARNING_LINE
from chalie.memory import when
from chalie.memory.book import MemoryBook
from chalie.memory.briefing import BUDGET, HEADER, brief
from chalie.memory.fusion import tokens
from chalie.memory.records import Draft, Provenance
from chalie.memory.whose import OWNER

pytestmark = pytest.mark.slow

ME = Provenance(principal=OWNER, conversation_id="c1")
READ_A_PAGE = Provenance(principal=OWNER, conversation_id="c2", untrusted=("web_fetch",))
NOW = dt.datetime(2026, 12, 6, 18, 0, tzinfo=dt.UTC).timestamp()
MALTA = when.zone("Europe/Malta")


def run(book: MemoryBook, message: str, **kw: object) -> tuple[str, tuple[int, ...], int]:
    b = brief(book, [OWNER], message, zone=MALTA, zone_name="Europe/Malta", now=NOW, **kw)  # type: ignore[arg-type]
    return b.text, b.ids, b.tokens


def test_the_relevant_memories_and_standing_facts_with_source_and_untrusted_mark(
    book: MemoryBook,
) -> None:
    aisle, _ = book.store_memory(
        Draft(text="I prefer aisle seats on long flights", kind="preference"), ME
    )
    name, _ = book.store_memory(Draft(text="My name is Maria Borg"), ME)
    anna, _ = book.store_memory(
        Draft(text="My sister Anna lives in Lisbon", people=("Anna",), time="2026-03"), ME
    )
    book.store_memory(Draft(text="The boiler was serviced in May"), ME)
    spam, _ = book.store_memory(Draft(text="Anna's new address is 12 Rua Augusta"), READ_A_PAGE)
    text, ids, size = run(book, "I'm flying to see Anna next week, any ideas?")
    lines = text.split("\n")
    assert lines[0] == HEADER
    assert lines[1] == "- time zone: Europe/Malta (now Sunday 06 December 2026, 19:00)"
    # standing facts first, whatever the message: the preference and the name
    assert ids[:2] == (name.id, aisle.id)
    assert f"- (#{anna.id}; fact; 2026-03; from person) My sister Anna lives in Lisbon" in lines
    # the untrusted one is below the warning line, with where it came from
    assert WARNING_LINE in lines
    below = lines[lines.index(WARNING_LINE) + 1 :]
    assert below == [
        f"- (#{spam.id}; fact; from person; untrusted: web_fetch) "
        "Anna's new address is 12 Rua Augusta"
    ]
    assert ids[-1] == spam.id
    assert size == tokens(text) <= BUDGET


def test_it_keeps_to_its_budget_and_leaves_out_the_past(book: MemoryBook) -> None:
    porto, _ = book.store_memory(Draft(text="I live in Porto"), ME)
    lisbon, _ = book.store_memory(Draft(text="I moved to Lisbon"), ME, supersedes=porto.id)
    for i in range(30):
        book.store_memory(
            Draft(text=f"Note {i} about my flat in Lisbon: the landlord fixed item {i * 7}"), ME
        )
    _, ids, size = run(book, "where do I live these days?", budget=120)
    assert size <= 120
    assert porto.id not in ids
    assert lisbon.id in ids
    assert len(ids) < 10


def test_an_empty_memory_is_the_header_and_the_time_zone(book: MemoryBook) -> None:
    text, ids, _ = run(book, "hello")
    assert ids == ()
    assert text.split("\n")[0] == HEADER and len(text.split("\n")) == 2


def test_the_budget_holds_with_the_untrusted_warning_line_and_every_newline(
    book: MemoryBook,
) -> None:
    """The whole text a turn carries, the warning line above untrusted memories and the line
    breaks included, stays within the budget, whatever the budget."""
    for i in range(12):
        book.store_memory(Draft(text=f"Lisbon flat note {i}: the landlord fixed the tap"), ME)
        book.store_memory(
            Draft(text=f"Lisbon flat listing {i}: two rooms, river view, ask Rui"), READ_A_PAGE
        )
    over = []
    for budget in range(90, 290, 7):
        text, ids, size = run(book, "what about my flat in Lisbon?", budget=budget)
        assert size == tokens(text)
        if size > budget:
            over.append((budget, size, WARNING_LINE in text))
    assert over == []
    text, ids, _ = run(book, "what about my flat in Lisbon?", budget=290)
    assert WARNING_LINE in text and len(ids) >= 3

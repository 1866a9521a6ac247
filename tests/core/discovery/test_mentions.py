"""A framework seed's mention rung: the tools a person's message names in words."""

from __future__ import annotations

import pytest

from chalie.discovery.cascade import EntryOutcome, FindResult, confident, mentioned
from chalie.discovery.types import ToolDoc

NAMES = ("email", "contacts", "calendar", "web_search", "search", "weather", "_mcp_files__read")
KNOWN = {n: ToolDoc(n, f"{n} tool", (), n, "builtin") for n in NAMES}


@pytest.mark.parametrize(
    ("message", "named"),
    [
        # the real-model benchmark's prompts the seed missed (contacts came, or nothing)
        ("Send an email to maria.lopez@example.org telling her I'll be late.", ("email",)),
        ("Search the web: when is the Grand Harbour Maritime Museum open?", ("web_search",)),
        ("How many emails are in my inbox?", ("email",)),
        ("Put a meeting with Bob on my calendar tomorrow at 10am.", ("calendar",)),
        ("Add Maria to my contact list", ("contacts",)),
        ("Is the weather in the calendar and my emails?", ("calendar", "email", "weather")),
        ("What time is it in Tokyo?", ()),
        ("search for my keys", ("search",)),  # a whole name, where no longer one holds it
        ("read my files", ()),  # a name's every segment is needed; _-names never
    ],
)
def test_a_message_names_the_tools_whose_every_word_it_holds(
    message: str, named: tuple[str, ...]
) -> None:
    assert mentioned(message, KNOWN) == named


def test_a_seed_offers_what_the_message_names_unless_something_else_surely_fits() -> None:
    def seeded(*entries: EntryOutcome) -> list[str]:
        return confident(FindResult(entries=list(entries)))

    q = "What's Bob's email address?"
    # The 1.5B model took email over the contacts that fit when both were offered.
    fits = EntryOutcome(q, "vector", ("contacts",), distances=(0.31,))
    assert seeded(EntryOutcome(q, "mention", ("email",)), fits) == ["contacts"]
    q = "Search the web: when is the museum open?"
    vague = EntryOutcome(q, "vector", ("weather",), distances=(0.62,))  # past the ceiling
    assert seeded(EntryOutcome(q, "mention", ("web_search",)), vague) == ["web_search"]
    # A fit that is not sure: the named tool comes first, the fit beside it.
    q = "Send an email to maria.lopez@example.org telling her I'll be 10 minutes late."
    loose = EntryOutcome(q, "vector", ("contacts", "email"), distances=(0.50, 0.63))
    assert seeded(EntryOutcome(q, "mention", ("email",)), loose) == ["email", "contacts"]
    # A keyword hit is sure: the named tool stays out.
    q = "what is the weather, and email"
    assert seeded(
        EntryOutcome(q, "mention", ("email",)), EntryOutcome(q, "keyword", ("weather",))
    ) == ["weather"]

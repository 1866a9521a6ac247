"""The cascade: each rung, first yield wins per entry, the ceiling, the union, bad input."""

from __future__ import annotations

import pytest

from chalie.discovery.cascade import (
    MAX_ENTRIES,
    MAX_ENTRY_CHARS,
    NOT_FOUND_HINT,
    QueryError,
    check_queries,
)
from chalie.discovery.embedder import Embedder, load_embedder
from chalie.discovery.engine import DiscoveryEngine
from chalie.discovery.types import ToolDoc

# Starts processes, loads a model or builds indexes: deselect with -m "not slow".
pytestmark = pytest.mark.slow


def tool(name: str, summary: str, *examples: str, source: str = "builtin") -> ToolDoc:
    return ToolDoc(name, summary, tuple(examples), summary[:40], source)


CATALOGUE = [
    tool(
        "get_weather",
        "Current weather conditions and the forecast for a city.",
        "what's the weather in Paris",
        "forecast for tomorrow in Chicago",
        "is it raining in Seattle",
    ),
    tool(
        "web_search",
        "Searches the public web and returns result titles, links and snippets.",
        "look this up on the internet",
        "search online for reviews of this phone",
        "google the opening hours of the museum",
    ),
    tool(
        "email_search",
        "Searches the messages in the user's mailbox by sender, subject or content.",
        "find the email from my landlord",
        "look in my inbox for the invoice",
        "did Anna write to me last week",
    ),
    tool(
        "send_email",
        "Sends an email message to one or more recipients.",
        "email Bob the report",
        "write to the team that I'm late",
        "send a message to anna@example.com",
    ),
    tool(
        "calendar_create_event",
        "Creates an event or appointment on the user's calendar.",
        "book a meeting with John on Monday",
        "put lunch with Sara in my diary",
        "schedule a call for Tuesday afternoon",
    ),
    tool(
        "clock",
        "Tells the current date and time in any time zone and converts between zones.",
        "what time is it in Tokyo",
        "convert 3pm London time to New York",
    ),
    tool(
        "alarm_clock",
        "Sets an alarm that rings at a given time of day.",
        "wake me up at 6:30",
        "set an alarm for tomorrow morning",
    ),
    tool(
        "currency_convert",
        "Converts an amount of money from one currency to another at today's rate.",
        "how many euros is 100 dollars",
        "convert 5000 yen to pounds",
    ),
    tool(
        "translate_text",
        "Translates text from one language into another.",
        "how do you say thank you in Japanese",
        "translate this paragraph into German",
    ),
    tool(
        "play_music",
        "Plays a song, album, artist or playlist on the user's speaker.",
        "put on some jazz",
        "play the latest Taylor Swift album",
    ),
    tool(
        "_mcp_alpha_search_issues",
        "Searches issues in the alpha tracker.",
        source="mcp:alpha",
    ),
    tool(
        "_mcp_beta_search_issues",
        "Searches issues in the beta tracker.",
        source="mcp:beta",
    ),
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder()


@pytest.fixture(scope="module")
def engine(embedder: Embedder) -> DiscoveryEngine:
    return DiscoveryEngine.build(CATALOGUE, embedder)


def test_exact_name_is_pinned_and_wins_over_the_keyword_rung(engine: DiscoveryEngine) -> None:
    result = engine.find(["clock"])
    # alarm_clock would pass the segment gate, but the exact rung yielded first
    assert result.names == ["clock"]
    assert result.entries[0].rung == "exact"


def test_a_name_fragment_climbs_to_the_keyword_rung(engine: DiscoveryEngine) -> None:
    result = engine.find(["weather"])
    assert result.names == ["get_weather"]
    assert result.entries[0].rung == "keyword"


def test_a_described_action_reaches_the_vector_rung(engine: DiscoveryEngine) -> None:
    result = engine.find(["will I need an umbrella in Oslo tomorrow"])
    assert result.entries[0].rung == "vector"
    assert result.names[0] == "get_weather"


def test_an_incidental_name_word_in_a_sentence_does_not_hide_the_vector_hits(
    engine: DiscoveryEngine,
) -> None:
    # "search" is a whole segment of web_search, but the sentence is a described action
    result = engine.find(["search my inbox for the invoice my landlord sent"])
    assert result.entries[0].rung == "vector"
    assert result.names[0] == "email_search"


def test_the_ceiling_turns_unrelated_queries_into_not_found(engine: DiscoveryEngine) -> None:
    result = engine.find(["what is the meaning of life, philosophically speaking"])
    assert result.injected == []
    assert result.not_found == [
        {
            "query": "what is the meaning of life, philosophically speaking",
            "reason": "no-match",
            "hint": NOT_FOUND_HINT,
        }
    ]


def test_vector_hits_never_exceed_the_ceiling(engine: DiscoveryEngine) -> None:
    result = engine.find(["convert money", "wake me early", "say hello in French"], k=10)
    for outcome in result.entries:
        assert all(d <= engine.ceiling for d in outcome.distances)


def test_a_zero_ceiling_leaves_the_vector_rung_empty(embedder: Embedder) -> None:
    strict = DiscoveryEngine.build(CATALOGUE, embedder, ceiling=0.0)
    assert strict.find(["will I need an umbrella in Oslo tomorrow"]).injected == []
    # the name rungs are not subject to the ceiling
    assert strict.find(["weather"]).names == ["get_weather"]


def test_each_entry_yields_at_most_k(engine: DiscoveryEngine) -> None:
    result = engine.find(["help me with my messages and my schedule"], k=2)
    assert 1 <= len(result.names) <= 2


def test_the_union_is_deduplicated_in_entry_order_and_never_truncated(
    engine: DiscoveryEngine,
) -> None:
    entries = [
        "clock",
        "weather",
        "send_email",
        "translate_text",
        "play_music",
        "currency_convert",
        "alarm_clock",
        "calendar_create_event",
        "clock",
    ]
    result = engine.find(entries, k=1)
    expected = ["get_weather" if e == "weather" else e for e in entries[:-1]]
    assert result.names == expected  # eight tools from one call, k=1, no global cap
    assert len(result.body()["injected"]) == 8


def test_an_ambiguous_bare_name_is_refused_with_its_candidates(engine: DiscoveryEngine) -> None:
    result = engine.find(["search_issues", "weather"])
    assert result.names == ["get_weather"]
    (refused,) = result.not_found
    assert refused["query"] == "search_issues"
    assert refused["reason"] == "ambiguous"
    assert set(refused["candidates"]) == {"_mcp_alpha_search_issues", "_mcp_beta_search_issues"}


def test_the_body_has_the_published_shape(engine: DiscoveryEngine) -> None:
    body = engine.find(["weather", "zzzz qqqq"]).body()
    # an entry found nothing: the model is told what kinds of tools exist, and that it
    # may answer without one
    assert set(body) == {"injected", "not_found", "kinds", "note"}
    assert "No tool exists" in body["note"] and body["kinds"]
    assert set(engine.find(["weather"]).body()) == {"injected", "not_found"}
    assert body["injected"] == [
        {
            "name": "get_weather",
            "summary": "Current weather conditions and the forecast for a city.",
        }
    ]


@pytest.mark.parametrize(
    "bad",
    [
        [],
        ["x"] * (MAX_ENTRIES + 1),
        ["x" * (MAX_ENTRY_CHARS + 1)],
        ["   "],
        ["\x00\x07"],
        [3],
        "weather",
        None,
    ],
)
def test_malformed_query_arrays_are_refused_by_name(engine: DiscoveryEngine, bad: object) -> None:
    with pytest.raises(QueryError):
        engine.find(bad)  # type: ignore[arg-type]


def test_control_characters_are_dropped_from_entries() -> None:
    assert check_queries(["get\x00weather\n now"]) == ["get weather now"]


def test_k_out_of_range_is_refused(engine: DiscoveryEngine) -> None:
    for k in (0, -1, 1000, True):
        with pytest.raises(QueryError):
            engine.find(["weather"], k=k)


def test_an_array_answers_each_entry_as_if_it_were_alone(engine: DiscoveryEngine) -> None:
    entries = [
        "will I need an umbrella in Oslo tomorrow",
        "weather",
        "wake me up early tomorrow",
        "how many yen is 20 pounds",
        "what is the meaning of life, philosophically speaking",
    ]
    together = engine.find(entries).entries
    alone = [engine.find([entry]).entries[0] for entry in entries]
    assert [(o.rung, o.names) for o in together] == [(o.rung, o.names) for o in alone]
    for a, b in zip(together, alone, strict=True):
        assert a.distances == pytest.approx(b.distances, abs=1e-4)

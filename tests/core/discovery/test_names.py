"""The name side: segments, the segment gate, the exact rung with ambiguity refusal, persistence."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chalie.discovery.names import NameIndex, bare_name, gate, normalise, segments
from chalie.discovery.types import IndexCorruptError, ToolDoc

NAMES = [
    ("web_search", "builtin"),
    ("review_tool_calls", "builtin"),
    ("research_helper", "builtin"),
    ("get_weather", "builtin"),
    ("calculator", "builtin"),
    ("calendar_create_event", "builtin"),
    ("calendar_delete_event", "builtin"),
    ("ResearchFinder", "builtin"),
    ("_mcp_alpha_search_issues", "mcp:alpha"),
    ("_mcp_beta_search_issues", "mcp:beta"),
    ("_mcp_beta_fetch_page", "mcp:beta"),
]


def docs() -> list[ToolDoc]:
    return [ToolDoc(name, f"{name} tool", source=source) for name, source in NAMES]


@pytest.fixture
def index() -> NameIndex:
    names = NameIndex.create()
    names.upsert(docs())
    return names


def test_segments_split_snake_camel_and_spaces() -> None:
    assert segments("web_search") == ("web", "search")
    assert segments("ResearchHelper") == ("research", "helper")
    assert segments("getHTTPResponse") == ("get", "http", "response")
    assert segments("  Web  Search!! ") == ("web", "search")
    assert normalise("webSearch") == normalise("Web Search") == "web_search"


def test_bare_name_strips_only_the_owning_servers_prefix() -> None:
    assert bare_name(ToolDoc("_mcp_alpha_search_issues", "", source="mcp:alpha")) == "search_issues"
    assert bare_name(ToolDoc("_mcp_alpha_search_issues", "", source="mcp:beta")) == (
        "_mcp_alpha_search_issues"
    )
    assert bare_name(ToolDoc("web_search", "", source="builtin")) == "web_search"


def test_gate_accepts_a_whole_segment() -> None:
    assert gate(("search",), ("web", "search")) == 0.5


def test_gate_rejects_an_incidental_substring_inside_a_segment() -> None:
    # "all" sits inside "calls": not a segment of review_tool_calls
    assert gate(("all",), ("review", "tool", "calls")) is None
    assert gate(("search",), ("research", "helper")) is None


def test_gate_rejects_a_sentence_whose_other_words_do_not_align() -> None:
    sentence = segments("find all the calls I missed on review")
    assert gate(sentence, ("review", "tool", "calls")) is None


def test_gate_tolerates_typos_abbreviations_inflections_and_joined_words() -> None:
    assert gate(("revew", "tool", "calls"), ("review", "tool", "calls")) == 1.0
    assert gate(("calc",), ("calculator",)) == 1.0
    assert gate(("events",), ("calendar", "create", "event")) is not None
    assert gate(("websearch",), ("web", "search")) == 1.0


def test_keyword_rung_finds_names_by_segment(index: NameIndex) -> None:
    assert index.keyword("search")[0] == "web_search"
    assert "research_helper" not in index.keyword("search")
    assert index.keyword("weather") == ["get_weather"]
    assert set(index.keyword("calendar")) == {"calendar_create_event", "calendar_delete_event"}
    assert index.keyword("revew_tool_calls") == ["review_tool_calls"]


def test_keyword_rung_rejects_incidental_words(index: NameIndex) -> None:
    assert index.keyword("all") == []
    assert index.keyword("find all the calls I missed") == []
    assert index.keyword("what's the weather like in Paris") == []


def test_keyword_rung_caps_at_k(index: NameIndex) -> None:
    assert len(index.keyword("search", k=2)) == 2


def test_exact_rung_pins_a_full_name_in_any_spelling(index: NameIndex) -> None:
    assert index.exact("web_search").names == ("web_search",)
    assert index.exact("Web Search").names == ("web_search",)
    assert index.exact("research finder").names == ("ResearchFinder",)
    assert index.exact("weather").names == ()


def test_exact_rung_pins_a_bare_name_with_one_owner(index: NameIndex) -> None:
    assert index.exact("fetch_page").names == ("_mcp_beta_fetch_page",)


def test_exact_rung_refuses_a_bare_name_owned_by_two_sources(index: NameIndex) -> None:
    match = index.exact("search_issues")
    assert match.ambiguous
    assert match.names == ()
    assert set(match.candidates) == {"_mcp_alpha_search_issues", "_mcp_beta_search_issues"}
    # the full name still pins
    assert index.exact("_mcp_beta_search_issues").names == ("_mcp_beta_search_issues",)


def test_upsert_replaces_and_remove_forgets(index: NameIndex) -> None:
    index.upsert([ToolDoc("get_weather", "again", source="builtin")])
    assert len(index) == len(NAMES)
    index.remove(["get_weather", "no_such_tool"])
    assert index.keyword("weather") == []
    assert index.exact("get_weather").names == ()
    assert "get_weather" not in index.all_names()


def test_a_persisted_index_reopens_with_the_same_answers(tmp_path: Path) -> None:
    names = NameIndex.create(tmp_path / "names")
    names.upsert(docs())
    reopened = NameIndex.open(tmp_path / "names")
    assert reopened.all_names() == sorted(n for n, _ in NAMES)
    assert reopened.keyword("search")[0] == "web_search"
    assert reopened.exact("search_issues").ambiguous


def test_opening_a_missing_index_is_a_corrupt_index_error(tmp_path: Path) -> None:
    with pytest.raises(IndexCorruptError):
        NameIndex.open(tmp_path / "nothing")


def test_opening_a_garbled_index_is_a_corrupt_index_error(tmp_path: Path) -> None:
    names = NameIndex.create(tmp_path / "names")
    names.upsert(docs())
    (tmp_path / "names" / "meta.json").write_text("{not json")
    with pytest.raises(IndexCorruptError):
        NameIndex.open(tmp_path / "names")


def test_hostile_entries_do_not_break_either_rung(index: NameIndex) -> None:
    for entry in [
        "",
        "   ",
        "_" * 200,
        "a" * 5000,
        "\x00\x1b[31m",
        "🔥🔥",
        "search OR 1=1 --",
        'web*"',
    ]:
        assert isinstance(index.keyword(entry), list)
        assert index.exact(entry).names == ()


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_any_text_gets_a_gated_answer_or_none(entry: str) -> None:
    names = _shared_index()
    hits = names.keyword(entry)
    entry_segs = segments(entry)
    for name in hits:
        assert gate(entry_segs, segments(name)) is not None


_SHARED: list[NameIndex] = []


def _shared_index() -> NameIndex:
    if not _SHARED:
        names = NameIndex.create()
        names.upsert(docs())
        _SHARED.append(names)
    return _SHARED[0]

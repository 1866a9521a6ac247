"""The word check: keyboard mash, lorem ipsum and pasted code find no tool; real entries do."""

from __future__ import annotations

import pytest

from chalie.discovery.cascade import NOT_FOUND_HINT
from chalie.discovery.embedder import Embedder, load_embedder
from chalie.discovery.engine import DiscoveryEngine
from chalie.discovery.lexicon import english_words, has_words, syntax_share
from chalie.discovery.types import ToolDoc
from tests.slow import require_slow

from .test_intent import CATALOGUE

QREATOR = ToolDoc("qreator", "Make a QR code for a link or some text.", ())
SEARCH = ToolDoc(
    "web_search", "Search the web for pages about a topic.", ("look up reviews online",)
)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    require_slow("a model")
    return load_embedder()


def test_the_vocabulary_holds_english_words_only() -> None:
    words = english_words()
    assert {"weather", "meeting", "email", "tomorrow"} <= words
    assert not {"zzzz", "qwertyuiop", "asdf", "lorem"} & words
    assert not any(w.startswith("##") for w in words)


@pytest.mark.parametrize(
    "entry",
    ["zzzz qqq", "qwertyuiop", "asdf jkl", "lorem ipsum dolor sit amet", "!!!???", "1234567890"],
)
def test_mash_has_no_words(entry: str) -> None:
    assert not has_words(entry, set())


@pytest.mark.parametrize(
    "entry",
    [
        "will I need an umbrella in Oslo tomorrow",
        "run print(sum(range(10))) and tell me what comes out",
        "write to hr@acme.com about my vacation",
        "¿qué tiempo hará mañana en Madrid?",
    ],
)
def test_real_entries_have_words(entry: str) -> None:
    assert has_words(entry, set())


def test_catalogue_words_count_as_known_and_syntax_does_not() -> None:
    assert not has_words("qreator zzyx", set())
    assert has_words("qreator zzyx", {"qreator"})
    assert syntax_share("for (int i = 0; i < n; i++) {}") > 0.3
    assert not has_words("for (int i = 0; i < n; i++) {}", set())
    # the syntax part holds for the multilingual model too, the word part does not
    assert has_words("zzzz qqq", set(), english=False)
    assert not has_words("}); } catch (e) { throw e; }", set(), english=False)


@pytest.mark.slow  # loads the model and builds an index
def test_gibberish_comes_back_in_not_found(embedder: Embedder) -> None:
    engine = DiscoveryEngine.build([*CATALOGUE, QREATOR, SEARCH], embedder)
    for entry in ("zzzz qqq", "qwertyuiop", "lorem ipsum dolor sit amet", "x = [i**2 for i in y]"):
        result = engine.find([entry])
        assert result.injected == [], entry
        assert result.not_found == [{"query": entry, "reason": "no-match", "hint": NOT_FOUND_HINT}]
    assert engine.find(["do I need an umbrella in Paris tomorrow"]).names[0] == "get_weather"
    assert engine.find(["qreator"]).names == ["qreator"]


@pytest.mark.slow  # loads the model and builds an index
def test_a_weather_query_brings_no_unrelated_runner_up(embedder: Embedder) -> None:
    engine = DiscoveryEngine.build([*CATALOGUE, SEARCH], embedder)
    result = engine.find(["what's the weather in Paris tomorrow"])
    assert result.names[0] == "get_weather"
    assert "web_search" not in result.names
    assert all(d <= engine.ceiling for d in result.entries[0].distances)

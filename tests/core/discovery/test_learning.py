"""Learning from use: the examples store, the learning path onto a real index, the head, and
their persistence."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pykka
import pytest
from click.testing import CliRunner

from actors.discovery import DiscoveryActor, DiscoveryHandle
from chalie.calls.registry import Registry
from chalie.discovery.embedder import Embedder, load_embedder
from chalie.discovery.engine import DiscoveryEngine
from chalie.discovery.head import MIN_PHRASES, LinearHead
from chalie.discovery.learning import (
    ExampleError,
    LearnedExamples,
    Learner,
    clean_text,
    redact_text,
)
from chalie.discovery.types import ToolDoc
from chalie.process.config import DiscoveryConfig
from chalie.store.store_place import Place
from chalie_app.cli import cli

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow

DOCS = [
    ToolDoc("horoscope", "Daily horoscope for a star sign.", ()),
    ToolDoc("zodiac_facts", "Facts about the signs of the zodiac.", ()),
    ToolDoc("get_weather", "Current weather and the forecast for a city.", ()),
    ToolDoc("product_search", "Search products in the shop catalogue.", ()),
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder()


@pytest.fixture
def store(store_place: Place) -> Iterator[LearnedExamples]:
    s = LearnedExamples(store_place, per_tool=3)
    yield s
    s.close()


# -- the store ------------------------------------------------------------------------


def test_secrets_in_an_entry_are_redacted_like_trail_parameters() -> None:
    assert redact_text("log in with password hunter2 please") == (
        "log in with password [redacted] please"
    )
    assert "sk_live_4eC39HqLyjWDarjtT1zdp7dc" not in redact_text(
        "charge with key sk_live_4eC39HqLyjWDarjtT1zdp7dc"
    )
    assert clean_text("  find \x07 flights\n to Oslo ") == "find flights to Oslo"
    assert len(clean_text("word " * 500)) <= 200


@pytest.mark.parametrize("bad", ["", "   ", "!!! ???", 42, None, b"bytes"])
def test_an_entry_without_words_is_refused(store: LearnedExamples, bad: Any) -> None:
    with pytest.raises(ExampleError):
        store.add(bad, "horoscope", "chat")


@pytest.mark.parametrize(
    ("tool", "channel"), [("", "chat"), ("x" * 300, "chat"), ("horoscope", ""), ("h", 7)]
)
def test_a_bad_tool_or_channel_is_refused(store: LearnedExamples, tool: Any, channel: Any) -> None:
    with pytest.raises(ExampleError):
        store.add("my horoscope for today", tool, channel)


def test_near_identical_entries_are_stored_once(store: LearnedExamples) -> None:
    first = store.add("what does my horoscope say today", "horoscope", "chat", now=1.0)
    again = store.add("What does my horoscope say, today?", "horoscope", "chat", now=2.0)
    assert first.status == "added" and again.status == "refreshed"
    assert again.example.id == first.example.id and again.example.created == 2.0
    assert len(store.examples("horoscope")) == 1


def test_the_bound_drops_the_most_redundant_then_the_oldest(store: LearnedExamples) -> None:
    store.add("horoscope for leo this week", "horoscope", "chat", now=1.0)
    store.add("daily reading for my star sign", "horoscope", "chat", now=2.0)
    store.add("horoscope for leo this month please", "horoscope", "chat", now=3.0)
    outcome = store.add("what do the stars hold for virgo", "horoscope", "chat", now=4.0)
    texts = [e.text for e in store.examples("horoscope")]
    assert len(texts) == 3 and len(outcome.dropped) == 1
    # one of the two near-duplicates went (the older of them), the distinct ones stayed
    assert "horoscope for leo this week" not in texts
    assert "daily reading for my star sign" in texts
    assert texts[-1] == "what do the stars hold for virgo"


def test_forget_by_tool_by_id_and_clear(store: LearnedExamples) -> None:
    a = store.add("horoscope for leo", "horoscope", "chat").example
    store.add("weather in Oslo", "get_weather", "chat")
    store.add("rain tomorrow in Bergen", "get_weather", "chat")
    assert store.forget_id(a.id) == a
    assert store.forget_id(a.id) is None
    assert store.forget_tool("get_weather") == 2
    store.add("snow in Tromso", "get_weather", "chat")
    assert store.clear() == 1
    assert store.examples() == []


def test_rows_learned_under_an_old_definition_are_dropped(store: LearnedExamples) -> None:
    store.add("horoscope for leo", "horoscope", "chat", definition="v1")
    store.add("weather in Oslo", "get_weather", "chat", definition="w1")
    assert store.drop_changed({"horoscope": "v2", "get_weather": "w1"}) == ["horoscope"]
    assert [e.tool for e in store.examples()] == ["get_weather"]


# -- the learning path onto a real index ---------------------------------------------


def test_learning_reaches_the_index_within_a_second_and_persists(
    tmp_path: Path, embedder: Embedder
) -> None:
    directory = tmp_path / "index"
    engine = DiscoveryEngine.build(DOCS, embedder, directory=directory)
    store = LearnedExamples(tmp_path / "chalie.db")
    learner = Learner(store, engine)
    entry = "what's in store for Sagittarius romance-wise"
    before = engine.find([entry])
    started = time.perf_counter()
    result = learner.learn(entry, "horoscope", "chat")
    after = engine.find([entry])
    assert time.perf_counter() - started < 1.0
    assert result.learned and result.reason == "added"
    assert after.names[0] == "horoscope", (before.names, after.names)
    # the phrase itself is now the closest vector (the name's share of the fusion remains)
    assert after.entries[0].distances[0] < 0.2
    assert not before.names or before.entries[0].distances[0] > after.entries[0].distances[0] + 0.1
    # the journal carries it: a reopened index holds the phrase without the store
    reopened = DiscoveryEngine.open(directory, embedder)
    assert reopened.learned() == {"horoscope": (entry,)}
    assert reopened.find([entry]).names[0] == "horoscope"
    store.close()


def test_the_learning_path_refuses_what_it_must(tmp_path: Path, embedder: Embedder) -> None:
    engine = DiscoveryEngine.build(DOCS, embedder)
    store = LearnedExamples(tmp_path / "chalie.db")
    learner = Learner(store, engine, channels=("chat",))
    assert learner.learn("my horoscope", "horoscope", "external_agent").reason == (
        "channel-not-learning"
    )
    assert learner.learn("my horoscope", "no_such_tool", "chat").reason == "unknown-tool"
    stale = learner.learn("my horoscope", "horoscope", "chat", definition="0" * 32)
    assert stale.reason == "definition-changed"
    assert learner.learn("", "horoscope", "chat").reason == "invalid"
    off = Learner(store, engine, enabled=False)
    assert off.learn("my horoscope", "horoscope", "chat").reason == "learning-off"
    assert store.examples() == [] and engine.learned() == {}
    current = engine.find(["horoscope"]).definitions["horoscope"]
    assert learner.learn("my horoscope", "horoscope", "chat", definition=current).learned
    store.close()


def test_forget_and_clear_take_phrases_out_of_the_index(tmp_path: Path, embedder: Embedder) -> None:
    engine = DiscoveryEngine.build(DOCS, embedder)
    store = LearnedExamples(tmp_path / "chalie.db")
    learner = Learner(store, engine)
    learner.learn("is it going to pour in Leeds", "get_weather", "chat")
    one = learner.learn("stars for capricorn", "horoscope", "chat").example
    assert one is not None
    assert learner.forget(one.id) == 1
    assert engine.learned() == {"get_weather": ("is it going to pour in Leeds",)}
    assert learner.forget("get_weather") == 1
    assert engine.learned() == {}
    learner.learn("stars for capricorn", "horoscope", "chat")
    assert learner.clear() == 1 and engine.learned() == {}
    store.close()


def test_sync_follows_offline_edits_and_changed_definitions(
    tmp_path: Path, embedder: Embedder
) -> None:
    engine = DiscoveryEngine.build(DOCS, embedder)
    store = LearnedExamples(tmp_path / "chalie.db")
    store.add("stars for capricorn", "horoscope", "chat", definition="an-old-definition")
    store.add("is it going to pour in Leeds", "get_weather", "chat")
    counts = Learner(store, engine).sync()
    assert counts == {"tools_changed": 1, "stale_tools": 1}
    assert engine.learned() == {"get_weather": ("is it going to pour in Leeds",)}
    store.close()


# -- the head -------------------------------------------------------------------------


def test_the_head_is_idle_without_phrases_and_deterministic_with_them() -> None:
    rng = np.random.default_rng(0)
    head = LinearHead(8)
    assert not head.active and head.scores(np.ones(8, dtype=np.float32))[0] == []
    rows = rng.normal(size=(MIN_PHRASES, 8)).astype(np.float32)
    head.update("a", None, rows)
    head.update("b", None, rows[:1])  # too few phrases to be scored by the head
    names, sims = head.scores(rows[0])
    assert names == ["a"] and sims.shape == (1,)
    twin = LinearHead(8)
    twin.update("b", None, rows[:1])
    twin.update("a", None, rows)
    assert np.allclose(twin.state(), head.state())
    head.update("a", rows, None)
    head.update("b", rows[:1], None)
    assert not head.active
    assert np.allclose(head.state()[2], np.eye(8))


def test_a_saved_head_is_checksummed_and_restored(tmp_path: Path, embedder: Embedder) -> None:
    directory = tmp_path / "index"
    engine = DiscoveryEngine.build(
        DOCS,
        embedder,
        directory=directory,
        learned={"horoscope": ["stars for leo", "reading for my sign", "what about virgo"]},
    )
    assert engine._vectors.head.active
    state = engine._vectors.head.state()
    reopened = DiscoveryEngine.open(directory, embedder)
    assert np.allclose(reopened._vectors.head.state(), state)
    gen = next(directory.glob("gen-*"))
    head_file = next(gen.glob("vectors-*")) / "head.npy"
    raw = bytearray(head_file.read_bytes())
    raw[-1] ^= 0xFF
    head_file.write_bytes(bytes(raw))
    with pytest.raises(Exception, match="checksum"):
        DiscoveryEngine.open(directory, embedder)


# -- the actor, the handle and the CLI ---------------------------------------------------


@pytest.fixture
def actor(tmp_path: Path, embedder: Embedder) -> Iterator[pykka.ActorRef[Any]]:
    registry = Registry.collect(entry_points=False)
    ref = DiscoveryActor.start(
        registry=registry,
        home=tmp_path,
        embedder=embedder,
        db_path=tmp_path / "chalie.db",
        learning=DiscoveryConfig(),
    )
    yield ref
    if ref.is_alive():
        ref.stop()


def test_the_handle_learns_lists_and_forgets(actor: pykka.ActorRef[Any], tmp_path: Path) -> None:
    handle = DiscoveryHandle(actor)
    result = handle.learn("what's the hour over in Lima", "clock", "chat")
    assert result.learned
    assert [e.text for e in handle.examples("clock")] == ["what's the hour over in Lima"]
    assert handle.find(["what's the hour over in Lima"]).names[0] == "clock"
    assert not handle.learn("hour in Lima", "clock", "external_agent").learned
    # the CLI reads the same store (no daemon on this home)
    out = CliRunner().invoke(
        cli, ["--home", str(tmp_path), "discovery", "examples", "list", "--json"]
    )
    assert out.exit_code == 0, out.output
    assert [r["tool"] for r in json.loads(out.stdout)] == ["clock"]
    assert handle.forget("clock") == 1
    assert handle.examples() == []


def test_removing_a_tool_removes_its_examples(actor: pykka.ActorRef[Any]) -> None:
    handle = DiscoveryHandle(actor)
    handle.add([ToolDoc("tide_times", "High and low tide times for a harbour.", ())])
    assert handle.learn("when does the water come in at Brighton", "tide_times", "chat").learned
    handle.add([ToolDoc("tide_times", "Tide tables, now with surf reports.", ())])
    assert handle.examples("tide_times") == []  # the definition changed
    assert handle.learn("when does the water come in at Brighton", "tide_times", "chat").learned
    handle.remove(["tide_times"])
    assert handle.examples("tide_times") == []


def test_cli_examples_forget_and_clear_offline(tmp_path: Path) -> None:
    store = LearnedExamples(tmp_path / "chalie.db")
    keep = store.add("hour in Lima", "clock", "chat").example
    store.add("square root of 2", "calculator", "chat")
    store.close()
    runner = CliRunner()
    base = ["--home", str(tmp_path), "discovery", "examples"]
    listed = runner.invoke(cli, [*base, "list", "clock"])
    assert listed.exit_code == 0 and "hour in Lima" in listed.stdout
    assert "forgot 1 example" in runner.invoke(cli, [*base, "forget", str(keep.id)]).stdout
    assert "forgot 0 examples" in runner.invoke(cli, [*base, "forget", "clock"]).stdout
    assert "forgot 1 example" in runner.invoke(cli, [*base, "clear"]).stdout
    assert runner.invoke(cli, [*base, "forget", "x" * 300]).exit_code == 2
    assert "no learned examples" in runner.invoke(cli, [*base, "list"]).stdout


def test_a_turn_learns_the_entry_that_led_to_the_tool_it_used(
    actor: pykka.ActorRef[Any],
) -> None:
    from abilities.find_tools import FindTools
    from chalie.calls.invoke import coerce_params, invoke
    from chalie.services import Services
    from chalie.wire.messages import TurnContext

    handle = DiscoveryHandle(actor)
    services = Services(discovery=handle)
    context = TurnContext(conversation_id="c", turn_id="turn-9")
    entries = ["what's the hour over in Lima", "calculator", "square root of 1764 please"]
    result = invoke(FindTools(context, services), coerce_params(FindTools, {"query": entries}))
    assert result.ok
    # the turn then used the clock only; the calculator's name entry teaches nothing
    learned = handle.learn_turn("turn-9", "chat", ["clock"])
    assert [(r.learned, r.example.tool if r.example else None) for r in learned] == [
        (True, "clock")
    ]
    assert [e.text for e in handle.examples()] == ["what's the hour over in Lima"]
    assert handle.learn_turn("turn-9", "chat", ["clock"]) == []  # forgotten after its end
    # an external agent's turn teaches nothing by default
    invoke(FindTools(context, services), coerce_params(FindTools, {"query": entries}))
    refused = handle.learn_turn("turn-9", "external_agent", ["calculator"])
    assert refused and not any(r.learned for r in refused)


def test_remembered_turns_are_bounded(actor: pykka.ActorRef[Any]) -> None:
    from actors import discovery as module

    handle = DiscoveryHandle(actor)
    result = handle.find(["what's the hour over in Lima"])
    for i in range(module.REMEMBERED_TURNS + 10):
        handle.remember(f"t{i}", result)
    assert len(handle._finds) == module.REMEMBERED_TURNS
    assert "t0" not in handle._finds


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[discovery]\nlearn_channels = ["everyone"]\n', "learn_channels"),
        ("[discovery]\nexamples_per_tool = 0\n", "examples_per_tool"),
        ('[discovery]\nlearn = "yes"\n', "learn"),
        ("[discovery]\nforget_everything = true\n", "forget_everything"),
    ],
)
def test_a_bad_discovery_section_is_one_config_error(
    tmp_path: Path, toml: str, message: str
) -> None:
    from chalie.process.config import Config, ConfigError

    (tmp_path / "config.toml").write_text(toml)
    with pytest.raises(ConfigError, match=message):
        Config.load(tmp_path)


def test_the_discovery_section_is_read(tmp_path: Path) -> None:
    from chalie.process.config import Config

    (tmp_path / "config.toml").write_text(
        '[discovery]\nlearn = false\nlearn_channels = ["chat", "subconscious"]\n'
    )
    cfg = Config.load(tmp_path).discovery
    assert cfg == DiscoveryConfig(learn=False, learn_channels=("chat", "subconscious"))


def test_learned_phrases_survive_journal_compaction(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chalie.discovery import engine as engine_module

    monkeypatch.setattr(engine_module, "COMPACT_AFTER", 2)
    directory = tmp_path / "index"
    engine = DiscoveryEngine.build(DOCS, embedder, directory=directory)
    phrases = ["stars for leo", "reading for my sign", "what about virgo", "cancer this week"]
    for i in range(1, len(phrases) + 1):
        assert engine.set_learned("horoscope", phrases[:i])
    assert not engine.set_learned("horoscope", phrases)  # unchanged: nothing written
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["vectors"] != "vectors-0"  # saved whole at least once
    reopened = DiscoveryEngine.open(directory, embedder)
    assert reopened.learned() == {"horoscope": tuple(phrases)}
    assert reopened._vectors.head.active
    assert reopened.find(["what about virgo"]).names[0] == "horoscope"


def test_an_offline_rebuild_keeps_the_learned_examples(tmp_path: Path, embedder: Embedder) -> None:
    store = LearnedExamples(tmp_path / "chalie.db")
    store.add("what's the hour over in Lima", "clock", "chat")
    store.close()
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), "index", "rebuild"])
    assert result.exit_code == 0, result.output
    engine = DiscoveryEngine.open(tmp_path / "index" / "tools", embedder)
    assert engine.learned() == {"clock": ("what's the hour over in Lima",)}

"""find_tools and find_skills as real abilities over a real DiscoveryActor, and the CLI commands."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from click.testing import CliRunner

import actors.discovery as discovery_actor
from abilities.find_skills import FindSkills
from abilities.find_tools import FindTools
from actors.discovery import DiscoveryActor, DiscoveryHandle, index_dirs
from actors.process.supervisor import Supervisor
from chalie.ability import Ability
from chalie.calls.dispatch import Prevalidated, prevalidate
from chalie.calls.invoke import invoke
from chalie.calls.registry import Registry
from chalie.discovery.cascade import NOT_FOUND_HINT
from chalie.discovery.embedder import Embedder, load_embedder
from chalie.discovery.engine import MANIFEST
from chalie.discovery.types import ToolDoc
from chalie.process.supervision import ChildSpec
from chalie.result import ToolResult
from chalie.services import Services
from chalie.wire.messages import TurnContext
from chalie_app.cli import cli

# Starts processes, loads a model or builds indexes: deselect with -m "not slow".
pytestmark = pytest.mark.slow

CONTEXT = TurnContext(conversation_id="conv", turn_id="turn-1")


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder()


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.collect(entry_points=False)


@pytest.fixture
def actor(tmp_path: Path, registry: Registry, embedder: Embedder) -> Iterator[pykka.ActorRef[Any]]:
    ref = DiscoveryActor.start(registry=registry, home=tmp_path, embedder=embedder)
    yield ref
    if ref.is_alive():
        ref.stop()


def call(ability: type[Ability], services: Services, arguments: dict[str, Any]) -> ToolResult:
    """The dispatcher's own pre-validation, then the ability: what a model's call goes through."""
    checked = prevalidate(ability, arguments)
    if isinstance(checked, ToolResult):
        return checked
    assert isinstance(checked, Prevalidated)
    return invoke(ability(CONTEXT, services), checked.value)


def test_both_abilities_are_internal_always_available_and_not_in_the_roster(
    registry: Registry,
) -> None:
    for ability in (FindTools, FindSkills):
        assert ability.internal and not ability.discoverable
        assert registry.get(ability.name) is not None
        schema = ability.descriptor()["input_schema"]
        assert schema["properties"]["query"]["type"] == "array"


def test_each_meta_tool_describes_itself_in_its_own_words() -> None:
    tools_schema = FindTools.descriptor()["input_schema"]
    skills_schema = FindSkills.descriptor()["input_schema"]
    skills_text = json.dumps(skills_schema).lower()
    assert "activate" not in skills_text and "playbook" in skills_text
    assert "callable" in json.dumps(FindTools.descriptor()).lower()
    tools_query = tools_schema["properties"]["query"]["description"]
    assert skills_schema["properties"]["query"]["description"] != tools_query


def test_find_tools_injects_what_it_found_into_the_calling_turn(
    actor: pykka.ActorRef[Any], registry: Registry
) -> None:
    services = Services(discovery=DiscoveryHandle(actor))
    result = call(
        FindTools, services, {"query": ["calculator", "what time is it in Tokyo", "xq zzv wpt"]}
    )
    assert result.ok, result.body
    body = json.loads(result.body)
    names = [t["name"] for t in body["injected"]]
    # entry order: the exact name, then the time question's best hits (the clock first; other
    # built-ins under the distance ceiling, such as the calendar, may follow it)
    assert names[:2] == ["calculator", "clock"]
    assert len(names) == len(set(names)) and all(registry.get(n) is not None for n in names)
    assert all(set(t) == {"name", "summary"} for t in body["injected"])
    assert body["not_found"] == [
        {"query": "xq zzv wpt", "reason": "no-match", "hint": NOT_FOUND_HINT}
    ]
    # after a not-found the model is told it may answer without a tool, and what exists
    assert "No tool exists" in body["note"] and "answer the user from what you know" in body["note"]
    assert "Arithmetic and math expressions" in body["kinds"]
    assert result.meta == {"injected": len(names), "not_found": 1}
    assert services.turns.injected("turn-1") == set(names)
    assert services.turns.injected("another-turn") == frozenset()


def test_find_tools_sees_tools_added_at_run_time(
    actor: pykka.ActorRef[Any], registry: Registry
) -> None:
    handle = DiscoveryHandle(actor)
    handle.add(
        [
            ToolDoc(
                "_mcp_notes_append",
                "Appends a line to a note in the notes app.",
                ("add milk to my shopping note",),
                "Append to note",
                "mcp:notes",
            )
        ]
    )
    services = Services(discovery=handle)
    result = call(FindTools, services, {"query": ["append"]})
    assert json.loads(result.body)["injected"][0]["name"] == "_mcp_notes_append"
    handle.remove(["_mcp_notes_append"])
    result = call(FindTools, services, {"query": ["_mcp_notes_append"]})
    # (the built-in mcp_manager may match "mcp"; the removed proxy must not)
    assert "_mcp_notes_append" not in [t["name"] for t in json.loads(result.body)["injected"]]


def test_find_skills_returns_each_playbooks_full_text(
    actor: pykka.ActorRef[Any], registry: Registry
) -> None:
    services = Services(discovery=DiscoveryHandle(actor))
    result = call(FindSkills, services, {"query": ["recover_from_tool_errors"]})
    assert result.ok
    (skill,) = json.loads(result.body)["injected"]
    assert skill["name"] == "recover_from_tool_errors"
    assert "discovery-index-error" in skill["text"] and len(skill["text"]) > 1000
    assert services.turns.injected("turn-1") == frozenset()  # playbooks are not tools


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"query": []},
        {"query": "weather"},
        {"query": ["x"] * 21},
        {"query": ["x" * 201]},
        {"query": [17]},
        {"query": ["weather"], "k": 50},
    ],
)
def test_malformed_queries_bounce_before_the_index_is_touched(arguments: dict[str, Any]) -> None:
    class Untouchable:
        def find(self, *a: object, **k: object) -> object:
            raise AssertionError("the index was queried")

    result = call(FindTools, Services(discovery=Untouchable()), arguments)
    assert not result.ok and result.code in {"invalid-param", "missing-params"}


def test_a_blank_entry_is_an_invalid_param(actor: pykka.ActorRef[Any]) -> None:
    result = call(FindTools, Services(discovery=DiscoveryHandle(actor)), {"query": ["ok", "  \t "]})
    assert result.code == "invalid-param"
    assert result.meta["param"] == "query"


def test_an_index_that_cannot_be_read_or_rebuilt_is_a_loud_error(
    tmp_path: Path, registry: Registry, embedder: Embedder
) -> None:
    tools_dir, _ = index_dirs(tmp_path)
    tools_dir.parent.mkdir(parents=True)
    tools_dir.write_text("this should be a directory")  # unreadable and unbuildable
    ref = DiscoveryActor.start(registry=registry, home=tmp_path, embedder=embedder)
    try:
        services = Services(discovery=DiscoveryHandle(ref))
        for ability in (FindTools, FindSkills):
            result = call(ability, services, {"query": ["clock"]})
            assert result.code == "discovery-index-error", result.body
            assert result.hint
        assert services.turns.injected("turn-1") == frozenset()
    finally:
        ref.stop()


def test_a_stopped_discovery_actor_is_a_loud_error(
    actor: pykka.ActorRef[Any], registry: Registry
) -> None:
    services = Services(discovery=DiscoveryHandle(actor))
    actor.stop()
    assert call(FindTools, services, {"query": ["clock"]}).code == "discovery-index-error"


def test_no_discovery_service_is_a_loud_error() -> None:
    assert call(FindTools, Services(), {"query": ["clock"]}).code == "discovery-index-error"


def test_the_actor_reuses_the_persisted_index_on_restart(
    tmp_path: Path, registry: Registry, embedder: Embedder
) -> None:
    first = DiscoveryActor.start(registry=registry, home=tmp_path, embedder=embedder)
    assert DiscoveryHandle(first).status()["ready"]
    first.stop()
    tools_dir, _ = index_dirs(tmp_path)
    before = (tools_dir / MANIFEST).read_text()
    second = DiscoveryActor.start(registry=registry, home=tmp_path, embedder=embedder)
    try:
        assert DiscoveryHandle(second).find(["clock"]).names == ["clock"]
        assert (tools_dir / MANIFEST).read_text() == before
    finally:
        second.stop()


def test_cli_index_rebuild_and_tools_find(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"CHALIE_HOME": str(tmp_path)}
    # with no index yet, find works from memory and leaves the data directory alone
    early = runner.invoke(cli, ["tools", "find", "--json", "clock"], env=env)
    assert early.exit_code == 0, early.output
    assert json.loads(early.stdout)["injected"][0]["name"] == "clock"
    assert not (tmp_path / "index" / "tools" / MANIFEST).exists()

    rebuilt = runner.invoke(cli, ["index", "rebuild"], env=env)
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "indexed" in rebuilt.stdout and "skills" in rebuilt.stdout
    assert (tmp_path / "index" / "tools" / MANIFEST).is_file()

    found = runner.invoke(cli, ["tools", "find", "--json", "clock", "calc"], env=env)
    assert found.exit_code == 0, found.output
    body = json.loads(found.stdout)
    assert [t["name"] for t in body["injected"]] == ["clock", "calculator"]

    shown = runner.invoke(cli, ["tools", "find", "Clock"], env=env)
    assert shown.stdout.startswith("[find_tools(status=success, injected=1, not_found=0)]")

    bad = runner.invoke(cli, ["tools", "find", "x" * 300], env=env)
    assert bad.exit_code != 0


class TideTables(Ability):
    name = "tide_tables"
    summary = "Gives the times of high and low tide for a harbour on a given day."
    tooltip = "Tide times"
    examples = (
        "when is high tide in Brighton tomorrow",
        "low tide times this weekend",
        "tide table for the harbour",
        "is the tide coming in at noon",
        "when can I walk across to the island at low water",
        "tides in Saint-Malo on Saturday",
    )

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success("high tide 06:12")


def test_sync_follows_the_registry_as_abilities_come_and_go(
    tmp_path: Path, embedder: Embedder
) -> None:
    registry = Registry.collect(entry_points=False)
    ref = DiscoveryActor.start(registry=registry, home=tmp_path, embedder=embedder)
    try:
        handle = DiscoveryHandle(ref)
        assert handle.find(["tide_tables"]).names == []
        registry.add(TideTables, source="test")
        assert handle.sync() == {"added": 1, "removed": 0}
        assert handle.find(["tide_tables"]).names == ["tide_tables"]
        registry.remove("tide_tables")
        assert handle.sync() == {"added": 0, "removed": 1}
        assert handle.find(["tide_tables"]).names == []
    finally:
        ref.stop()


def test_a_supervised_discovery_actor_is_restarted_and_found_again(
    tmp_path: Path, registry: Registry, embedder: Embedder
) -> None:
    spec = ChildSpec(
        "discovery",
        lambda: DiscoveryActor.start(registry=registry, home=tmp_path, embedder=embedder),
    )
    sup = Supervisor.start([spec], backoff_base=0.01)
    try:
        child = sup.proxy().child_ref("discovery").get(timeout=5)
        services = Services(discovery=DiscoveryHandle(child, timeout=10))
        assert json.loads(call(FindTools, services, {"query": ["clock"]}).body)["injected"]
        first = child.current()
        first.stop()  # an unrequested stop: the supervisor restarts it
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            result = call(FindTools, services, {"query": ["clock"]})
            if result.ok:
                break
            assert result.code == "discovery-index-error"  # loud while it restarts
            time.sleep(0.05)
        assert result.ok and child.current() is not first
    finally:
        sup.stop()


def test_a_failed_load_is_retried_once_the_cause_is_gone(
    tmp_path: Path, registry: Registry, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools_dir, _ = index_dirs(tmp_path)
    tools_dir.parent.mkdir(parents=True)
    tools_dir.write_text("in the way")
    ref = DiscoveryActor.start(registry=registry, home=tmp_path, embedder=embedder)
    try:
        services = Services(discovery=DiscoveryHandle(ref))
        assert call(FindTools, services, {"query": ["clock"]}).code == "discovery-index-error"
        tools_dir.unlink()
        # within the retry interval the error stands; after it, the load is tried again
        assert call(FindTools, services, {"query": ["clock"]}).code == "discovery-index-error"
        monkeypatch.setattr(discovery_actor, "RETRY_AFTER", 0.0)
        result = call(FindTools, services, {"query": ["clock"]})
        assert result.ok and json.loads(result.body)["injected"][0]["name"] == "clock"
    finally:
        ref.stop()

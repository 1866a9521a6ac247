"""Memory in a running daemon: a scripted model's turns call it, the CLI reads the same book."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from actors.gate.policy import PolicyActor
from chalie.process import control
from chalie_app.cli import cli
from tests.core.conversation.harness import Harness
from tests.core.conversation.test_turns import tool_names, tool_results

pytestmark = pytest.mark.slow

SEED_ERROR = (
    "[memory(status=error, code=no-query-or-location, action=recall)]\n"
    "recall requires either a query or a location.\n"
    "hint: pass query= to search by topic, or location= to filter by place.\n"
    "[end:memory]"
)


@pytest.fixture(scope="module")
def h() -> Iterator[Harness]:
    harness = Harness()
    harness.rt.child("policy", PolicyActor).call(
        PolicyActor.set, "subconscious", "memory.store", "allow"
    )
    try:
        yield harness
    finally:
        harness.close()


def call(name: str, cid: str, **arguments: Any) -> dict[str, Any]:
    return {"id": cid, "name": name, "arguments": {**arguments, "act_summary": "memory"}}


def chalie(h: Harness, *args: str, input: str | None = None) -> Any:
    result = CliRunner().invoke(cli, ["--home", str(h.home), *args], input=input)
    return result


def test_a_turn_stores_and_recalls_and_gets_the_seed_error(h: Harness) -> None:
    h.script(
        {
            "steps": [
                {"tool_calls": [call("memory", "m1", action="recall")]},
                {
                    "tool_calls": [
                        call(
                            "memory",
                            "m2",
                            action="store",
                            text="My daughter's school is St Aloysius",
                            kind="fact",
                        )
                    ]
                },
                {"tool_calls": [call("memory", "m3", action="recall", query="which school")]},
                {"text": "Noted."},
            ]
        }
    )
    accepted = h.send("remember my daughter's school", "subconscious")
    end = h.finished(accepted, 60)
    assert end.reason == "final", end
    bodies = [r["body"] for r in h.server.requests]
    assert "memory" in tool_names("openai", bodies[0])  # pinned from the first request
    results = dict(tool_results("openai", bodies[-1]))
    assert results["m1"] == SEED_ERROR
    assert results["m2"].startswith("[memory(status=success, action=store, id=")
    recalled = results["m3"].splitlines()
    assert recalled[0] == "[memory(status=success, action=recall, count=1)]"
    found = json.loads(recalled[1])["memories"][0]
    assert found["text"] == "My daughter's school is St Aloysius"
    # the operator sees it, with its provenance, through the daemon
    reply = control.request(h.home, "memory.list", {"limit": 5}, timeout=10)
    assert reply.ok
    (row,) = [m for m in reply.data if m["text"] == "My daughter's school is St Aloysius"]
    assert row["conversation_id"] == accepted.conversation_id and row["principal"] == "owner"
    listed = chalie(h, "memory", "list")
    assert listed.exit_code == 0 and "St Aloysius" in listed.stdout
    searched = chalie(h, "memory", "search", "where does she study", "--json")
    assert json.loads(searched.stdout)[0]["id"] == row["id"]
    shown = chalie(h, "memory", "show", str(row["id"]))
    assert json.loads(shown.stdout)["source"] == "person"


def test_cli_export_import_and_forget_through_the_daemon(h: Harness) -> None:
    lines = "\n".join(
        [
            json.dumps(
                {
                    "text": "Prefers window seats on trains",
                    "kind": "preference",
                    "skill": "plan_a_trip",
                }
            ),
            "{broken",
            json.dumps({"text": ""}),
        ]
    )
    imported = chalie(h, "memory", "import", input=lines + "\n")
    assert imported.exit_code == 0, imported.output
    assert imported.stdout.strip() == "stored 1, merged 0, rejected 2"
    rules = chalie(h, "skills", "rules", "--json")
    (rule,) = json.loads(rules.stdout)
    assert rule == {
        "skill": "plan_a_trip",
        "rule": "Prefers window seats on trains",
        "id": rule["id"],
    }
    exported = chalie(h, "memory", "export")
    rows = [json.loads(x) for x in exported.stdout.splitlines()]
    assert "Prefers window seats on trains" in {r["text"] for r in rows}
    forgot = chalie(h, "memory", "forget", str(rule["id"]))
    assert forgot.exit_code == 0
    assert json.loads(chalie(h, "skills", "rules", "--json").stdout) == []
    missing = chalie(h, "memory", "forget", str(rule["id"]))
    assert missing.exit_code == 1 and "memory-not-found" in missing.stderr
    # restorable: listed apart, and back with its id (and as a rule again)
    gone = json.loads(chalie(h, "memory", "forgotten", "--json").stdout)
    assert [m["id"] for m in gone] == [rule["id"]] and gone[0]["forgotten"]
    restored = chalie(h, "memory", "restore", str(rule["id"]))
    assert restored.exit_code == 0, restored.output
    assert [r["id"] for r in json.loads(chalie(h, "skills", "rules", "--json").stdout)] == [
        rule["id"]
    ]
    assert json.loads(chalie(h, "memory", "forgotten", "--json").stdout) == []
    assert chalie(h, "memory", "forget", str(rule["id"])).exit_code == 0  # as the next test expects


def test_find_skills_returns_the_persons_rules_beside_the_playbook(h: Harness) -> None:
    book = h.rt.services.memory.book
    from chalie.memory.records import Draft, Provenance

    aisle, _ = book.store_memory(
        Draft(text="Books aisle seats", kind="preference", skill="plan_a_trip"),
        Provenance(principal="owner"),
    )
    book.store_memory(
        Draft(text="Never flies before 8 am", kind="instruction", skill="plan_a_trip"),
        Provenance(principal="owner"),
    )
    book.store_memory(
        Draft(text="An agent's own rule", skill="plan_a_trip"),
        Provenance(principal="agent:bot", source="agent"),
    )

    def ask() -> dict[str, Any]:
        h.script(
            {
                "steps": [
                    {"tool_calls": [call("find_skills", "s1", query=["plan_a_trip"])]},
                    {"text": "Here is the plan."},
                ]
            }
        )
        accepted = h.send("plan my trip to Rome", "subconscious")
        assert h.finished(accepted, 60).reason == "final"
        results = dict(tool_results("openai", h.server.requests[-1]["body"]))
        body: dict[str, Any] = json.loads(results["s1"].splitlines()[1])
        return body["injected"][0]

    first = ask()
    assert first["name"] == "plan_a_trip" and first["text"]
    assert sorted(first["rules"]) == ["Books aisle seats", "Never flies before 8 am"]
    book.forget(["owner"], aisle.id)  # forgetting the memory removes the rule
    assert ask()["rules"] == ["Never flies before 8 am"]

"""Learning from use, end to end: a real daemon and turn, the scripted model, the CLI's list."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.conversation.conversations import Conversations
from actors.gate.policy import PolicyActor
from chalie.discovery.types import ToolDoc
from chalie.wire.events import PermissionRequest
from chalie.wire.principals import LOCAL_OWNER
from tests.core.conversation.harness import Harness
from tools.waiting import wait_until

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow

ENTRY = "how late is it over in Osaka right now"


@pytest.fixture(scope="module")
def h() -> Iterator[Harness]:
    harness = Harness(extra_toml='[channels.agent]\npolicy_channel = "external_agent"\n')
    policy = harness.rt.child("policy", PolicyActor)
    policy.call(PolicyActor.set, "external_agent", "clock", "allow")
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture(autouse=True)
def no_examples(h: Harness) -> None:
    h.rt.services.discovery.clear_examples()


def find_then_clock(entry: str, zone: str = "Asia/Tokyo") -> dict[str, Any]:
    return {
        "steps": [
            {
                "tool_calls": [
                    {
                        "name": "find_tools",
                        "arguments": {"query": [entry], "act_summary": "finding"},
                    }
                ]
            },
            {
                "tool_calls": [
                    {"name": "clock", "arguments": {"zone": zone, "act_summary": "the time"}}
                ]
            },
            {"text": "done"},
        ]
    }


def run_turn(h: Harness, channel: str, answer: str | None = "allow_once") -> str:
    accepted = h.send(ENTRY, channel)
    if answer is not None:
        cid = accepted.conversation_id
        request = wait_until(lambda: h.of(cid, PermissionRequest), what="a permission request")
        h.conversations.call(
            Conversations.answer, request[0].request_id, answer, LOCAL_OWNER
        ).result(10)
    end = h.finished(accepted)
    assert end.reason == "final"
    return accepted.turn_id or ""


def cli_examples(home: Path) -> list[dict[str, Any]]:
    env = {**os.environ, "CHALIE_HOME": str(home)}
    out = subprocess.run(
        [sys.executable, "-m", "chalie", "discovery", "examples", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def learned(h: Harness) -> list[str]:
    # an ask of the actor: the store and the index change together inside one learn
    return [e.text for e in h.rt.services.discovery.examples("clock")]


def test_a_chat_turn_that_found_and_used_a_tool_teaches_its_entry(h: Harness) -> None:
    h.script(find_then_clock(ENTRY))
    run_turn(h, "chat")
    ended = time.monotonic()
    wait_until(lambda: ENTRY in learned(h), 1.0, "the entry to be learned")
    assert time.monotonic() - ended <= 1.0
    result = h.rt.services.discovery.find([ENTRY])
    assert "clock" in result.names
    rows = cli_examples(h.home)
    assert [(r["tool"], r["text"], r["channel"]) for r in rows] == [("clock", ENTRY, "chat")]
    # a turn nobody knows (ended twice, or forged) teaches nothing
    assert h.rt.services.discovery.learn_turn_soon("t_unknown", "chat", ["clock"]) == 0
    assert h.rt.services.discovery.learn_turn_soon("x" * 100_000, "chat", ["y"] * 10_000) == 0


def test_a_denied_call_teaches_nothing(h: Harness) -> None:
    h.script(find_then_clock(ENTRY))
    turn_id = run_turn(h, "chat", answer="deny")
    assert not h.rt.services.discovery.examples()
    assert turn_id not in h.rt.services.discovery._finds  # the record was dropped


def test_a_failed_call_teaches_nothing(h: Harness) -> None:
    h.script(find_then_clock(ENTRY, zone="Mars/Olympus_Mons"))
    turn_id = run_turn(h, "chat")
    assert not h.rt.services.discovery.examples()
    assert turn_id not in h.rt.services.discovery._finds


def test_a_call_sent_to_the_background_teaches_nothing_yet(h: Harness) -> None:
    from chalie.wire.events import BackgroundResult, TurnFinished, TurnStarted

    script = find_then_clock(ENTRY)
    script["steps"][1]["tool_calls"][0]["arguments"]["async"] = True
    script["on_user"] = {"text": "the time came"}  # the turn a late result may start
    h.script(script)
    accepted = h.send(ENTRY, "chat")
    cid = accepted.conversation_id
    request = wait_until(lambda: h.of(cid, PermissionRequest), what="a permission request")
    h.conversations.call(
        Conversations.answer, request[0].request_id, "allow_once", LOCAL_OWNER
    ).result(10)
    assert h.finished(accepted).reason == "final"
    assert not h.rt.services.discovery.examples()
    assert accepted.turn_id not in h.rt.services.discovery._finds
    # the result arrives later; if the turn had ended, it starts one of its own: let it end
    # here, not inside the next test's script
    wait_until(lambda: h.of(cid, BackgroundResult), what="the background result")
    wait_until(
        lambda: len(h.of(cid, TurnFinished)) == len(h.of(cid, TurnStarted)),
        what="every turn of the conversation to end",
    )


def test_an_external_agent_turn_teaches_nothing(h: Harness) -> None:
    h.script(find_then_clock(ENTRY))
    turn_id = run_turn(h, "agent", answer=None)
    assert not h.rt.services.discovery.examples()
    assert turn_id not in h.rt.services.discovery._finds


def test_a_cancelled_turn_drops_its_find_record(h: Harness) -> None:
    h.script(
        {
            "steps": [
                {
                    "tool_calls": [
                        {
                            "name": "find_tools",
                            "arguments": {"query": [ENTRY], "act_summary": "finding"},
                        }
                    ]
                },
                {
                    "tool_calls": [
                        {"name": "clock", "arguments": {"zone": "Asia/Tokyo", "act_summary": "t"}}
                    ]
                },
                {"hang": True},
            ]
        }
    )
    accepted = h.send(ENTRY, "chat")
    cid = accepted.conversation_id
    request = wait_until(lambda: h.of(cid, PermissionRequest), what="a permission request")
    h.conversations.call(
        Conversations.answer, request[0].request_id, "allow_once", LOCAL_OWNER
    ).result(10)
    wait_until(lambda: len(h.server.requests) >= 3, what="the third model request")
    assert h.conversations.call(Conversations.cancel, cid).result(10) is True
    assert h.finished(accepted).reason == "cancelled"
    wait_until(lambda: accepted.turn_id not in h.rt.services.discovery._finds, 1.0)
    assert not h.rt.services.discovery.examples()


def test_the_daemon_has_the_default_model_write_examples_for_a_tool_without_any(
    h: Harness,
) -> None:
    # a domain no built-in ability covers (the weather is one now)
    phrases = [
        "find a knitting pattern for a scarf",
        "how many stitches do I cast on for a beanie",
        "knitting pattern for baby socks",
        "how to cast on for a sweater",
    ]
    h.script({"steps": [{"text": json.dumps(phrases)}]})
    doc = ToolDoc("_mcp_acme_op_7", "Runs operation 7 on the Acme backend.", source="mcp:acme")
    discovery = h.rt.services.discovery
    discovery.add([doc])
    try:
        wait_until(lambda: len(discovery.examples(doc.name)) == len(phrases), 10)
        rows = cli_examples(h.home)
        assert {(r["tool"], r["channel"]) for r in rows} == {(doc.name, "model")}
        assert doc.name in discovery.find(["knitting pattern for a winter hat"]).names
        # the request went to [models.default], with no tools offered
        body = h.server.requests[0]["body"]
        assert doc.name in json.dumps(body["messages"]) and not body.get("tools")
    finally:
        discovery.remove([doc.name])
    assert discovery.examples(doc.name) == []


def answer_as_owner(h: Any, request_id: str, answer: str) -> Any:
    """The local owner's answer through the conversations (as the control socket gives it)."""
    return h.conversations.call(Conversations.answer, request_id, answer, LOCAL_OWNER).result(10)

"""Turns end to end: a real daemon, real dispatcher and abilities, the scripted model over HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pykka.messages import ProxyGetAttr

from actors.conversation.conversations import Conversations, new_id
from actors.conversation.turn import TurnActor, TurnDeps
from actors.gate.policy import PolicyActor
from chalie.conversation.requests import ConversationError
from chalie.wire.actor_messages import StartTurn
from chalie.wire.events import (
    ErrorEvent,
    PermissionRequest,
    PermissionSettled,
    TextDelta,
    ToolFinished,
    ToolStarted,
    TurnStarted,
)
from chalie.wire.messages import Accepted
from chalie.wire.principals import LOCAL_OWNER
from tests.core.conversation.harness import FORMATS, Harness, assert_valid_history
from tools.waiting import wait_until

# Starts a daemon, a model or MCP server, or builds an index: deselect with -m "not slow".
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def h() -> Iterator[Harness]:
    harness = Harness()
    harness.rt.child("policy", PolicyActor).call(PolicyActor.set, "subconscious", "clock", "allow")
    harness.rt.child("policy", PolicyActor).call(
        PolicyActor.set, "subconscious", "calculator", "allow"
    )
    try:
        yield harness
    finally:
        harness.close()


def calc(expression: str, call_id: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {
        "name": "calculator",
        "arguments": {"expression": expression, "act_summary": f"computing {expression}"},
    }
    if call_id:
        call["id"] = call_id
    return call


def tool_results(fmt: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """(call id or tool name, content) of the native tool-result messages in a request."""
    out: list[tuple[str, str]] = []
    for m in body["messages"]:
        if fmt == "openai" and m["role"] == "tool":
            out.append((m["tool_call_id"], m["content"]))
        elif fmt == "ollama" and m["role"] == "tool":
            out.append((m["tool_name"], m["content"]))
        elif fmt == "anthropic" and isinstance(m["content"], list):
            for b in m["content"]:
                if b.get("type") == "tool_result":
                    out.append((b["tool_use_id"], b["content"]))
    return out


def tool_names(fmt: str, body: dict[str, Any]) -> list[str]:
    tools = body.get("tools") or []
    if fmt == "anthropic":
        return [t["name"] for t in tools]
    return [t["function"]["name"] for t in tools]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_turn_finds_a_tool_asks_the_human_runs_it_and_answers(h: Harness, fmt: str) -> None:
    h.script(
        {
            "steps": [
                {
                    "tool_calls": [
                        {
                            "id": "c1",
                            "name": "find_tools",
                            "arguments": {"query": ["clock"], "act_summary": "finding"},
                        }
                    ]
                },
                {
                    "tool_calls": [
                        {
                            "id": "c2",
                            "name": "clock",
                            "arguments": {"zone": "Asia/Tokyo", "act_summary": "the time"},
                        }
                    ]
                },
                {"text": "It is evening in Tokyo.", "chunk": 5},
            ]
        }
    )
    accepted = h.send("what time is it in Tokyo", f"chat-{fmt}")
    assert not accepted.queued and not accepted.duplicate
    cid = accepted.conversation_id
    request = wait_until(lambda: h.of(cid, PermissionRequest), what="a permission request")[0]
    assert request.tool == "clock" and request.turn_id == accepted.turn_id
    assert (
        h.conversations.call(
            Conversations.answer, request.request_id, "allow_once", LOCAL_OWNER
        ).result(10)
        is True
    )
    end = h.finished(accepted)
    assert end.reason == "final" and end.text == "It is evening in Tokyo."
    stored = h.stored(cid)
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))  # numbered, gapless
    kinds = [type(e) for e in stored]
    assert kinds[0] is TurnStarted and PermissionSettled in kinds
    assert "".join(e.text for e in stored if isinstance(e, TextDelta)) == end.text
    started = [e for e in stored if isinstance(e, ToolStarted)]
    assert [(e.tool, e.act_summary) for e in started] == [
        ("find_tools", "finding"),
        ("clock", "the time"),
    ]
    finished = [e for e in stored if isinstance(e, ToolFinished)]
    assert [(e.tool, e.status) for e in finished] == [
        ("find_tools", "success"),
        ("clock", "success"),
    ]
    bodies = [r["body"] for r in h.server.requests]
    assert len(bodies) == 3
    # The first request offers the channel's pins; the clock joins after find_tools injected it.
    assert "clock" not in tool_names(fmt, bodies[0])
    assert {"find_tools", "find_skills"} <= set(tool_names(fmt, bodies[0]))
    assert "clock" in tool_names(fmt, bodies[2])
    # Each result went back as the provider's native tool-result message holding the envelope.
    results = tool_results(fmt, bodies[2])
    firsts = [content.splitlines()[0] for _, content in results]
    assert firsts[0] == "[find_tools(status=success, injected=1, not_found=0)]"
    assert firsts[1].startswith("[clock(status=success")
    if fmt != "ollama":
        assert [key for key, _ in results] == ["c1", "c2"]
    assert_valid_history(h.history(cid))


@pytest.mark.parametrize("fmt", FORMATS)
def test_parallel_tool_calls_are_dispatched_together_and_answered_in_order(
    h: Harness, fmt: str
) -> None:
    for whole in (False, True):
        h.script(
            {
                "steps": [
                    {"tool_calls": [calc("6*7", "p1"), calc("2**10", "p2"), calc("1/0", "p3")]},
                    {"text": "42, 1024, and no."},
                ]
            }
        )
        channel = f"bg-{fmt}-whole" if whole else f"bg-{fmt}"
        accepted = h.send("three sums", channel)
        assert h.finished(accepted).reason == "final"
        results = tool_results(fmt, h.server.requests[1]["body"])
        assert len(results) == 3
        assert '"result":"42"' in results[0][1]
        assert '"result":"1024"' in results[1][1]
        assert "status=error" in results[2][1]
        if fmt != "ollama":
            assert [k for k, _ in results] == ["p1", "p2", "p3"]
        assert_valid_history(h.history(accepted.conversation_id))


def test_the_step_guard_ends_a_turn_that_never_stops_calling_tools(h: Harness) -> None:
    h.script({"on_user": {"tool_calls": [calc("1+1")]}, "on_tool": {"tool_calls": [calc("1+1")]}})
    accepted = h.send("loop forever", "steps")
    end = h.finished(accepted)
    assert end.reason == "guard-steps" and "3 model steps" in end.text
    assert len(h.server.requests) == 3
    assert_valid_history(h.history(accepted.conversation_id))
    turn = h.conversations.call(Conversations.show, accepted.conversation_id)["turns"][0]
    assert turn.reason == "guard-steps" and turn.steps == 3


def test_the_repeat_guard_stops_the_same_call_the_third_time(h: Harness) -> None:
    h.script({"on_user": {"tool_calls": [calc("2+2")]}, "on_tool": {"tool_calls": [calc("2+2")]}})
    accepted = h.send("again and again", "repeat")
    end = h.finished(accepted)
    assert end.reason == "guard-repeat"
    assert len(h.server.requests) == 3
    assert_valid_history(h.history(accepted.conversation_id))


def test_the_wall_clock_guard_ends_a_slow_turn(h: Harness) -> None:
    h.script(
        {
            "on_user": {"tool_calls": [calc("3+3")], "delay": 0.3},
            "on_tool": {"tool_calls": [calc("3+4")], "delay": 0.3},
        }
    )
    accepted = h.send("slowly", "clocked")
    end = h.finished(accepted)
    assert end.reason == "guard-time"
    assert_valid_history(h.history(accepted.conversation_id))


def test_the_token_guard_ends_a_turn_past_its_budget(h: Harness) -> None:
    h.script(
        {
            "on_user": {"tool_calls": [calc("1")], "input_tokens": 20, "output_tokens": 5},
            "on_tool": {"tool_calls": [calc("2")], "input_tokens": 20, "output_tokens": 5},
        }
    )
    accepted = h.send("spend", "tokens")
    end = h.finished(accepted)
    assert end.reason == "guard-tokens"
    assert len(h.server.requests) == 2
    assert_valid_history(h.history(accepted.conversation_id))


@pytest.mark.parametrize("fmt", FORMATS)
def test_malformed_arguments_and_unknown_tools_are_errors_the_model_can_correct(
    h: Harness, fmt: str
) -> None:
    h.script(
        {
            "steps": [
                {
                    "tool_calls": [
                        {"id": "m1", "name": "calculator", "raw": '{"expression": '},
                        {"id": "m2", "name": "teleport", "arguments": {"act_summary": "x"}},
                    ]
                },
                {"tool_calls": [calc("5*5", "m3")]},
                {"text": "25"},
            ]
        }
    )
    accepted = h.send("try", f"bg-{fmt}")
    assert h.finished(accepted).reason == "final"
    results = tool_results(fmt, h.server.requests[1]["body"])
    assert "code=invalid-param" in results[0][1]
    assert "code=unknown-tool" in results[1][1]
    assert_valid_history(h.history(accepted.conversation_id))


@pytest.mark.parametrize("fmt", FORMATS)
def test_429_and_500_are_retried_visibly_and_retry_after_is_honoured(h: Harness, fmt: str) -> None:
    h.script(
        {
            "steps": [
                {"status": 429, "retry_after": "0.3"},
                {"status": 500},
                {"text": "made it"},
            ]
        }
    )
    accepted = h.send("hello", f"bg-{fmt}")
    end = h.finished(accepted)
    assert end.reason == "final" and end.text == "made it"
    arrived = h.server.app.received
    assert len(arrived) == 3
    assert arrived[1] - arrived[0] >= 0.3  # Retry-After, not the 0.01 s backoff
    retries = [e for e in h.of(accepted.conversation_id, ErrorEvent) if e.code == "model-retry"]
    assert len(retries) == 2 and "429" in retries[0].message


def test_a_dropped_stream_is_retried(h: Harness) -> None:
    h.script(
        {
            "steps": [
                {"text": "partial answer here", "chunk": 2, "drop_after": 3},
                {"text": "whole answer"},
            ]
        }
    )
    accepted = h.send("hello", "bg-openai")
    end = h.finished(accepted)
    assert end.reason == "final" and end.text == "whole answer"


def test_a_model_that_keeps_failing_ends_the_turn_with_a_model_error(h: Harness) -> None:
    h.script({"on_user": {"status": 503}})
    accepted = h.send("hello", "bg-anthropic")
    end = h.finished(accepted)
    assert end.reason == "model-error" and "503" in end.text
    assert len(h.server.requests) == 3  # one try and two retries


def test_a_hung_model_times_out_and_the_turn_ends(h: Harness) -> None:
    h.script({"on_user": {"hang": True}})
    accepted = h.send("hello", "hang")
    end = h.finished(accepted)
    assert end.reason == "model-error" and "did not answer" in end.text
    assert len(h.server.requests) == 2


def test_a_refused_connection_is_a_clean_model_error(h: Harness) -> None:
    h.script({"on_user": {"text": "never asked"}})
    accepted = h.send("hello", "refused")
    end = h.finished(accepted)
    assert end.reason == "model-error" and "connection failed" in end.text
    assert h.server.requests == []


def test_cancel_ends_the_running_turn_and_closes_its_calls(h: Harness) -> None:
    h.script({"on_user": {"hang": True}})
    accepted = h.send("hello", "bg-openai")
    cid = accepted.conversation_id
    wait_until(lambda: h.server.requests, what="the model request")
    assert h.conversations.call(Conversations.cancel, cid).result(10) is True
    assert h.finished(accepted).reason == "cancelled"
    assert h.conversations.call(Conversations.cancel, cid).result(10) is False


def test_a_second_message_is_queued_and_runs_after_the_first(h: Harness) -> None:
    h.script({"steps": [{"text": "first", "delay": 0.3}, {"text": "second"}]})
    first = h.send("one", "bg-openai")
    second = h.send("two", "bg-openai", conversation_id=first.conversation_id)
    assert second.queued and not first.queued
    assert h.finished(first).text == "first"
    assert h.finished(second).text == "second"
    body = h.server.requests[1]["body"]
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]


def test_a_message_sent_with_busy_cancel_cancels_the_running_turn(h: Harness) -> None:
    h.script({"steps": [{"hang": True}, {"text": "fresh"}]})
    first = h.send("one", "bg-openai")
    wait_until(lambda: h.server.requests, what="the first request")
    second = h.send("two", "bg-openai", conversation_id=first.conversation_id, busy="cancel")
    assert h.finished(first).reason == "cancelled"
    assert h.finished(second).text == "fresh"


def test_a_retried_send_with_the_same_client_id_starts_nothing(h: Harness) -> None:
    h.script({"on_user": {"text": "once"}})
    first = h.send("hi", "bg-openai", client_msg_id="retry-me")
    h.finished(first)
    again = h.send(
        "hi", "bg-openai", conversation_id=first.conversation_id, client_msg_id="retry-me"
    )
    assert again.duplicate and again.turn_id == first.turn_id
    assert len(h.server.requests) == 1


def test_the_queue_is_bounded(h: Harness) -> None:
    h.script({"steps": [{"hang": True}], "on_user": {"text": "later"}})
    first = h.send("one", "bg-openai")
    cid = first.conversation_id
    queued = [h.send(f"q{i}", "bg-openai", conversation_id=cid) for i in range(3)]
    assert [q.queued for q in queued] == [True, True, False]
    refused = h.finished(queued[2])
    assert refused.reason == "cancelled" and "Too many" in refused.text
    h.conversations.call(Conversations.cancel, cid).result(10)
    for q in queued[:2]:
        assert h.finished(q).text == "later"


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"text": ""}, "invalid-message"),
        ({"text": "   \n"}, "invalid-message"),
        ({"text": "x" * 100_001}, "invalid-message"),
        ({"text": "nul\x00byte"}, "invalid-message"),
        ({"channel": "no-such-channel"}, "unknown-channel"),
        ({"conversation_id": "../../etc/passwd"}, "invalid-message"),
        ({"conversation_id": "x" * 65}, "invalid-message"),
        ({"client_msg_id": "m" * 129}, "invalid-message"),
    ],
)
def test_bad_messages_are_refused_with_a_code_and_store_nothing(
    h: Harness, kwargs: dict[str, Any], code: str
) -> None:
    before = len(h.conversations.call(Conversations.list, 10_000))
    args = {"text": "hi", "channel": "bg-openai", **kwargs}
    with pytest.raises(ConversationError) as err:
        h.send(**args)
    assert err.value.code == code
    assert len(h.conversations.call(Conversations.list, 10_000)) == before


def test_a_conversation_keeps_its_channel(h: Harness) -> None:
    h.script({"on_user": {"text": "ok"}})
    first = h.send("hi", "bg-openai")
    h.finished(first)
    with pytest.raises(ConversationError) as err:
        h.send("hi", "bg-ollama", conversation_id=first.conversation_id)
    assert err.value.code == "invalid-message"


def test_bad_permission_answers_are_refused(h: Harness) -> None:
    with pytest.raises(ConversationError):
        h.conversations.call(Conversations.answer, "r1", "sure", LOCAL_OWNER).result(10)
    assert (
        h.conversations.call(Conversations.answer, "no-such-request", "deny", LOCAL_OWNER).result(
            10
        )
        is False
    )


def test_a_crashed_turn_actor_ends_its_turn_with_an_error_and_the_conversation_goes_on(
    h: Harness,
) -> None:
    h.script({"steps": [{"hang": True}], "on_user": {"text": "back again"}})
    first = h.send("one", "bg-openai")
    cid = first.conversation_id
    wait_until(lambda: h.server.requests, what="the model request")
    h.conversations.call(Conversations.crash, cid)
    end = h.finished(first)
    assert end.reason == "interrupted" and "fault inside Chalie" in end.text
    errors = [e for e in h.of(cid, ErrorEvent) if e.turn_id == first.turn_id]
    assert [e.code for e in errors] == ["internal-error"]
    assert "RuntimeError" in errors[0].message and "crash requested" not in errors[0].message
    second = h.send("two", "bg-openai", conversation_id=cid)
    assert h.finished(second).text == "back again"
    stored = h.stored(cid)
    assert [e.seq for e in stored] == list(range(1, len(stored) + 1))
    assert_valid_history(h.history(cid))


def test_the_supervisor_restarts_a_crashed_turn_actor_which_runs_the_queued_message(
    h: Harness,
) -> None:
    """A transient child: restarted after a failure, from storage, with no new message."""
    h.script({"steps": [{"hang": True}], "on_user": {"text": "the queued one ran"}})
    first = h.send("one", "bg-openai")
    cid = first.conversation_id
    wait_until(lambda: h.server.requests, what="the model request")
    queued = h.send("two", "bg-openai", conversation_id=cid)
    assert queued.queued
    before = h.conversations.call(Conversations.child, cid)
    h.conversations.call(Conversations.crash, cid)
    assert h.finished(first).reason == "interrupted"
    assert h.finished(queued).text == "the queued one ran"
    (child,) = [c for c in h.conversations.call(Conversations.status)["children"] if c["id"] == cid]
    assert child["restarts"] == 1 and "crash requested" in child["last_error"]
    assert h.conversations.call(Conversations.child, cid).actor_urn != before.actor_urn


def test_an_idle_conversation_stops_and_comes_back_from_storage(h: Harness) -> None:
    h.script({"steps": [{"text": "first answer"}, {"text": "second answer"}]})
    first = h.send("remember the word apricot", "bg-ollama")
    cid = first.conversation_id
    h.finished(first)
    wait_until(
        lambda: not h.conversations.call(Conversations.show, cid)["live"],
        timeout=10,
        what="the idle actor to stop",
    )
    # A normal exit of a transient child: not restarted, and forgotten by its supervisor.
    assert not h.conversations.call(Conversations.has_child, cid)
    second = h.send("which word?", "bg-ollama", conversation_id=cid)
    assert h.finished(second).text == "second answer"
    contents = [m["content"] for m in h.server.requests[1]["body"]["messages"]]
    assert contents == [contents[0], "remember the word apricot", "first answer", "which word?"]
    assert [e.seq for e in h.stored(cid)] == list(range(1, len(h.stored(cid)) + 1))


def test_an_over_long_history_is_trimmed_and_the_trim_is_recorded(h: Harness) -> None:
    h.script({"on_user": {"tool_calls": [calc("7*6")]}, "on_tool": {"text": "x" * 600}})
    first = h.send("first " * 50, "tiny")
    cid = first.conversation_id
    h.finished(first)
    second = h.send("second", "tiny", conversation_id=cid)
    h.finished(second)
    body = h.server.requests[-1]["body"]
    texts = json.dumps(body["messages"])
    assert "second" in texts and "first first" not in texts
    turns = h.conversations.call(Conversations.show, cid)["turns"]
    assert any("context:" in note for note in turns[-1].notes)


def test_events_pages_and_bounds(h: Harness) -> None:
    h.script({"on_user": {"text": "abc", "chunk": 1}})
    accepted = h.send("hi", "bg-openai")
    h.finished(accepted)
    cid = accepted.conversation_id
    h.finished(h.send("again", "bg-openai", conversation_id=cid))  # two turns: 6+ events
    everything = h.stored(cid)
    assert len(everything) >= 6
    page = h.conversations.call(Conversations.events, cid, 2, 2)
    assert [e.seq for e in page] == [3, 4]
    assert h.conversations.call(Conversations.events, cid, 10_000, 5) == []
    assert len(h.conversations.call(Conversations.events, cid, -5, 10**9)) == len(everything)
    with pytest.raises(ConversationError):
        h.conversations.call(Conversations.events, "bad id!", 0, 10)


def test_a_background_result_is_delivered_into_the_conversation_and_acknowledged(
    h: Harness,
) -> None:
    from chalie.calls.outbox import Outbox
    from chalie.wire.events import BackgroundResult

    h.script(
        {
            "steps": [
                {
                    "tool_calls": [
                        {
                            "id": "a1",
                            "name": "clock",
                            "arguments": {
                                "zone": "UTC",
                                "async": True,
                                "act_summary": "reading the clock later",
                            },
                        }
                    ]
                },
                {"text": "started it"},
            ],
            # The result joins the first turn if it is still running, or starts a turn of
            # its own once the conversation is idle: either way the next answers are these.
            "on_user": {"text": "seen it"},
            "on_tool": {"text": "seen it"},
        }
    )
    first = h.send("time, in the background", "async")
    cid = first.conversation_id
    assert h.finished(first).text == "started it"
    delivered = wait_until(lambda: h.of(cid, BackgroundResult), what="the background result")
    assert delivered[0].tool == "clock" and delivered[0].status == "success"
    wait_until(
        lambda: any(m.role == "background" for m in h.history(cid)),
        what="the result in the history",
    )
    outbox = Outbox(h.rt.db_path)
    try:
        assert outbox.pending(cid) == []  # acknowledged once stored
    finally:
        outbox.close()
    second = h.send("and?", "async", conversation_id=cid)
    assert h.finished(second).text == "seen it"
    texts = json.dumps(h.server.requests[-1]["body"]["messages"])
    assert "background result of clock" in texts
    assert_valid_history(h.history(cid))


def test_a_flood_of_tool_calls_in_one_response_is_capped(h: Harness) -> None:
    h.script(
        {"steps": [{"tool_calls": [calc(f"{i}+1", f"f{i}") for i in range(40)]}, {"text": "done"}]}
    )
    accepted = h.send("flood", "bg-openai")
    assert h.finished(accepted).reason == "final"
    results = tool_results("openai", h.server.requests[1]["body"])
    assert len(results) == 40
    assert all("status=success" in r for _, r in results[:32])
    assert all("code=overloaded" in r for _, r in results[32:])
    assert_valid_history(h.history(accepted.conversation_id))


def test_a_permission_answered_elsewhere_is_settled_in_the_conversation(h: Harness) -> None:
    h.script(
        {
            "steps": [
                {
                    "tool_calls": [
                        {
                            "id": "e1",
                            "name": "calculator",
                            "arguments": {"expression": "1+2", "act_summary": "add"},
                        }
                    ]
                },
                {"text": "3"},
            ]
        }
    )
    h.rt.child("policy", PolicyActor).call(PolicyActor.reset, "chat", "calculator")
    accepted = h.send("add", "chat-openai")
    cid = accepted.conversation_id
    # The chat channel pins find_tools only: the model calls an uninjected tool first.
    end = h.finished(accepted)
    assert end.reason == "final"
    # The turn's scope is the pins plus what find_tools injected: nothing else runs.
    assert "code=unknown-tool" in tool_results("openai", h.server.requests[1]["body"])[0][1]
    h.script(
        {
            "steps": [
                {
                    "tool_calls": [
                        {
                            "id": "e2",
                            "name": "find_tools",
                            "arguments": {"query": ["calculator"], "act_summary": "find"},
                        }
                    ]
                },
                {
                    "tool_calls": [
                        {
                            "id": "e3",
                            "name": "calculator",
                            "arguments": {"expression": "1+2", "act_summary": "add"},
                        }
                    ]
                },
                {"text": "3"},
            ]
        }
    )
    second = h.send("add again", "chat-openai", conversation_id=cid)
    request = wait_until(
        lambda: [e for e in h.of(cid, PermissionRequest) if e.turn_id == second.turn_id],
        what="the request",
    )[0]
    # Answered from another terminal (chalie policy answer), not through the conversations.
    assert h.rt.child("policy", PolicyActor).call(
        PolicyActor.answer, request.request_id, "allow_once", LOCAL_OWNER
    )
    assert h.finished(second).reason == "final"
    # The PolicyActor owns the request: its settlement is the answer given, wherever given.
    settled = [e for e in h.of(cid, PermissionSettled) if e.request_id == request.request_id]
    assert [e.answer for e in settled] == ["allow_once"]


def test_a_start_that_comes_after_its_stored_turn_ran_runs_nothing(h: Harness) -> None:
    """The parent starts an actor, then sends the turn's StartTurn; the actor, loading the
    turn from storage, may have run it already (a fast model, a slow parent thread)."""
    h.script({"on_user": {"text": "you said: {last_user}"}})
    # the daemon's own TurnDeps, read on the Conversations actor's thread
    deps = h.conversations.ask(ProxyGetAttr(attr_path=("_deps",)), timeout=10)
    assert isinstance(deps, TurnDeps)
    cid = new_id("c")
    deps.storage.store.create(cid, "bg-openai")
    deps.storage.store.queue_turn(cid, "t_stored", "m_stored", "stored message")
    ref = TurnActor.start(cid, deps)  # not the parent's: nothing else runs this conversation
    try:
        ran = Accepted(conversation_id=cid, turn_id="t_stored", queued=False, duplicate=False)
        assert h.finished(ran).text == "you said: stored message"
        late = StartTurn("t_stored", "m_stored", "stored message")
        assert ref.ask(late, timeout=10) is False
        # the ask answers after any start it causes: nothing was appended, nothing asked
        assert [m.text for m in h.history(cid) if m.role == "user"] == ["stored message"]
        asked = [
            r for r in h.server.requests if r["body"]["messages"][-1]["content"] == "stored message"
        ]
        assert len(asked) == 1
    finally:
        ref.stop()


def test_a_stored_turn_keeps_the_asks_its_parent_took_it_with(h: Harness) -> None:
    """A message taken while another daemon held its conversation waits in the store; the
    TurnActor that runs it from there is told who answers its asks (the sender's
    human_present / park_asks), which the store does not keep."""
    h.script({"on_user": {"hang": True}})
    deps = h.conversations.ask(ProxyGetAttr(attr_path=("_deps",)), timeout=10)
    assert isinstance(deps, TurnDeps)
    running = []
    for n, asks in enumerate(({"t_x0": (True, True)}, None)):
        cid = new_id("c")
        deps.storage.store.create(cid, "bg-openai")
        deps.storage.store.queue_turn(cid, f"t_x{n}", f"m_x{n}", f"stored {n}")
        ref = TurnActor.start(cid, deps, asks=asks)
        try:
            wait_until(
                lambda n=n: any(
                    r["body"]["messages"][-1]["content"] == f"stored {n}" for r in h.server.requests
                ),
                what="the stored turn running",
            )
            state = ref.ask(ProxyGetAttr(attr_path=("_state",)), timeout=10)
            running.append((state.turn.turn_id, state.turn.human_present, state.turn.park_asks))
        finally:
            ref.stop()
    assert running == [("t_x0", True, True), ("t_x1", False, False)]


def test_a_fast_stream_reaches_followers_as_a_few_joined_deltas_in_order(h: Harness) -> None:
    text = "one two three four five six seven eight nine ten " * 4
    h.script({"on_user": {"text": text, "chunk": 1}})  # a delta per character
    accepted = h.send("count for me", "bg-openai")
    end = h.finished(accepted)
    assert end.reason == "final" and end.text == text
    stored = h.stored(accepted.conversation_id)
    deltas = [e for e in stored if isinstance(e, TextDelta) and e.turn_id == accepted.turn_id]
    assert "".join(e.text for e in deltas) == text
    assert 1 <= len(deltas) < len(text) // 4  # joined, not one event per character
    # every delta is stored (and was published) before the turn's end
    finished_seq = max(e.seq for e in stored if e.turn_id == accepted.turn_id)
    assert all(e.seq < finished_seq for e in deltas)


def test_a_conversation_keeps_its_channel_until_it_is_deleted(h: Harness) -> None:
    h.script({"on_user": {"text": "you said: {last_user}"}})
    first = h.send("on openai", "bg-openai")
    h.finished(first)
    cid = first.conversation_id
    with pytest.raises(ConversationError) as refused:
        h.send("elsewhere", "bg-ollama", conversation_id=cid)
    assert refused.value.code == "invalid-message" and "bg-openai" in str(refused.value)
    assert h.conversations.call(Conversations.delete, cid).result(10) is True
    assert h.conversations.call(Conversations.show, cid) is None
    # the id is free again: a new conversation on the other channel, without the old history
    again = h.send("a fresh start", "bg-ollama", conversation_id=cid)
    assert h.finished(again).text == "you said: a fresh start"
    shown = h.conversations.call(Conversations.show, cid)
    assert shown["info"].channel == "bg-ollama"
    assert [m.text for m in shown["messages"] if m.role == "user"] == ["a fresh start"]


def answer_as_owner(h: Any, request_id: str, answer: str) -> Any:
    """The local owner's answer through the conversations (as the control socket gives it)."""
    return h.conversations.call(Conversations.answer, request_id, answer, LOCAL_OWNER).result(10)


def test_a_conversation_belongs_to_its_principal_and_nobody_else_sends_into_it(
    h: Harness,
) -> None:
    from chalie.conversation.requests import SendMessage
    from chalie.wire.principals import Principal

    h.script({"on_user": {"text": "ok"}})
    agent = Principal(scope="agent", id="tok_a1", name="a1")
    other = Principal(scope="agent", id="tok_b2", name="b2")

    def send(cid: str | None, who: Principal | None) -> Accepted:
        msg = SendMessage(
            conversation_id=cid,
            channel="subconscious",
            text="hello",
            client_msg_id=new_id("m"),
            principal=who,
        )
        accepted: Accepted = h.conversations.call(Conversations.submit, msg).result(10)
        return accepted

    owners = h.send("mine", "subconscious")
    h.finished(owners)
    theirs = send(None, agent)
    h.finished(theirs)
    # An agent reaches neither the owner's conversation nor another agent's; the same
    # answer as for one that does not exist.
    for cid, who in ((owners.conversation_id, agent), (theirs.conversation_id, other)):
        with pytest.raises(ConversationError) as refused:
            send(cid, who)
        assert refused.value.code == "unknown-conversation"
    # Its own, yes; and the owner sees every conversation.
    h.finished(send(theirs.conversation_id, agent))
    h.finished(send(theirs.conversation_id, None))

"""The dispatcher client: a call in, an outcome out, never an exception.

The turns (actors/conversation/turn.py through TurnDeps) and the MCP server's gateway
(actors/mcp_server.DispatcherTools) both call through it; a live dispatcher is
exercised by every turn test (tests/core/conversation/test_turns.py).
"""

from __future__ import annotations

import asyncio

from actors.calls.dispatcher import DispatcherActor, DispatcherClient
from actors.child_ref import ChildRef
from chalie.calls.envelope import parse
from chalie.wire.messages import ToolCall, TurnContext


def _restarting() -> DispatcherClient:
    # What the directory answers while the child restarts: no ref.
    return DispatcherClient(ChildRef(lambda: None, "dispatcher", DispatcherActor))


def _call() -> ToolCall:
    return ToolCall(
        call_id="k1",
        tool="calculator",
        arguments={"expression": "1+2"},
        context=TurnContext(conversation_id="c1", turn_id="t1"),
    )


def test_a_restarting_dispatcher_answers_the_call_with_an_error_outcome() -> None:
    future = _restarting().submit(_call())
    assert future.done()
    outcome = future.result()
    assert (outcome.call_id, outcome.tool, outcome.status) == ("k1", "calculator", "error")
    assert outcome.code == "internal-error"
    (envelope,) = parse(outcome.envelope)
    assert envelope.tool == "calculator"
    assert envelope.attrs == {"status": "error", "code": "internal-error"}
    assert "'dispatcher' restarted" in envelope.content


def test_the_awaited_call_gives_the_same_outcome() -> None:
    outcome = asyncio.run(_restarting().call(_call()))
    assert outcome.status == "error" and outcome.code == "internal-error"


def test_cancelling_a_turn_with_no_dispatcher_is_a_no_op() -> None:
    _restarting().cancel_turn("t1")  # nothing to cancel: no exception

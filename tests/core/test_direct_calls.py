"""DirectCalls: a call's permission requests and outcome reach the client that started it, once."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from chalie.calls.direct_calls import DirectCalls, UnknownCall
from chalie.wire.bus import EventBus
from chalie.wire.events import PermissionRequest
from chalie.wire.messages import ToolCall, ToolOutcome


def outcome_for(call: ToolCall) -> ToolOutcome:
    return ToolOutcome(
        call_id=call.call_id,
        tool=call.tool,
        status="success",
        envelope=f"[{call.tool}(status=success)]\n{{}}\n[end:{call.tool}]",
    )


class FakeDispatcher:
    """Keeps each call's future, so a test decides when and how it ends."""

    def __init__(self) -> None:
        self.calls: list[tuple[ToolCall, concurrent.futures.Future[ToolOutcome]]] = []

    def __call__(self, call: ToolCall) -> concurrent.futures.Future[ToolOutcome]:
        future: concurrent.futures.Future[ToolOutcome] = concurrent.futures.Future()
        self.calls.append((call, future))
        return future


def request(conversation_id: str, request_id: str = "r1") -> PermissionRequest:
    return PermissionRequest(
        request_id=request_id,
        conversation_id=conversation_id,
        channel="chat",
        permission="echo",
        tool="echo",
        expires_at=time.time() + 60,
    )


def test_requests_and_the_outcome_reach_the_poller_and_the_call_is_then_forgotten() -> None:
    bus, dispatch = EventBus(), FakeDispatcher()
    desk = DirectCalls(bus, dispatch, prefix="t")
    started = desk.start("echo", {"act_summary": "x"}, "conv-1")
    call, future = dispatch.calls[0]
    assert started.call_id.startswith("t-") and started.conversation_id == "conv-1"
    assert call.context.channel == "chat" and call.context.human_present
    assert bus.subscribers("conv-1") == 1
    bus.publish("conv-1", request("conv-1"))
    news = desk.poll(started.call_id, wait=5)
    assert [r.request_id for r in news.permission_requests] == ["r1"] and not news.done
    future.set_result(outcome_for(call))
    news = desk.poll(started.call_id, wait=5)
    assert news.done and news.outcome is not None and news.outcome.status == "success"
    assert bus.subscribers("conv-1") == 0 and desk.in_progress() == 0
    with pytest.raises(UnknownCall):
        desk.poll(started.call_id, wait=0)


def test_a_long_poll_returns_as_soon_as_the_outcome_exists() -> None:
    bus, dispatch = EventBus(), FakeDispatcher()
    desk = DirectCalls(bus, dispatch)
    started = desk.start("echo", {})
    call, future = dispatch.calls[0]
    threading.Timer(0.05, lambda: future.set_result(outcome_for(call))).start()
    began = time.monotonic()
    assert desk.poll(started.call_id, wait=10).done
    assert time.monotonic() - began < 5


def test_a_failing_dispatch_keeps_nothing_and_leaves_no_subscription() -> None:
    bus = EventBus()

    def broken(_call: ToolCall) -> concurrent.futures.Future[ToolOutcome]:
        raise RuntimeError("dispatcher restarting")

    desk = DirectCalls(bus, broken)
    with pytest.raises(RuntimeError):
        desk.start("echo", {}, "conv-2")
    assert bus.subscribers("conv-2") == 0 and desk.in_progress() == 0


def test_close_wakes_a_long_poll_and_unpolled_calls_are_forgotten() -> None:
    bus, dispatch = EventBus(), FakeDispatcher()
    desk = DirectCalls(bus, dispatch, forget_after=0.0)
    first = desk.start("echo", {}, "conv-3")
    desk.start("echo", {}, "conv-4")  # the first, never polled, is dropped now
    with pytest.raises(UnknownCall):
        desk.poll(first.call_id, wait=0)
    assert bus.subscribers("conv-3") == 0
    desk = DirectCalls(bus, dispatch)
    started = desk.start("echo", {}, "conv-5")
    threading.Timer(0.05, desk.close).start()
    began = time.monotonic()
    news = desk.poll(started.call_id, wait=10)
    assert not news.done and time.monotonic() - began < 5
    assert bus.subscribers("conv-5") == 0


def test_the_runtime_failing_a_call_is_raised_once_to_the_poller() -> None:
    bus, dispatch = EventBus(), FakeDispatcher()
    desk = DirectCalls(bus, dispatch)
    started = desk.start("echo", {})
    dispatch.calls[0][1].set_exception(RuntimeError("lost"))
    with pytest.raises(RuntimeError, match="lost"):
        desk.poll(started.call_id, wait=1)
    with pytest.raises(UnknownCall):
        desk.poll(started.call_id, wait=0)

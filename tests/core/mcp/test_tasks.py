"""Task-augmented calls (execution.taskSupport required or optional) through the real
dispatcher, gate and connection actors, against tools/fixture_mcp/tasks.py: polled to the end,
a lifetime beyond the call timeout, cancellation reaching the server, and an async call."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from chalie.mcp.spec import ServerSpec
from chalie.process.config import McpConfig
from chalie.wire.messages import TurnContext
from tools.fixture_mcp.rig import FAST, ROOT, Rig
from tools.waiting import wait_until

pytestmark = pytest.mark.slow


def tasks_spec(name: str = "job", **kw: Any) -> ServerSpec:
    return ServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=("-m", "tools.fixture_mcp.tasks", "--poll", "100"),
        cwd=str(ROOT),
        protocol="legacy",
        **kw,
    )


def seen(rig: Rig) -> dict[str, str]:
    out = rig.run("_mcp_job_seen")
    body = out.envelope.splitlines()[1]
    found: dict[str, str] = json.loads(body)
    return found


@pytest.fixture
def task_rig(tmp_path: Any) -> Any:
    fields = {f: getattr(FAST, f) for f in FAST.__struct_fields__}
    rig = Rig(tmp_path, config=McpConfig(**{**fields, "task_timeout": 120.0}))
    try:
        yield rig
    finally:
        rig.close()


def test_a_task_outlives_the_call_timeout_and_its_result_arrives(task_rig: Rig) -> None:
    rig = task_rig
    rig.add(tasks_spec(call_timeout=1.0))  # a call may take 1 s; a task up to 120 s
    rig.start()
    rig.wait_tools("job", 3, 40)
    rig.allow("_mcp_job_*")
    entry = rig.registry.get("_mcp_job_render")
    assert entry is not None
    wait_until(lambda: rig.registry.get("_mcp_job_render").cls.timeout == 120.0, 20, "lifetime")
    assert rig.registry.get("_mcp_job_seen").cls.timeout == 1.0
    out = rig.run("_mcp_job_render", {"seconds": 3, "text": "film"})
    assert out.status == "success", out.envelope
    assert "rendered film after 3 s" in out.envelope
    # optional task support: also run as a task
    assert "quick hi" in rig.run("_mcp_job_quick", {"text": "hi"}).envelope
    statuses = seen(rig)
    assert sorted(statuses.values()) == ["completed", "completed"]


def test_cancelling_a_task_cancels_it_at_the_server(task_rig: Rig) -> None:
    rig = task_rig
    rig.add(tasks_spec())
    rig.start()
    rig.wait_tools("job", 3, 40)
    rig.allow("_mcp_job_*")
    wait_until(lambda: rig.registry.get("_mcp_job_render").cls.timeout == 120.0, 20, "lifetime")
    fut = rig.call("_mcp_job_render", {"seconds": 60, "text": "long"}, call_id="long")
    wait_until(lambda: "working" in seen(rig).values(), 20, "the task is working")
    assert rig.dispatcher is not None
    rig.dispatcher.proxy().cancel_turn("t1").get(timeout=10)
    done = fut.result(20)
    assert done.status == "error"
    wait_until(lambda: list(seen(rig).values()) == ["cancelled"], 20, "cancelled at the server")


def test_a_task_can_be_an_async_call(task_rig: Rig) -> None:
    rig = task_rig
    rig.add(tasks_spec())
    rig.start()
    rig.wait_tools("job", 3, 40)
    rig.allow("_mcp_job_*")
    wait_until(lambda: rig.registry.get("_mcp_job_render").cls.timeout == 120.0, 20, "lifetime")
    arrived: list[Any] = []
    sub = rig.bus.subscribe("conv", arrived.append)
    ctx = TurnContext(
        conversation_id="conv",
        turn_id="t-async",
        channel="chat",
        scope="unrestricted",
        allow_async=True,
    )
    first = rig.run("_mcp_job_render", {"seconds": 1, "text": "bg", "async": True}, context=ctx)
    assert first.background, first.envelope
    wait_until(
        lambda: any("rendered bg after 1 s" in str(e) for e in arrived), 30, "the async result"
    )
    sub.close()

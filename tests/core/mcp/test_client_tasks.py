"""Client-side tasks: a server's sampling and elicitation sent as tasks (MCP 2025-11-25), as
server-everything's two ``-async`` tools send them, run through the real connection, gate,
owner and (scripted) model; the server polls ``tasks/get`` and fetches ``tasks/result``.

The server (tools/fixture_mcp/asks_async.py) lists each ``-async`` tool only when our
``initialize`` declares ``tasks.requests.sampling.createMessage`` and
``tasks.requests.elicitation.create``, as server-everything does.
"""

from __future__ import annotations

import json
import sys

import pytest

from chalie.calls.envelope import unescape_content
from chalie.mcp.spec import ServerSpec
from chalie.wire.events import PermissionRequest
from chalie.wire.principals import LOCAL_OWNER
from tests.core.mcp.test_client_capabilities import model, turn, with_asks
from tools.fake_llm import FakeModelServer
from tools.fixture_mcp.rig import ROOT, Rig
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

__all__ = ["model"]  # the scripted model fixture, answering "Valletta"

SAMPLE = "_mcp_aa_trigger_sampling_request_async"
ELICIT = "_mcp_aa_trigger_elicitation_request_async"


def _server() -> ServerSpec:
    return ServerSpec(
        name="aa",
        transport="stdio",
        command=sys.executable,
        args=("-m", "tools.fixture_mcp.asks_async", "--poll", "50"),
        cwd=str(ROOT),
        protocol="legacy",  # tasks are a 2025-11-25 (handshake) feature
    )


def _asked(rig: Rig) -> list[PermissionRequest]:
    seen: list[PermissionRequest] = []
    rig.bus.subscribe(
        "conv", lambda e: seen.append(e) if isinstance(e, PermissionRequest) else None
    )
    return seen


def test_the_async_sampling_and_elicitation_tools_run_as_client_side_tasks(
    rig: Rig, model: FakeModelServer
) -> None:
    with_asks(rig, model)
    rig.add(_server())
    rig.start()
    # both -async tools are listed: our capabilities say we run these requests as tasks
    rig.wait_tools("aa", 3, 40)
    names = {e.name for e in rig.registry if e.name.startswith("_mcp_aa_")}
    assert {SAMPLE, ELICIT} <= names
    rig.allow("_mcp_aa_*")
    asked = _asked(rig)

    # sampling: the owner is asked (as for a plain request), the model answers, the server
    # polled the task while it waited and fetched its result
    fut = rig.call(SAMPLE, {"prompt": "capital of Malta?"}, context=turn())
    wait_until(lambda: bool(asked), 20, "the sampling request reaches the owner")
    assert asked[0].permission == "_mcp_aa.sampling"
    rig.policy.proxy().answer(asked[0].request_id, "allow_once", LOCAL_OWNER).get(timeout=5)
    done = fut.result(30)
    assert done.status == "success", done.envelope
    text = _text(done.envelope)
    assert text.startswith("[COMPLETED] created ") and ": working" in text
    assert "\npoll 1: " in text  # the server polled tasks/get
    result = json.loads(text.split("result: ", 1)[1])
    assert result["content"]["text"] == "Valletta" and result["role"] == "assistant"
    task_id = text.split("created ", 1)[1].split(":", 1)[0]
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    assert "capital of Malta?" in json.dumps(model.requests[-1])

    # elicitation: the form reaches the owner, whose answer is the task's result
    asked.clear()
    fut = rig.call(ELICIT, context=turn(), call_id="c2")
    wait_until(lambda: bool(asked), 20, "the form reaches the owner")
    assert asked[0].permission == "_mcp_aa.elicitation" and asked[0].form is not None
    ok = rig.policy.proxy().answer(asked[0].request_id, "allow_once", LOCAL_OWNER, {"name": "Ann"})
    assert ok.get(timeout=5) is True
    done = fut.result(30)
    text = _text(done.envelope)
    assert text.startswith("[COMPLETED]"), text
    result = json.loads(text.split("result: ", 1)[1])
    assert result["action"] == "accept" and result["content"] == {"name": "Ann"}

    # the client keeps both tasks for the server, ended
    listed = json.loads(_text(rig.run("_mcp_aa_tasks_seen", call_id="c3").envelope))
    assert sorted(t["status"] for t in listed["tasks"]) == ["completed", "completed"]


def test_a_task_the_owner_refuses_fails_and_the_server_hears_it(
    rig: Rig, model: FakeModelServer
) -> None:
    with_asks(rig, model)
    rig.add(_server())
    rig.start()
    rig.wait_tools("aa", 3, 40)
    rig.allow("_mcp_aa_*")
    asked = _asked(rig)
    fut = rig.call(SAMPLE, {"prompt": "anything"}, context=turn())
    wait_until(lambda: bool(asked), 20, "the sampling request reaches the owner")
    rig.policy.proxy().answer(asked[0].request_id, "deny", LOCAL_OWNER).get(timeout=5)
    text = _text(fut.result(30).envelope)
    assert text.startswith("[FAILED]"), text
    assert model.requests == []


def _text(envelope: str) -> str:
    """The remote tool's text inside Chalie's envelope (chalie.calls.envelope)."""
    lines = envelope.splitlines()
    assert lines[0].startswith("[") and lines[-1].startswith("[end:"), envelope
    return unescape_content("\n".join(lines[1:-1]))

"""A server that asks back (roots, sampling, elicitation, progress, logs), through the real
dispatcher, policy gate and connection actors; the model is the scripted one on loopback."""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.child_ref import ChildRef
from actors.mcp.asks import ServerAsks
from chalie.gate.policy import PolicyError
from chalie.mcp.spec import ServerSpec
from chalie.process.config import McpConfig, ModelConfig
from chalie.store.store_place import Place
from chalie.wire.events import PermissionRequest, ToolProgress
from chalie.wire.messages import TurnContext
from chalie.wire.principals import LOCAL_OWNER, Principal
from tools.fake_llm import FakeModelServer, load_script
from tools.fixture_mcp.rig import FAST, ROOT, Rig
from tools.waiting import wait_until

pytestmark = pytest.mark.slow


def capable(name: str = "cap", **kw: Any) -> ServerSpec:
    return ServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=("-m", "tools.fixture_mcp.capable"),
        cwd=str(ROOT),
        **kw,
    )


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    script = {"on_user": {"text": "Valletta", "input_tokens": 30, "output_tokens": 2}}
    srv = FakeModelServer(load_script(json.dumps(script))).start()
    yield srv
    srv.stop()


def with_asks(rig: Rig, model: FakeModelServer | None, **cfg: Any) -> ServerAsks:
    config = McpConfig(**{**{f: getattr(FAST, f) for f in FAST.__struct_fields__}, **cfg})
    models = {}
    if model is not None:
        models["default"] = ModelConfig(
            base_url=model.url + "/v1", model="scripted", retries=0, stream=False
        )
    asks = ServerAsks(
        config, rig.db, ChildRef.to(rig.policy, "policy"), rig.bus, models, approval_expiry=30
    )
    rig.deps.asks = asks
    return asks


def turn(human: bool = True, channel: str = "chat") -> TurnContext:
    return TurnContext(
        conversation_id="conv",
        turn_id="t1",
        channel=channel,  # type: ignore[arg-type]
        human_present=human,
        scope="unrestricted",
    )


def test_roots_come_from_config_and_are_none_by_default(rig: Rig, tmp_path: Path) -> None:
    rig.add(capable("bare"))
    rig.add(capable("rooted", roots=(str(tmp_path), "file:///srv/data")))
    rig.start()
    rig.wait_tools("bare", 6, 40)
    rig.wait_tools("rooted", 6, 40)
    rig.allow("_mcp_bare_*")
    rig.allow("_mcp_rooted_*")
    assert "(no roots)" in rig.run("_mcp_bare_where").envelope
    out = rig.run("_mcp_rooted_where")
    assert out.status == "success"
    assert f"{tmp_path.as_uri()},file:///srv/data" in out.envelope


def test_sampling_is_gated_budgeted_and_runs_on_the_model(rig: Rig, model: FakeModelServer) -> None:
    asks = with_asks(rig, model, sampling_tokens_per_day=120)
    rig.add(capable())
    rig.start()
    rig.wait_tools("cap", 6, 40)
    rig.allow("_mcp_cap_*")
    # default ask; the inbound agent channel has no human: deny, the model never runs
    out = rig.run(
        "_mcp_cap_think", {"question": "capital of Malta?"}, context=turn(False, "external_agent")
    )
    assert out.status == "error" and "not allowed" in out.envelope
    assert model.requests == []
    # a human on chat: the owner is asked and sees the server's prompt
    seen: list[PermissionRequest] = []
    sub = rig.bus.subscribe(
        "conv", lambda e: seen.append(e) if isinstance(e, PermissionRequest) else None
    )
    fut = rig.call("_mcp_cap_think", {"question": "capital of Malta?"}, context=turn())
    wait_until(lambda: bool(seen), 20, "the sampling request reaches the owner")
    (asked,) = seen
    assert asked.permission == "_mcp_cap.sampling"
    assert "capital of Malta?" in asked.params["prompt"] and "one word" in asked.params["prompt"]
    rig.policy.proxy().answer(asked.request_id, "allow_once", LOCAL_OWNER).get(timeout=5)
    done = fut.result(30)
    assert done.status == "success" and "model said: Valletta" in done.envelope
    (sent,) = model.requests
    assert "capital of Malta?" in json.dumps(sent)
    sub.close()
    # allowed always now; the daily budget (120 tokens) is spent after the next ones
    rig.allow("_mcp_cap.sampling")
    results = [rig.run("_mcp_cap_think", {"question": "again?"}, context=turn()) for _ in range(3)]
    assert any("budget" in r.envelope for r in results)
    assert asks._budget.spent("cap") > 0


def test_elicitation_declines_without_a_human_and_never_fills_a_secret(
    rig: Rig,
) -> None:
    with_asks(rig, None)
    rig.add(capable())
    rig.start()
    rig.wait_tools("cap", 6, 40)
    rig.allow("_mcp_cap_*")
    rig.allow("_mcp_cap.elicitation")
    out = rig.run("_mcp_cap_ask_name", context=turn(False, "external_agent"))
    assert "no answer (decline)" in out.envelope
    secret = rig.run("_mcp_cap_ask_password", context=turn())
    assert "no login (decline)" in secret.envelope


def test_a_form_elicitation_is_a_durable_request_checked_against_the_form(
    rig: Rig,
) -> None:
    with_asks(rig, None)
    rig.add(capable())
    rig.start()
    rig.wait_tools("cap", 6, 40)
    rig.allow("_mcp_cap_*")
    # an allow does not fill a form: the owner is still asked (never on their behalf)
    rig.allow("_mcp_cap.elicitation")
    asked: list[PermissionRequest] = []
    rig.bus.subscribe(
        "conv", lambda e: asked.append(e) if isinstance(e, PermissionRequest) else None
    )
    fut = rig.call("_mcp_cap_ask_name", context=turn())
    wait_until(lambda: bool(asked), 20, "the question reaches the owner")
    (q,) = asked
    assert q.permission == "_mcp_cap.elicitation" and q.form is not None
    assert set(q.form["properties"]) == {"name", "age"} and "name and age" in q.prompt
    policy = rig.policy.proxy()
    (stored,) = policy.pending().get(timeout=5)  # what `chalie policy pending` lists
    assert stored.request_id == q.request_id and stored.form == q.form
    for bad in ({"name": "Ann", "age": "old"}, {"name": {"nested": 1}, "age": 3}, None):
        with pytest.raises(PolicyError):
            policy.answer(q.request_id, "allow_once", LOCAL_OWNER, bad).get(timeout=5)
    assert policy.answer("nope", "allow_once", LOCAL_OWNER, {"name": "x"}).get(timeout=5) is False
    agent = Principal(scope="agent", id="tok_agent", name="agent")
    with pytest.raises(PolicyError, match="only the owner"):
        policy.answer(q.request_id, "allow_once", agent, {"name": "Ann", "age": 41}).get(timeout=5)
    assert not fut.done()  # bad answers, and anyone but the owner, leave it pending
    ok = policy.answer(q.request_id, "allow_once", LOCAL_OWNER, {"name": "Ann", "age": 41})
    assert ok.get(timeout=5) is True
    assert "hello Ann (41)" in fut.result(30).envelope
    # a setting of deny declines without asking
    rig.policy.proxy().set("chat", "_mcp_cap.elicitation", "deny").get(timeout=5)
    assert "no answer (decline)" in rig.run("_mcp_cap_ask_name", context=turn()).envelope
    assert len(asked) == 1


def test_a_form_elicitation_expires_to_a_decline(rig: Rig) -> None:
    with_asks(rig, None, elicitation_timeout=3.0)
    rig.add(capable())
    rig.start()
    rig.wait_tools("cap", 6, 40)
    rig.allow("_mcp_cap_*")
    out = rig.run("_mcp_cap_ask_name", context=turn())
    assert "no answer (decline)" in out.envelope
    policy = rig.policy.proxy()
    assert policy.pending().get(timeout=5) == []
    # allow_always answers a form once: no rule is stored for it (never filled for the owner)
    asked: list[PermissionRequest] = []
    rig.bus.subscribe(
        "conv", lambda e: asked.append(e) if isinstance(e, PermissionRequest) else None
    )
    fut = rig.call("_mcp_cap_ask_name", context=turn())
    wait_until(lambda: bool(asked), 20, "the question")
    answered = policy.answer(
        asked[0].request_id, "allow_always", LOCAL_OWNER, {"name": "Al", "age": 9}
    )
    assert answered.get(timeout=5) is True
    assert "hello Al (9)" in fut.result(30).envelope
    rules = policy.list().get(timeout=5)
    assert not any(r.permission == "_mcp_cap.elicitation" and r.decision == "allow" for r in rules)


def test_progress_reaches_the_conversation_as_tool_progress(rig: Rig) -> None:
    rig.add(capable())
    rig.start()
    rig.wait_tools("cap", 6, 40)
    rig.allow("_mcp_cap_*")
    got: list[ToolProgress] = []
    lock = threading.Lock()

    def keep(event: Any) -> None:
        if isinstance(event, ToolProgress):
            with lock:
                got.append(event)

    rig.bus.subscribe("conv", keep)
    out = rig.run("_mcp_cap_count", {"n": 3}, call_id="p1", context=turn())
    assert out.status == "success"
    wait_until(lambda: len(got) == 3, 10, "three progress events")
    assert [(g.progress, g.total, g.message) for g in got] == [
        (1.0, 3.0, "step 1"),
        (2.0, 3.0, "step 2"),
        (3.0, 3.0, "step 3"),
    ]
    assert {(g.call_id, g.tool, g.turn_id) for g in got} == {("p1", "_mcp_cap_count", "t1")}


def test_server_log_messages_reach_its_log_throttled_and_scrubbed(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.add(capable(env={"API_TOKEN": "hunter2"}))
    rig.start()
    rig.wait_tools("cap", 6, 40)
    rig.allow("_mcp_cap_*")
    with caplog.at_level(logging.INFO, logger="chalie.mcp.server_log"):
        assert rig.run("_mcp_cap_chatter", {"n": 60}).status == "success"
        wait_until(
            lambda: sum("chatter line" in r.getMessage() for r in caplog.records) >= 5,
            10,
            "log lines",
        )
    lines = [r.getMessage() for r in caplog.records if "chatter line" in r.getMessage()]
    assert 5 <= len(lines) < 60  # throttled
    assert all("hunter2" not in line for line in lines)
    logfile = rig.home / "logs" / "mcp-cap.log"
    wait_until(lambda: logfile.exists() and "chatter line 0" in logfile.read_text(), 10, "file")
    assert "hunter2" not in logfile.read_text()


def test_the_sampling_budget_adds_up_per_server_and_day_on_either_engine(
    store_place: Place,
) -> None:
    from actors.mcp.asks import Budget

    first, other = Budget(store_place), Budget(store_place)  # two daemons' views
    assert first.spent("gh") == 0 and first.known("gh") == 0
    first.book("gh", 120)
    other.book("gh", 30)
    other.book("gl", 5)
    first.note("gh", 120)
    assert first.known("gh") == 120  # this process's own count, no database read
    assert other.spent("gh") == 150 and first.spent("gh") == 150 and first.spent("gl") == 5
    first.close()
    other.close()

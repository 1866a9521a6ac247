"""Permission requests survive a restart: stored when raised, listed, answered, expired."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from tests.conftest import DaemonProcess, short_home, wait_until
from tools.fake_llm import FakeModelServer, load_script

CLOCK = {
    "steps": [
        {
            "tool_calls": [
                {
                    "id": "c1",
                    "name": "clock",
                    "arguments": {
                        "action": "now",
                        "zone": "UTC",
                        "act_summary": "reading the clock",
                    },
                }
            ]
        },
        {"text": "done"},
    ],
    "on_user": {"text": "done"},
}


def pending(d: DaemonProcess) -> list[dict[str, Any]]:
    done = d.cli("policy", "pending", "--json")
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


@pytest.mark.slow
def test_a_pending_request_survives_kill_9_and_is_answered_after_the_restart() -> None:
    with FakeModelServer(load_script(json.dumps(CLOCK))) as model:
        home: Path = short_home()
        (home / "config.toml").write_text(
            f'[models.default]\nbase_url = "{model.url}/v1"\nmodel = "scripted"\n'
            '[channels.chat]\npinned = ["clock"]\nfind_tools = false\n'
            "[chat]\nport = 0\n[mcp_server]\nport = 0\n"
        )
        d = DaemonProcess(home, home / "daemon.log").start()
        try:
            with ChatClient.local(home) as chat:
                chat.send(p.Send(text="what time is it?", client_msg_id="m1"))
                asked = None
                while asked is None:
                    frame = chat.receive(20)
                    assert frame is not None, "no permission request"
                    if frame["type"] == "permission_request":
                        asked = frame
            rid = asked["request_id"]
            assert (
                'zone = "UTC"' in asked["prompt"]
                and "local owner, on the chat channel" in asked["prompt"]
            )
            (listed,) = pending(d)
            assert listed["request_id"] == rid and listed["permission"] == "clock.now"
            d.kill()  # SIGKILL while the request waits

            d = DaemonProcess(home, home / "daemon.log").start()
            (again,) = pending(d)
            assert again["request_id"] == rid and again["prompt"] == listed["prompt"]
            shown = d.cli("policy", "pending")
            assert rid in shown.stdout and 'zone = "UTC"' in shown.stdout
            answered = d.cli("policy", "answer", rid, "always")
            assert answered.returncode == 0, answered.stderr
            assert pending(d) == []
            rules = json.loads(d.cli("policy", "list", "--json").stdout)["rules"]
            assert {(r["channel"], r["permission"], r["decision"]) for r in rules} >= {
                ("chat", "clock.now", "allow")
            }
            twice = d.cli("policy", "answer", rid, "deny")
            assert twice.returncode == 1 and "no pending permission request" in twice.stderr
        finally:
            d.kill()


def test_a_request_left_open_expires_to_a_denial_after_the_gate_restarts(tmp_path: Path) -> None:
    from actors.policy import PolicyActor
    from chalie.approvals import ApprovalStore
    from chalie.events import EventBus
    from chalie.messages import TurnContext
    from chalie.principals import LOCAL_OWNER

    db = tmp_path / "chalie.db"
    bus = EventBus()
    ctx = TurnContext(conversation_id="c1", turn_id="t1", channel="chat", human_present=True)
    first = PolicyActor.start(db, bus, approval_expiry=1.5)
    waiting = first.proxy().gate("k1", ctx, "clock", "clock", False, "read", {"zone": "UTC"}).get()
    (request,) = first.proxy().pending().get()
    first.stop()  # the gate stops: the call ends denied, the request stays stored
    assert waiting.result(5).decision == "deny"
    second = PolicyActor.start(db, bus, approval_expiry=1.5)
    try:
        assert [r.request_id for r in second.proxy().pending().get()] == [request.request_id]
        wait_until(lambda: second.proxy().pending().get() == [], timeout=10)
        store = ApprovalStore(db)
        assert store.state(request.request_id) == ("expired", None)
        store.close()
        assert second.proxy().answer(request.request_id, "allow_once", LOCAL_OWNER).get() is False
    finally:
        second.stop()


ASK_NAME = {
    "steps": [
        {"tool_calls": [{"name": "_mcp_cap_ask_name", "arguments": {"act_summary": "asking"}}]},
        {"text": "server said: {last_result}"},
    ],
    "on_user": {"text": "done"},
}


@pytest.mark.slow
def test_a_server_s_form_is_listed_answered_from_the_cli_and_survives_kill_9() -> None:
    """A remote server's form elicitation is a durable request: ``chalie policy pending``
    shows it, a bad ``--content`` is refused and leaves it pending, ``chalie mcp answer``
    answers it; one left open by a kill -9 is pending again after the restart."""
    import sys

    from chalie.mcp.admin import McpAdmin
    from chalie.mcp.spec import ServerSpec
    from tools.fixture_mcp.rig import ROOT

    with FakeModelServer(load_script(json.dumps({"steps": ASK_NAME["steps"] * 2}))) as model:
        home: Path = short_home()
        (home / "config.toml").write_text(
            f'[models.default]\nbase_url = "{model.url}/v1"\nmodel = "scripted"\n'
            '[channels.chat]\npinned = ["_mcp_cap_ask_name"]\nfind_tools = false\n'
            "[chat]\nport = 0\n[mcp_server]\nport = 0\n[mcp]\nstart_delay = 0\n"
            "[discovery]\nwrite_examples = false\n"
        )
        admin = McpAdmin(home / "chalie.db", home)
        cap = ServerSpec(
            name="cap",
            transport="stdio",
            command=sys.executable,
            args=("-m", "tools.fixture_mcp.capable"),
            cwd=str(ROOT),
        )
        admin.add(cap)
        admin.close()

        def ask(chat: ChatClient, text: str) -> dict[str, Any]:
            """Send, allow the tool call, and return the form's permission request."""
            chat.send(p.Send(text=text, client_msg_id=text.replace(" ", "-")))
            while True:
                frame = chat.receive(60)
                assert frame is not None, "no form request"
                if frame["type"] == "permission_request" and frame.get("form") is None:
                    chat.send(p.Answer(request_id=frame["request_id"], answer="allow_once"))
                elif frame["type"] == "permission_request":
                    return frame

        def finished(chat: ChatClient) -> dict[str, Any]:
            while True:
                frame = chat.receive(60)
                assert frame is not None, "the turn did not finish"
                if frame["type"] == "turn_finished":
                    return frame

        d = DaemonProcess(home, home / "daemon.log").start()
        try:
            with ChatClient.local(home) as chat:
                wait_until(
                    lambda: "_mcp_cap_ask_name" in d.cli("tools", "list").stdout, 60, "the tool"
                )
                form = ask(chat, "ask my name")
                rid = form["request_id"]
                (listed,) = pending(d)
                assert listed["request_id"] == rid and listed["form"] == form["form"]
                shown = d.cli("policy", "pending").stdout
                assert rid in shown and "a form: answer with --content" in shown
                bad = d.cli("policy", "answer", rid, "once", "--content", '{"name": "Z"}')
                assert bad.returncode == 1 and "fit the form" in bad.stderr
                assert [r["request_id"] for r in pending(d)] == [rid]
                good = d.cli("mcp", "answer", rid, '{"name": "Zed", "age": 5}')
                assert good.returncode == 0, good.stderr
                assert "hello Zed (5)" in finished(chat)["text"]
                assert pending(d) == []
                # the next form waits when the daemon is killed
                second = ask(chat, "ask again")["request_id"]
            d.kill()
            d = DaemonProcess(home, home / "daemon.log").start()
            (again,) = pending(d)
            assert again["request_id"] == second and again["form"] == form["form"]
            late = d.cli(
                "policy", "answer", second, "once", "--content", '{"name": "Al", "age": 3}'
            )
            assert late.returncode == 0, late.stderr  # recorded; its call ended with that run
            assert pending(d) == []
        finally:
            d.kill()

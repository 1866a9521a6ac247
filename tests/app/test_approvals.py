"""Permission requests survive a restart: stored when raised, listed, answered, expired."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from tests.daemon_process import DaemonProcess, short_home
from tools.fake_llm import FakeModelServer, load_script
from tools.waiting import wait_until

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


def clock_home(model: FakeModelServer) -> Path:
    """A fresh home whose chat channel has the clock pinned, on the scripted ``model``."""
    home: Path = short_home()
    (home / "config.toml").write_text(
        f'[models.default]\nbase_url = "{model.url}/v1"\nmodel = "scripted"\n'
        '[channels.chat]\npinned = ["clock"]\nfind_tools = false\n'
        "[chat]\nport = 0\n[mcp_server]\nport = 0\n"
    )
    return home


@pytest.mark.slow
def test_a_pending_request_survives_kill_9_and_is_answered_after_the_restart() -> None:
    with FakeModelServer(load_script(json.dumps(CLOCK))) as model:
        home = clock_home(model)
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
    from actors.gate.policy import PolicyActor
    from chalie.gate.approvals import ApprovalStore
    from chalie.wire.bus import EventBus
    from chalie.wire.messages import TurnContext
    from chalie.wire.principals import LOCAL_OWNER

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


ASKING = {
    "steps": [],
    # every person's message asks for the clock; a tool's result is answered in words
    "on_user": CLOCK["steps"][0],
    "on_tool": {"text": "done"},
}


def ask_in_new_conversation(home: Path, text: str, msg_id: str) -> dict[str, Any]:
    with ChatClient.local(home) as chat:
        chat.send(p.Send(text=text, client_msg_id=msg_id))
        while True:
            frame = chat.receive(30)
            assert frame is not None, "no permission request"
            assert frame["type"] != "rejected", frame
            if frame["type"] == "permission_request":
                return frame


def background_result(home: Path, conversation_id: str, timeout: float = 60) -> dict[str, Any]:
    """The first background result the conversation holds (its stored events, then live)."""
    with ChatClient.local(home) as chat:
        chat.send(p.Open(conversation_id=conversation_id, after_seq=0))
        while True:
            frame = chat.receive(timeout)
            assert frame is not None, "no background result in the conversation"
            if frame["type"] == "background_result":
                return frame


@pytest.mark.slow
def test_a_request_answered_after_a_restart_resumes_its_call() -> None:
    """kill -9 while two calls wait for the owner; after the restart the owner allows one
    (it runs, its result reaches its conversation as a background result) and denies the
    other (its conversation hears that it did not run). Before: both only ended
    ``interrupted`` and the answers were merely recorded."""
    with FakeModelServer(load_script(json.dumps(ASKING))) as model:
        home = clock_home(model)
        d = DaemonProcess(home, home / "daemon.log").start()
        try:
            allowed = ask_in_new_conversation(home, "what time is it?", "m1")
            denied = ask_in_new_conversation(home, "and now?", "m2")
            assert {r["request_id"] for r in pending(d)} == {
                allowed["request_id"],
                denied["request_id"],
            }
            d.kill()  # SIGKILL while both wait

            d = DaemonProcess(home, home / "daemon.log").start()
            assert d.cli("policy", "answer", allowed["request_id"], "once").returncode == 0
            assert d.cli("policy", "answer", denied["request_id"], "deny").returncode == 0
            ran = background_result(home, allowed["conversation_id"])
            assert ran["tool"] == "clock" and ran["status"] == "success", ran
            assert "clock(status=success" in ran["envelope"], ran
            refused = background_result(home, denied["conversation_id"])
            assert refused["status"] == "error" and "permission-denied" in refused["envelope"]
            assert "did not run" in refused["envelope"]
            # the resumed call is on the trail, allowed by the owner's answer
            trail = json.loads(d.cli("trail", "--json").stdout)
            resumed = [r for r in trail if r["call_id"].endswith("-resumed")]
            assert [(r["tool"], r["status"], r["decided_by"]) for r in resumed] == [
                ("clock", "success", "human")
            ], resumed
        finally:
            d.kill()


def test_a_stored_call_runs_once_on_the_answer_and_one_with_a_secret_ends_clearly(
    tmp_path: Path,
) -> None:
    """The PolicyActor's half of resuming (no daemon): the call stored with its request is
    handed back, once, on an allow after a restart, and its gate allows it exactly once; a
    call that could not be stored (a secret in its arguments) ends with a result that says
    so in its conversation."""
    from actors.gate.policy import PolicyActor
    from chalie.gate.approvals import ResumableCall, call_binding, encode_call
    from chalie.wire.bus import EventBus
    from chalie.wire.events import BackgroundResult
    from chalie.wire.messages import ToolCall, TurnContext
    from chalie.wire.principals import LOCAL_OWNER

    db = tmp_path / "chalie.db"
    bus = EventBus()
    heard: list[BackgroundResult] = []
    bus.subscribe(None, heard.append, kinds=(BackgroundResult,))
    ctx = TurnContext(conversation_id="c1", turn_id="t1", channel="chat", human_present=True)
    stored = encode_call(
        ResumableCall(
            call_id="k1",
            tool="clock",
            arguments={"action": "now", "zone": "UTC"},
            act_summary="reading the clock",
            context=ctx,
        )
    )
    bound = call_binding("clock", "clock.now", {"action": "now", "zone": "UTC"}, None)
    first = PolicyActor.start(db, bus)
    gate = first.proxy()
    asked = ("k1", ctx, "clock", "clock.now", False, "read", {"zone": "UTC"})
    gate.gate(*asked, resume=stored, binding=bound).get()
    other = msgspec.structs.replace(ctx, conversation_id="c2")
    gate.gate("k2", other, "email", "email.send", False, "send", {"password": "***"}).get()
    requests = {r.conversation_id: r.request_id for r in gate.pending().get()}
    first.stop()
    resumed: list[ToolCall] = []
    second = PolicyActor.start(db, bus, resume=resumed.append)
    try:
        gate = second.proxy()
        assert gate.answer(requests["c1"], "allow_once", LOCAL_OWNER).get() is True
        (call,) = resumed
        assert call.tool == "clock" and call.context.resumes == requests["c1"]
        assert call.arguments == {
            "action": "now",
            "zone": "UTC",
            "act_summary": "reading the clock",
            "async": True,
        }
        assert call.context.allow_async and call.context.conversation_id == "c1"
        again = (call.call_id, call.context, "clock", "clock.now", False, "read", {"zone": "UTC"})
        # Only the call the owner saw takes the answer: another one (same request) is asked.
        other_call = call_binding("clock", "clock.now", {"action": "now", "zone": "EST"}, None)
        swapped = gate.gate(*again, binding=other_call).get()
        assert not swapped.done() and len(gate.pending().get()) == 2  # c2 and the new ask
        assert gate.gate(*again, binding=bound).get().result(5).decision == "allow"
        twice = gate.gate(*again, binding=bound).get()  # the answer is used once: asked again
        assert not twice.done() and len(gate.pending().get()) == 3
        assert gate.answer(requests["c2"], "allow_once", LOCAL_OWNER).get() is True
        wait_until(lambda: heard, timeout=10)
        (told,) = heard
        assert told.conversation_id == "c2" and told.code == "interrupted"
        assert "held a secret" in told.envelope and len(resumed) == 1
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

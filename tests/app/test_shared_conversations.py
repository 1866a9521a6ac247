"""Two real daemons on one real PostgreSQL run one conversation as one Chalie (issue 33 §1).

A conversation is continued on either daemon; the daemon holding its lease runs its turns,
and a message the other gets waits, queued, until the holder hands the conversation over
(never two turns of one conversation at once); a daemon killed mid-turn lets go of the
lease with its session, and the other closes the turn it left and goes on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from tests.daemon_process import DaemonProcess, short_home
from tools.fake_llm import FakeModelServer, load_script
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

CLOCK = {"name": "clock", "arguments": {"action": "now", "zone": "UTC", "act_summary": "clock"}}
SCRIPT = {
    "on_user": {
        "text": "echo: {last_user}",
        "cases": [
            {"user_has": "clock please", "then": {"tool_calls": [CLOCK]}},
            {"user_has": "hang please", "then": {"hang": True}},
        ],
    },
    "on_tool": {"text": "the clock answered"},
}


class Pair:
    def __init__(self, a: DaemonProcess, b: DaemonProcess, model: FakeModelServer) -> None:
        self.a, self.b, self.model = a, b, model


@pytest.fixture
def pair(pg_cluster: Any) -> Iterator[Pair]:
    url = pg_cluster.new_database()
    with FakeModelServer(load_script(json.dumps(SCRIPT))) as model:
        daemons = []
        for _ in range(2):
            home = short_home()
            (home / "config.toml").write_text(
                f'[models.default]\nbase_url = "{model.url}/v1"\nmodel = "scripted"\n'
                '[channels.chat]\npinned = ["clock"]\nfind_tools = false\n'
                f'[mcp_server]\nport = 0\n[chat]\nport = 0\n[store]\nurl = "{url}"\n'
            )
            daemons.append(DaemonProcess(home, home / "daemon.log"))
        try:
            for d in daemons:
                d.start()
            yield Pair(daemons[0], daemons[1], model)
        finally:
            for d in daemons:
                d.kill()


def send_on(d: DaemonProcess, cid: str, text: str, msg_id: str) -> tuple[ChatClient, str]:
    """A message into conversation ``cid`` on ``d``'s chat socket (a human present);
    returns the open client and the turn id ``d`` accepted it as."""
    chat = ChatClient.local(d.home)
    chat.send(p.Send(conversation_id=cid, text=text, client_msg_id=msg_id))
    while True:
        frame = chat.receive(30)
        assert frame is not None, "no accepted frame"
        assert frame["type"] != "rejected", frame
        if frame["type"] == "accepted":
            return chat, str(frame["turn_id"])


def finished(chat: ChatClient, turn_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """The ``turn_finished`` event of ``turn_id`` as the client hears it."""
    while True:
        frame = chat.receive(timeout)
        assert frame is not None, f"turn {turn_id} did not finish"
        if frame["type"] == "turn_finished" and frame["turn_id"] == turn_id:
            return frame


def shown(d: DaemonProcess, cid: str) -> dict[str, Any]:
    done = d.cli_process("conversations", "show", cid, "--json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def events(d: DaemonProcess, cid: str) -> list[dict[str, Any]]:
    """The conversation's stored events, as a client reads them (seq order)."""
    with ChatClient.local(d.home) as chat:
        chat.send(p.Open(conversation_id=cid, after_seq=0))
        got: list[dict[str, Any]] = []
        while True:
            frame = chat.receive(10)
            assert frame is not None, "no opened frame"
            if frame["type"] == "opened":
                last = int(frame["last_seq"])
                break
            got.append(frame)
        while not got or int(got[-1].get("seq", 0)) < last:
            frame = chat.receive(10)
            assert frame is not None, f"events stop before seq {last}"
            got.append(frame)
    return [f for f in got if "seq" in f]


def start_on(d: DaemonProcess, text: str, *, until: str) -> tuple[ChatClient, str]:
    """A new conversation on ``d`` over its chat socket; returns once a frame of type
    ``until`` came (the client stays open: a human is present)."""
    chat = ChatClient.local(d.home)
    chat.send(p.Send(text=text, client_msg_id="m1"))
    cid = None
    while True:
        frame = chat.receive(30)
        assert frame is not None, f"no {until} frame"
        if frame["type"] == "accepted":
            cid = frame["conversation_id"]
        if frame["type"] == until:
            assert cid is not None
            return chat, cid


def queued_behind(a: DaemonProcess, cid: str) -> None:
    """Wait until the message sent to B is stored queued behind A's running turn."""
    wait_until(
        lambda: [t["state"] for t in shown(a, cid)["turns"]] == ["running", "queued"],
        30,
        "B's message queued behind A's turn",
    )


def answer_as_request(a: DaemonProcess, cid: str) -> None:
    """Allow, on A, the one request A's turn of ``cid`` waits for."""
    (pending,) = json.loads(a.cli_process("policy", "pending", "--json").stdout)
    assert pending["conversation_id"] == cid
    assert a.cli_process("policy", "answer", pending["request_id"], "once").returncode == 0


def turn_ended_in_log(d: DaemonProcess, cid: str) -> int:
    return d.log().count(f"turn ended: conversation={cid}")


def test_a_message_on_b_waits_for_as_running_turn_then_b_runs_it_with_the_history(
    pair: Pair,
) -> None:
    a, b = pair.a, pair.b
    chat, cid = start_on(a, "clock please", until="permission_request")
    try:
        # A's turn waits for the owner (mid-turn). B gets the next message of the conversation.
        on_b, second = send_on(b, cid, "second message", "m2")
        queued_behind(a, cid)
        assert on_b.receive(0.5) is None  # B does not start it while A's turn runs
        rid = shown(a, cid)
        answer_as_request(a, cid)
        got = finished(on_b, second)
        on_b.close()
    finally:
        chat.close()
    assert got["reason"] == "final" and got["text"] == "echo: second message", got
    assert rid["info"]["id"] == cid
    # A ran the first turn, B the second (each daemon logs the turns it ran).
    assert turn_ended_in_log(a, cid) == 1
    wait_until(lambda: turn_ended_in_log(b, cid) == 1, 10, "B's log of its turn")
    # Never two turns at once: the second started after the first finished.
    seen = events(b, cid)
    kinds = [(e["type"], e.get("turn_id")) for e in seen]
    first_id, second_id = (t["turn_id"] for t in shown(b, cid)["turns"])
    started = kinds.index(("turn_started", second_id))
    assert kinds.index(("turn_finished", first_id)) < started
    # B's turn had A's: the whole history is one conversation in the store.
    texts = [m.get("text") for m in shown(b, cid)["messages"]]
    assert texts[0] == "clock please" and "the clock answered" in texts
    assert texts[-2:] == ["second message", "echo: second message"]


def test_kill_9_of_a_mid_turn_and_the_conversation_goes_on_on_b(pair: Pair) -> None:
    a, b = pair.a, pair.b
    chat, cid = start_on(a, "hang please", until="turn_started")
    wait_until(lambda: len(pair.model.requests) >= 1, 30, "A's turn asks the model (and hangs)")
    a.kill()  # SIGKILL mid-turn: A's session, and the conversation's lease, go with it
    chat.close()
    on_b, turn_id = send_on(b, cid, "after the crash", "m2")
    got = finished(on_b, turn_id)
    on_b.close()
    assert got["reason"] == "final" and got["text"] == "echo: after the crash", got
    after = shown(b, cid)
    turns = [(t["state"], t.get("reason")) for t in after["turns"]]
    # A's turn is closed as interrupted (by B, which took the lease A's death freed).
    assert turns == [("done", "interrupted"), ("done", "final")], turns
    texts = [m.get("text") for m in after["messages"]]
    assert texts[0] == "hang please"  # the user's message A had taken is kept
    assert texts[-2:] == ["after the crash", "echo: after the crash"]


def test_a_permission_request_raised_on_a_is_listed_and_answered_on_bs_cli(pair: Pair) -> None:
    """``chalie policy pending`` on B lists A's request; ``policy answer`` on B answers it,
    and the call that waits on A resumes there (A's turn goes on to its end); B never
    adopts it (no second run of the call)."""
    a, b = pair.a, pair.b
    chat, cid = start_on(a, "clock please", until="permission_request")
    try:
        listed = json.loads(b.cli_process("policy", "pending", "--json").stdout)
        assert [(r["conversation_id"], r["permission"]) for r in listed] == [(cid, "clock.now")]
        rid = listed[0]["request_id"]
        done = b.cli_process("policy", "answer", rid, "once")
        assert done.returncode == 0, done.stderr
        turn_id = shown(a, cid)["turns"][0]["turn_id"]
        end = finished(chat, turn_id)
    finally:
        chat.close()
    assert end["reason"] == "final" and end["text"] == "the clock answered", end
    assert json.loads(a.cli_process("policy", "pending", "--json").stdout) == []
    assert json.loads(b.cli_process("policy", "pending", "--json").stdout) == []
    # The clock ran once, on A (its trail row), not again on B.
    rows = json.loads(b.cli_process("trail", "--json").stdout)
    assert [r["tool"] for r in rows].count("clock") == 1


def test_a_chat_message_queued_on_b_behind_as_turn_still_asks_its_human(pair: Pair) -> None:
    """The turn B runs once A hands the conversation over asks the person chatting on B
    (a permission request on B's chat), and B's answer lets it finish."""
    a, b = pair.a, pair.b
    chat, cid = start_on(a, "clock please", until="permission_request")
    try:
        on_b, second = send_on(b, cid, "clock please, from B", "m2")
        queued_behind(a, cid)
        answer_as_request(a, cid)
        while True:  # B runs its turn once A hands over: it asks the human on B's chat
            frame = on_b.receive(60)
            assert frame is not None, "B's turn asked nobody"
            assert frame["type"] != "turn_finished", frame  # ended without asking
            if frame["type"] == "permission_request":
                break
        assert frame["conversation_id"] == cid
        assert b.cli_process("policy", "answer", frame["request_id"], "once").returncode == 0
        end = finished(on_b, second)
        on_b.close()
    finally:
        chat.close()
    assert end["reason"] == "final" and end["text"] == "the clock answered", end

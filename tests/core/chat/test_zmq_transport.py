"""The ZeroMQ chat bridge over the Conversations double: turns, resume, permissions, limits."""

from __future__ import annotations

import logging
import os
import stat
import uuid
from typing import Any

import msgspec
import pytest
import zmq

from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from tests.core.chat.bridge import Bridge, collect, collect_all
from tools.waiting import wait_until


def finished(frame: dict[str, Any]) -> bool:
    return bool(frame["type"] == "turn_finished")


def test_a_message_streams_its_turn_and_the_socket_is_private(bridge: Bridge) -> None:
    mode = stat.S_IMODE(os.stat(bridge.home / "chat.sock").st_mode)
    assert mode == 0o600
    with bridge.zmq() as c:
        c.send(p.Send(text="hello there", client_msg_id="m1", id="r1"))
        frames = collect(c, finished)
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "hello"
    assert kinds[1] == "accepted" and frames[1]["id"] == "r1"
    assert "turn_started" in kinds and kinds[-1] == "turn_finished"
    events = [f for f in frames if "seq" in f]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert frames[-1]["text"] == "echo: hello there"


def test_a_retried_send_starts_no_second_turn(bridge: Bridge) -> None:
    with bridge.zmq() as c:
        c.send(p.Send(text="once", client_msg_id="same"))
        first = collect(c, finished)
        cid = first[1]["conversation_id"]
        c.send(p.Send(conversation_id=cid, text="once", client_msg_id="same"))
        again = collect(c, lambda f: f["type"] == "accepted")
        assert again[-1]["duplicate"] is True
        assert c.receive(0.3) is None  # no second turn's events
    assert len(bridge.convs.proxy().sent.get()) == 2


def test_a_reconnecting_client_gets_what_it_missed_and_nothing_twice(bridge: Bridge) -> None:
    with bridge.zmq() as c:
        c.send(p.Send(text="first", client_msg_id="a"))
        frames = collect(c, finished)
        cid = frames[1]["conversation_id"]
        seen = max(f["seq"] for f in frames if "seq" in f)
    with bridge.zmq() as other:  # another client moves the conversation on meanwhile
        other.send(p.Send(conversation_id=cid, text="second", client_msg_id="b"))
        collect(other, finished)
    with bridge.zmq() as back:
        back.send(p.Open(conversation_id=cid, after_seq=2, id="o"))
        frames = collect(back, lambda f: f["type"] == "opened")
        seqs = [f["seq"] for f in frames if "seq" in f]
        assert seqs == list(range(3, seqs[-1] + 1)) and seqs[-1] > seen
        assert frames[-1]["last_seq"] == seqs[-1]
        texts = [f["text"] for f in frames if f["type"] == "turn_finished"]
        assert texts == ["echo: first", "echo: second"]


def test_a_live_gap_is_filled_from_storage(bridge: Bridge) -> None:
    with bridge.zmq() as c:
        c.send(p.Send(text="start", client_msg_id="a"))
        frames = collect(c, finished)
        cid = frames[1]["conversation_id"]
        missing = bridge.convs.proxy().emit_out_of_band(cid, "never published", False).get()
        bridge.convs.proxy().emit_out_of_band(cid, "published", True).get()
        got = collect(c, lambda f: f.get("text") == "published")
        assert [f["seq"] for f in got if "seq" in f] == [missing, missing + 1]


def test_a_permission_request_is_answered_by_any_client_and_settles_for_all(
    bridge: Bridge,
) -> None:
    with bridge.zmq() as asker, bridge.zmq() as watcher:
        asker.send(p.Send(text="ask what time it is", client_msg_id="q"))
        frames = collect(asker, lambda f: f["type"] == "permission_request")
        cid = frames[1]["conversation_id"]
        request = frames[-1]
        assert request["tool"] == "clock" and request["params"] == {"zone": "Asia/Tokyo"}
        watcher.send(p.Open(conversation_id=cid, after_seq=0))
        seen = collect(watcher, lambda f: f["type"] == "opened")
        assert any(f["type"] == "permission_request" for f in seen)
        watcher.send(p.Answer(request_id=request["request_id"], answer="allow_once", id="ans"))
        mine = collect_all(watcher, "answered", "turn_finished")
        assert {
            "type": "answered",
            "id": "ans",
            "request_id": request["request_id"],
            "found": True,
        } in mine
        theirs = collect(asker, finished)
        assert any(f["type"] == "permission_settled" for f in theirs)
        assert theirs[-1]["text"] == "It is 09:00 in Tokyo."
        watcher.send(p.Answer(request_id=request["request_id"], answer="deny", id="late"))
        late = collect(watcher, lambda f: f["type"] == "answered")
        assert late[-1]["found"] is False


def test_cancel_ends_the_running_turn(bridge: Bridge) -> None:
    with bridge.zmq() as c:
        c.send(p.Send(text="hang on", client_msg_id="h"))
        frames = collect(c, lambda f: f["type"] == "text_delta")
        cid = frames[1]["conversation_id"]
        c.send(p.Cancel(conversation_id=cid, id="x"))
        after = collect_all(c, "cancelled", "turn_finished")
        assert [f["reason"] for f in after if f["type"] == "turn_finished"] == ["cancelled"]
        assert {"type": "cancelled", "id": "x", "conversation_id": cid, "cancelled": True} in after


def test_bad_frames_get_structured_errors_and_the_session_goes_on(bridge: Bridge) -> None:
    enc = msgspec.msgpack.encode
    cases = [
        (b"\xc1\xff not msgpack", p.MALFORMED),
        (enc([1, 2, 3]), p.MALFORMED),
        (enc({"no": "type"}), p.INVALID),
        (enc({"type": "launch_missiles", "id": "k"}), p.UNKNOWN_KIND),
        (enc({"type": "send", "text": "", "client_msg_id": "x"}), p.INVALID),
        (enc({"type": "send", "text": "hi", "client_msg_id": "bad id!"}), p.INVALID),
        (enc({"type": "send", "text": "hi", "client_msg_id": "x", "extra": 1}), p.INVALID),
        (enc({"type": "open", "conversation_id": "c", "after_seq": -1}), p.INVALID),
        (enc({"type": "answer", "request_id": "r", "answer": "maybe"}), p.INVALID),
        (enc({"type": "ping", "id": 7}), p.INVALID),
        (b"x" * (300 * 1024), p.OVERSIZED),
    ]
    with bridge.zmq() as c:
        c.send(p.Ping())
        assert [f["type"] for f in collect(c, lambda f: f["type"] == "pong")] == ["hello", "pong"]
        for raw, code in cases:
            c.send_raw(raw)
            reply = collect(c, lambda f: f["type"] == "rejected")[-1]
            assert reply["code"] == code, (raw[:40], reply)
        c.send_raw(b"a", b"b")
        assert collect(c, lambda f: f["type"] == "rejected")[-1]["code"] == p.MALFORMED
        c.send(p.Send(text="still here", client_msg_id="ok"))
        assert collect(c, finished)[-1]["text"] == "echo: still here"


def test_a_frame_past_the_transport_limit_drops_only_that_client(bridge: Bridge) -> None:
    with bridge.zmq() as big, bridge.zmq() as fine:
        big.send_raw(b"x" * (2 * 1024 * 1024))
        fine.send(p.Send(text="fine", client_msg_id="f"))
        assert collect(fine, finished)[-1]["text"] == "echo: fine"


def test_a_client_that_never_reads_is_dropped_and_others_are_served(short_home: Any) -> None:
    from tests.core.chat.bridge import start_bridge, stop_bridge

    b = start_bridge(short_home, send_queue=16)
    try:
        ctx = zmq.Context()
        lazy = ChatClient.local(b.home)
        lazy.sock.setsockopt(zmq.RCVHWM, 1)
        lazy.send(p.Send(text="flood 3000", client_msg_id="f"))
        wait_until(lambda: b.addresses()["zmq_clients"] == 0, timeout=20)
        with b.zmq() as fine:
            fine.send(p.Send(text="are you there", client_msg_id="g"))
            assert collect(fine, finished)[-1]["text"] == "echo: are you there"
        lazy.close()
        ctx.term()
    finally:
        stop_bridge(b)


@pytest.mark.slow
def test_a_thousand_clients_then_a_cap_and_everyone_else_is_served(short_home: Any) -> None:
    from tests.core.chat.bridge import start_bridge, stop_bridge

    b = start_bridge(short_home, max_clients=1000)
    ctx = zmq.Context()
    clients: list[ChatClient] = []
    try:
        for _ in range(1000):
            c = ChatClient.local(b.home)
            c.send(p.Ping())
            clients.append(c)
        for c in clients:
            assert collect(c, lambda f: f["type"] == "pong")
        assert b.addresses()["zmq_clients"] == 1000
        with b.zmq() as extra:
            extra.send(p.Ping())
            frame = extra.receive(10)
            assert frame is not None and frame["code"] == p.TOO_MANY
        clients[0].send(p.Send(text="one of many", client_msg_id=uuid.uuid4().hex))
        assert collect(clients[0], finished)[-1]["text"] == "echo: one of many"
    finally:
        for c in clients:
            c.close()
        ctx.term()
        stop_bridge(b)


def test_first_boot_logs_where_the_token_is_never_the_token(
    short_home: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.core.chat.bridge import start_bridge, stop_bridge

    with caplog.at_level(logging.INFO, logger="chalie.chat"):
        b = start_bridge(short_home)
    try:
        records = [r for r in caplog.records if "first-token" in str(getattr(r, "path", ""))]
        assert records and getattr(records[0], "path", None) == str(b.home / "first-token")
        assert all(b.token not in r.getMessage() for r in caplog.records)
        assert all(b.token not in str(vars(r)) for r in caplog.records)
    finally:
        stop_bridge(b)
    # The next start finds a token and writes nothing.
    (short_home / "first-token").unlink()
    b = start_bridge(short_home)
    stop_bridge(b)
    assert not (short_home / "first-token").exists() and b.token == ""


def test_with_the_conversations_service_down_a_send_is_refused_unavailable_not_lost(
    bridge: Bridge,
) -> None:
    with bridge.zmq() as c:
        c.send(p.Send(text="before", client_msg_id="m1", id="r1"))
        collect(c, finished)
        bridge.convs.stop()  # the service is gone (a restart, as the bridge sees it)
        c.send(p.Send(text="while down", client_msg_id="m2", id="r2"))
        rejected = collect(c, lambda f: f["type"] == "rejected")[-1]
        assert rejected["id"] == "r2" and rejected["code"] == p.UNAVAILABLE
        assert "conversations" in rejected["message"]
        c.send(p.Cancel(conversation_id="c1", id="r3"))  # the session itself still serves
        again = collect(c, lambda f: f["type"] == "rejected")[-1]
        assert again["id"] == "r3" and again["code"] == p.UNAVAILABLE

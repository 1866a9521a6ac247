"""ZeroMQ chat over TCP: only with CURVE, and only for the configured client keys."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from chalie.gate.tokens import TokenStore
from chalie.process.config import Config, ConfigError
from tests.core.chat.bridge import collect, start_bridge, stop_bridge


def keys(where: Path, name: str) -> tuple[bytes, bytes]:
    _public_file, secret_file = zmq.auth.create_certificates(str(where), name)
    public, secret = zmq.auth.load_certificate(secret_file)
    assert secret is not None
    return public, secret


def handshake(client: ChatClient, timeout: float = 60.0, *, silence_is: int | None = None) -> int:
    """The first handshake event the client's socket reports (``silence_is`` when none came
    within ``timeout`` and silence is an answer; else AssertionError)."""
    monitor = client.sock.get_monitor_socket(
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    )
    try:
        client.send(p.Ping())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if monitor.poll(100):
                event: int = recv_monitor_message(monitor)["event"]
                return event
        if silence_is is not None:
            return silence_is
        raise AssertionError("no handshake event")
    finally:
        client.sock.disable_monitor()
        monitor.close(0)


def test_tcp_without_curve_keys_is_refused_by_the_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no TCP without CURVE"):
        Config.from_mapping({"chat": {"zmq_tcp": "tcp://127.0.0.1:9999"}}, home=tmp_path)


def test_only_an_authorized_curve_key_gets_in(short_home: Path, tmp_path: Path) -> None:
    server_public, _ = keys(tmp_path, "server")
    good_public, good_secret = keys(tmp_path, "good")
    bad_public, bad_secret = keys(tmp_path, "bad")
    b = start_bridge(
        short_home,
        zmq_tcp="tcp://127.0.0.1:*",
        curve_secret_key_file=str(tmp_path / "server.key_secret"),
        curve_authorized_keys=[good_public.decode()],
    )
    try:
        endpoint = b.addresses()["zmq_tcp"]
        assert endpoint.startswith("tcp://127.0.0.1:")
        with ChatClient(endpoint, curve=(server_public, good_public, good_secret)) as good:
            good.send(p.Send(text="over tcp", client_msg_id="t1"))
            frames = collect(good, lambda f: f["type"] == "turn_finished")
            assert frames[-1]["text"] == "echo: over tcp"
        with ChatClient(endpoint, curve=(server_public, bad_public, bad_secret)) as bad:
            assert handshake(bad) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        with ChatClient(endpoint) as plain:
            # A client without CURVE never completes a handshake: libzmq reports a failure,
            # or nothing at all when it failed before the monitor was attached (often, even
            # on a quiet machine); the session count below is what proves it never got in.
            quiet = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            assert handshake(plain, 2.0, silence_is=quiet) != zmq.EVENT_HANDSHAKE_SUCCEEDED
        # Only the good one ever had a session (a closed client may already be forgotten).
        assert b.addresses()["zmq_sessions_opened"] == 1
    finally:
        stop_bridge(b)


def test_a_hello_with_a_token_is_checked_like_the_websocket(
    short_home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Over CURVE TCP (and the ipc socket), a client that says who it is with a token is
    held to it: an agent's token gets a ``forbidden`` refusal frame and no session, for
    every frame of that connection; a bad token ``unauthorized``; an owner's token chats.
    The refusal is logged with the token's id, never its secret."""
    server_public, _ = keys(tmp_path, "server")
    good_public, good_secret = keys(tmp_path, "good")
    b = start_bridge(
        short_home,
        zmq_tcp="tcp://127.0.0.1:*",
        curve_secret_key_file=str(tmp_path / "server.key_secret"),
        curve_authorized_keys=[good_public.decode()],
    )
    store = TokenStore(short_home / "chalie.db")
    agent, owner = store.create("agent1"), store.create("me", scope="owner")
    agent_id = next(t.id for t in store.list() if t.name == "agent1")
    store.close()
    curve = (server_public, good_public, good_secret)
    try:
        endpoint = b.addresses()["zmq_tcp"]
        with caplog.at_level(logging.INFO, logger="chalie.chat"):
            for connect in (lambda: ChatClient(endpoint, curve=curve), b.zmq):
                with connect() as client:
                    client.send(p.Authenticate(token=agent))
                    refused = collect(client, lambda f: f["type"] == "rejected")[-1]
                    assert refused["code"] == p.FORBIDDEN and "agent token" in refused["message"]
                    client.send(p.Send(text="let me in", client_msg_id="a1"))
                    again = collect(client, lambda f: f["type"] == "rejected")[-1]
                    assert again["code"] == p.FORBIDDEN
            with ChatClient(endpoint, curve=curve) as bogus:
                bogus.send(p.Authenticate(token="chalie_" + "x" * 40))
                refused = collect(bogus, lambda f: f["type"] == "rejected")[-1]
                assert refused["code"] == p.UNAUTHORIZED
            assert b.addresses()["zmq_sessions_opened"] == 0
            with ChatClient(endpoint, curve=curve) as me:
                me.send(p.Authenticate(token=owner))
                assert collect(me, lambda f: f["type"] == "hello")[-1]["type"] == "hello"
                me.send(p.Send(text="as the owner", client_msg_id="o1"))
                frames = collect(me, lambda f: f["type"] == "turn_finished")
                assert frames[-1]["text"] == "echo: as the owner"
            with ChatClient(endpoint, curve=curve) as plain:  # no hello: the CURVE key's owner
                plain.send(p.Send(text="by key", client_msg_id="k1"))
                assert collect(plain, lambda f: f["type"] == "turn_finished")
        forbidden = [r for r in caplog.records if "not an owner's" in r.getMessage()]
        assert len(forbidden) == 2 and all(
            getattr(r, "token_id", "") == agent_id for r in forbidden
        )
        assert all(agent not in str(vars(r)) and owner not in str(vars(r)) for r in caplog.records)
    finally:
        stop_bridge(b)

"""ZeroMQ chat over TCP: only with CURVE, and only for the configured client keys."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from chalie.config import Config, ConfigError
from tests.core.chat.conftest import collect, start_bridge, stop_bridge


def keys(where: Path, name: str) -> tuple[bytes, bytes]:
    _public_file, secret_file = zmq.auth.create_certificates(str(where), name)
    public, secret = zmq.auth.load_certificate(secret_file)
    assert secret is not None
    return public, secret


def handshake(client: ChatClient, timeout: float = 60.0) -> int:
    """The first handshake event the client's socket reports."""
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
            assert handshake(plain) != zmq.EVENT_HANDSHAKE_SUCCEEDED
        # Only the good one ever had a session (a closed client may already be forgotten).
        assert b.addresses()["zmq_sessions_opened"] == 1
    finally:
        stop_bridge(b)

"""McpServerActor under a supervisor: serves, restarts after a crash; a port in use is one line."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pykka
import pytest

from actors.loop import EventLoopThread
from actors.mcp.server import McpServerActor
from actors.process.supervisor import Supervisor
from chalie.gate.tokens import TokenStore
from chalie.process.config import McpServerConfig
from chalie.process.supervision import ChildSpec
from tests.conversations_double import DoublePort
from tests.core.mcp_server.doubles import FakeDesk
from tools.waiting import wait_until


@contextlib.contextmanager
def tree(tmp_path: Path, **config: Any) -> Iterator[pykka.ActorRef[Supervisor]]:
    loop = EventLoopThread("mcp-actor-test")
    loop.start()
    db = tmp_path / "chalie.db"
    store = TokenStore(db)
    cfg = McpServerConfig(**{"port": 0, **config})
    convs = DoublePort()

    def start() -> pykka.ActorRef[Any]:
        return McpServerActor.start(cfg, loop, db, convs.port, lambda: store, FakeDesk(humans=0))

    sup = Supervisor.start([ChildSpec("mcp_server", start)], backoff_base=0.01)
    try:
        yield sup
    finally:
        sup.stop(block=True, timeout=20)
        convs.stop()
        loop.stop()
        store.close()


def child_status(sup: pykka.ActorRef[Supervisor]) -> dict[str, Any]:
    ref = sup.proxy().child("mcp_server").get(timeout=5)
    result: dict[str, Any] = ref.proxy().status().get(timeout=5)
    return result


def restarts(sup: pykka.ActorRef[Supervisor]) -> int:
    status = sup.proxy().status().get(timeout=5)
    return int(next(c for c in status["children"] if c["id"] == "mcp_server")["restarts"])


def test_the_actor_serves_and_reports_its_url(tmp_path: Path) -> None:
    with tree(tmp_path) as sup:
        status = child_status(sup)
        assert status["state"] == "serving"
        assert status["url"].startswith("http://127.0.0.1:") and status["url"].endswith("/mcp")
        resp = httpx2.post(status["url"], json={})
        assert resp.status_code == 401
        assert child_status(sup)["requests"]["unauthorized"] == 1


def test_a_port_in_use_is_one_line_and_no_restart_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with caplog.at_level(logging.ERROR, logger="chalie.mcp_server"):
            with tree(tmp_path, port=port) as sup:
                status = child_status(sup)
                assert status["state"].startswith("not started")
                assert f"127.0.0.1:{port} is already in use" in status["state"]
                assert restarts(sup) == 0
        lines = [r.getMessage() for r in caplog.records if r.name == "chalie.mcp_server"]
        assert len(lines) == 1 and "already in use" in lines[0]
    finally:
        taken.close()


def test_a_remote_bind_without_allow_remote_is_refused(tmp_path: Path) -> None:
    with tree(tmp_path, host="0.0.0.0") as sup:
        assert "allow_remote" in child_status(sup)["state"]


def test_a_remote_bind_with_allow_remote_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="chalie.mcp_server"):
        with tree(tmp_path, host="0.0.0.0", allow_remote=True) as sup:
            assert child_status(sup)["state"] == "serving"
    assert any("beyond loopback" in r.getMessage() for r in caplog.records)


def test_disabled_means_no_listener(tmp_path: Path) -> None:
    with tree(tmp_path, enabled=False) as sup:
        assert child_status(sup) == {"state": "disabled", "url": None}


def test_a_server_that_dies_is_restarted_by_the_supervisor(tmp_path: Path) -> None:
    with tree(tmp_path) as sup:
        first = sup.proxy().child("mcp_server").get(timeout=5)
        server = first.proxy().server.get(timeout=5)
        loop = first.proxy().loop.get(timeout=5)
        loop.call_soon(server.done.cancel)  # uvicorn's task ends without a stop
        wait_until(lambda: restarts(sup) == 1)
        wait_until(lambda: child_status(sup)["state"] == "serving")
        url = child_status(sup)["url"]
        assert httpx2.post(url, json={}).status_code == 401

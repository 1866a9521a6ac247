"""The connection flood held: half-open TCP connections on both listeners, then control and chat.

Starts a real ``chalie run`` under a 1,024-descriptor limit (as the probe
did), opens N half-open connections (a TCP connect, no byte sent) to the chat
WebSocket port and N to the MCP port, then measures, with the flood still
open: a control round trip (``status``), a WebSocket chat client's hello and
ping round trip (a new connection with the owner token), and an MCP
``initialize``. Before the fix the daemon aborted in libzmq (``Too many open
files``) at the first control request. Prints each figure beside its floor
and the ratio; also how many connections the daemon held.

Run: python tools/bench/bench_flood.py [--connections 1000] [--limit 1024]

One run (2 cpus, python 3.11.7, 2026-12-01, a shared machine)::

    daemon alive after the flood: True; descriptors it held then: {'fds': 838, 'sockets': 775}
    MCP listener under the flood answered HTTP 401 (401: the gate)
    control round trip (status): quiet p50 1.8 ms; under the flood p50 2.7 ms, max 22.0 ms;
        floor 100 ms, ratio 0.22
    chat: WebSocket connect + hello + ping: quiet p50 10.6 ms; under the flood p50 4.6 ms,
        max 15.2 ms; floor 100 ms, ratio 0.15

Before the fix, the same flood made the daemon exit -6 (libzmq: ``Too many open
files (src/ipc_listener.cpp:297)``) at the first control request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chalie.process import control

FLOOR_MS = 100.0  # the figure: control and chat answer in under 100 ms


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Daemon:
    home: Path
    proc: subprocess.Popen[bytes]
    chat_port: int
    mcp_port: int
    token: str
    log: Path

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@contextlib.contextmanager
def daemon(limit: int, *, request_timeout: float = 10.0) -> Iterator[Daemon]:
    home = Path(tempfile.mkdtemp(prefix="chf-", dir="/tmp"))
    chat_port, mcp_port = free_port(), free_port()
    (home / "config.toml").write_text(
        "workers = 1\n"
        f"[chat]\nport = {chat_port}\nrequest_timeout = {request_timeout}\n"
        f"[mcp_server]\nport = {mcp_port}\nrequest_timeout = {request_timeout}\n"
    )
    log = home / "daemon.log"

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chalie", "--home", str(home), "run"],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=limited,
        )
    try:
        client = control.ControlClient(home, timeout=2)
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not start: {log.read_text()[-2000:]}")
            try:
                reply = client.call("status")
                if reply.ok and all(c["alive"] for c in reply.data["actors"]):
                    break
            except control.DaemonNotRunning:
                pass
            time.sleep(0.05)
        client.close()
        token = (home / "first-token").read_text().strip()
        yield Daemon(home, proc, chat_port, mcp_port, token, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(home, ignore_errors=True)


def half_open(port: int, n: int) -> list[socket.socket]:
    """n TCP connections that never send a byte."""
    socks: list[socket.socket] = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        socks.append(s)
    return socks


def control_rtt(home: Path) -> float:
    client = control.ControlClient(home, timeout=10)
    try:
        began = time.perf_counter()
        reply = client.call("status")
        took = (time.perf_counter() - began) * 1000
        assert reply.ok, reply
        return took
    finally:
        client.close()


def chat_rtt(port: int, token: str) -> float:
    """Connect a WebSocket chat client, wait for hello, ping: the whole time, in ms."""
    from websockets.asyncio.client import connect

    async def go() -> float:
        began = time.perf_counter()
        async with connect(
            f"ws://127.0.0.1:{port}/chat",
            additional_headers={"Authorization": f"Bearer {token}"},
            open_timeout=10,
        ) as ws:
            assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "hello"
            await ws.send(json.dumps({"type": "ping", "id": "p"}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "pong"
        return (time.perf_counter() - began) * 1000

    return asyncio.run(go())


def mcp_status(port: int) -> int:
    """An MCP initialize without a token: the gate's 401 proves the listener answers."""
    import httpx

    with httpx.Client(timeout=10) as http:
        return http.post(f"http://127.0.0.1:{port}/mcp", json={}).status_code


@dataclass
class Figures:
    held: dict[str, Any] = field(default_factory=dict)
    control_ms: list[float] = field(default_factory=list)
    chat_ms: list[float] = field(default_factory=list)
    mcp_status: int = 0
    alive: bool = False


def flood_and_probe(d: Daemon, connections: int, probes: int = 5) -> Figures:
    out = Figures()
    flood = half_open(d.chat_port, connections) + half_open(d.mcp_port, connections)
    try:
        time.sleep(0.5)  # let the daemon accept what it will
        for _ in range(probes):
            out.control_ms.append(control_rtt(d.home))
            out.chat_ms.append(chat_rtt(d.chat_port, d.token))
        out.mcp_status = mcp_status(d.mcp_port)
        out.held = held_by(d.proc.pid)
        out.alive = d.alive
    finally:
        for s in flood:
            s.close()
    return out


def held_by(pid: int) -> dict[str, Any]:
    """The daemon's open descriptors (what /proc says), and its TCP sockets among them."""
    fds = list(Path(f"/proc/{pid}/fd").iterdir())
    sockets = 0
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd).startswith("socket:"):
                sockets += 1
    return {"fds": len(fds), "sockets": sockets}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--limit", type=int, default=1024)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the flooder needs its own room
    with daemon(args.limit) as d:
        base = Figures(
            control_ms=[control_rtt(d.home) for _ in range(5)],
            chat_ms=[chat_rtt(d.chat_port, d.token) for _ in range(5)],
        )
        f = flood_and_probe(d, args.connections)
    print(f"machine: {os.cpu_count()} cpus, python {sys.version.split()[0]}")
    print(
        f"daemon under RLIMIT_NOFILE {args.limit}; flood: {args.connections} half-open "
        f"connections to the chat port and {args.connections} to the MCP port"
    )
    print(f"daemon alive after the flood: {f.alive}; descriptors it held then: {f.held}")
    print(f"MCP listener under the flood answered HTTP {f.mcp_status} (401: the gate)")
    for label, quiet, loud in (
        ("control round trip (status)", base.control_ms, f.control_ms),
        ("chat: WebSocket connect + hello + ping", base.chat_ms, f.chat_ms),
    ):
        worst = max(loud)
        print(
            f"{label}: quiet p50 {statistics.median(quiet):.1f} ms; under the flood "
            f"p50 {statistics.median(loud):.1f} ms, max {worst:.1f} ms; "
            f"floor {FLOOR_MS:.0f} ms, ratio {worst / FLOOR_MS:.2f}"
        )
    del soft


if __name__ == "__main__":
    main()

"""Chat bridge figures: a WebSocket message to its first event, with an instant scripted model.

The daemon runs in this process (real supervisor tree, Conversations, TurnActor,
SQLite file, chat bridge on uvicorn/wsproto); the scripted model runs in its
own process on loopback; the WebSocket client (``websockets``) runs here in
its own asyncio loop. For each message, sequentially on one conversation:

- ``accepted``: from ``ws.send`` to the ``accepted`` reply;
- ``first event``: from ``ws.send`` to the first conversation event
  (``turn_started``, stored and published by the TurnActor). Floor: p50 <= 5 ms;
- ``whole turn``: to ``turn_finished`` (includes one model request).

The same over the ZeroMQ bridge (``chalie chat``'s transport) for comparison.
Then ``--idle N`` WebSocket and N ZeroMQ clients, held open by another
process, each having said hello: the daemon's RSS growth (memory bound).

Run: ``python tools/bench/bench_chat.py [--messages N] [--idle N]``

Measured here (2 shared vCPUs, other helpers' suites running; noisy):
WebSocket message -> first event p50 2.2-3.7 ms (floor 5), -> accepted p50
3.0-4.2 ms, -> turn finished p50 11-13 ms; ZeroMQ ipc first event p50
2.1-2.4 ms; 1,000 WebSocket + 1,000 ZeroMQ idle clients: daemon RSS
+75 MB (WebSocket ~37 KB a connection without permessage-deflate, ~160 KB
with it; ZeroMQ ~40 KB a client).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from actors.conversation.chat_bridge import ChatBridge
from actors.gate.policy import PolicyActor
from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from chalie.gate.tokens import FIRST_TOKEN_FILE
from chalie.process.config import Config
from chalie_app import root as daemon
from chalie_app.root import Runtime
from tools.bench.bench_turns import start_model

FLOOR_FIRST_EVENT_MS = 5.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def line(name: str, values: list[float], floor: float | None = None) -> str:
    p50 = statistics.median(values)
    text = f"{name:<28} p50 {p50:7.2f} ms   p90 {pct(values, 0.9):7.2f} ms   n={len(values)}"
    if floor is not None:
        text += f"   (floor p50 <= {floor:g} ms: {'ok' if p50 <= floor else 'MISSED'})"
    return text


async def websocket_run(url: str, token: str, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"accepted": [], "first": [], "turn": []}
    cid: str | None = None
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        json.loads(await ws.recv())  # hello
        for i in range(n + 5):
            frame: dict[str, Any] = {"type": "send", "text": f"hello {i}", "client_msg_id": f"b{i}"}
            if cid is not None:
                frame["conversation_id"] = cid
            t0 = time.perf_counter()
            await ws.send(json.dumps(frame))
            marks: dict[str, float] = {}
            while "turn" not in marks or "accepted" not in marks:
                got = json.loads(await ws.recv())
                now = time.perf_counter()
                kind = got["type"]
                if kind == "accepted" and got["client_msg_id"] == f"b{i}":
                    marks["accepted"] = now
                    cid = got["conversation_id"]
                elif kind == "turn_started" and "first" not in marks:
                    marks["first"] = now
                elif kind == "turn_finished":
                    marks["turn"] = now
                elif kind == "rejected":
                    raise RuntimeError(got)
            if i >= 5:  # warm-up excluded
                for k, t in marks.items():
                    out[k].append((t - t0) * 1000)
    return out


def zmq_run(home: Path, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"accepted": [], "first": [], "turn": []}
    cid: str | None = None
    with ChatClient.local(home) as c:
        for i in range(n + 5):
            t0 = time.perf_counter()
            c.send(p.Send(conversation_id=cid, text=f"hi {i}", client_msg_id=f"z{i}"))
            marks: dict[str, float] = {}
            while "turn" not in marks or "accepted" not in marks:
                got = c.receive(30)
                now = time.perf_counter()
                assert got is not None
                if got["type"] == "accepted" and got["client_msg_id"] == f"z{i}":
                    marks["accepted"] = now
                    cid = got["conversation_id"]
                elif got["type"] == "turn_started" and "first" not in marks:
                    marks["first"] = now
                elif got["type"] == "turn_finished":
                    marks["turn"] = now
            if i >= 5:
                for k, t in marks.items():
                    out[k].append((t - t0) * 1000)
    return out


IDLE_CLIENTS = r"""
import asyncio, sys
from websockets.asyncio.client import connect
from chalie.chat import protocol as p
from chalie.chat.client import ChatClient
from pathlib import Path

async def main(url, token, home, n):
    held = []
    for _ in range(int(sys.argv[5]) // 100):
        batch = await asyncio.gather(
            *(connect(url, additional_headers={"Authorization": "Bearer " + token})
              for _ in range(100))
        )
        for ws in batch:
            await ws.recv()
        held += batch
    zs = []
    for _ in range(int(sys.argv[6])):
        c = ChatClient.local(Path(home))
        c.send(p.Ping())
        zs.append(c)
    for c in zs:
        while c.receive(30)["type"] != "pong":
            pass
    print("ready", flush=True)
    sys.stdin.readline()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
"""


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def idle_clients(ws_url: str, token: str, home: Path, n: int, rt: Runtime) -> str:
    before = rss_mb()
    proc = subprocess.Popen(
        [sys.executable, "-c", IDLE_CLIENTS, ws_url, token, str(home), str(n), str(n), str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        counts = rt.child("chat", ChatBridge).within(10).call(ChatBridge.addresses)
        after = rss_mb()
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return (
        f"{counts['websocket_clients']} WebSocket + {counts['zmq_clients']} ZeroMQ idle clients:"
        f" daemon RSS +{after - before:.1f} MB ({before:.0f} -> {after:.0f} MB)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--idle", type=int, default=1000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bchat-", dir="/tmp"))
    model, url = start_model(work)
    home = work / "h"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(
        f'[models.default]\nbase_url = "{url}/v1"\nmodel = "scripted"\n[chat]\nport = 0\n'
    )
    # The bench_turns script answers with one tool call, then text: pin the calculator.
    with (home / "config.toml").open("a") as f:
        f.write('[channels.chat]\npinned = ["calculator"]\n')
    ready = threading.Event()
    box: dict[str, Runtime] = {}

    def on_ready(rt: Runtime) -> None:
        box["rt"] = rt
        ready.set()

    thread = threading.Thread(
        target=daemon.run, args=(Config.load(home),), kwargs={"ready": on_ready}, daemon=True
    )
    thread.start()
    try:
        assert ready.wait(120), "the daemon did not start"
        rt = box["rt"]
        while not rt.child("chat", ChatBridge).is_alive():  # children start after ready
            time.sleep(0.01)
        rt.child("policy", PolicyActor).within(10).call(
            PolicyActor.set, "chat", "calculator", "allow"
        )
        ws_url = rt.child("chat", ChatBridge).within(10).call(ChatBridge.addresses)["websocket"]
        token = (home / FIRST_TOKEN_FILE).read_text().strip()
        ws = asyncio.run(websocket_run(ws_url, token, args.messages))
        zq = zmq_run(home, args.messages)
        print("WebSocket (JSON):")
        print("  " + line("message -> accepted", ws["accepted"]))
        print("  " + line("message -> first event", ws["first"], FLOOR_FIRST_EVENT_MS))
        print("  " + line("message -> turn finished", ws["turn"]))
        print("ZeroMQ ipc (msgpack):")
        print("  " + line("message -> accepted", zq["accepted"]))
        print("  " + line("message -> first event", zq["first"]))
        print("  " + line("message -> turn finished", zq["turn"]))
        if args.idle:
            print(idle_clients(ws_url, token, home, args.idle, rt))
    finally:
        if "rt" in box:
            box["rt"].request_stop()
        thread.join(60)
        model.terminate()
        model.wait(10)


if __name__ == "__main__":
    main()

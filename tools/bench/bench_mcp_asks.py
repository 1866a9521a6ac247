"""MCP client-capability figures (issue 23), each printed beside its floor.

1. ``sampling``: a server's sampling/createMessage answered by the scripted model
   (tools/fake_llm on loopback), gate allow, through the real dispatcher, policy,
   connection actor and session. The overhead is the median of a sampling tool call
   minus the median of a plain call to the same server minus the median of the same
   model request made directly. Floor: <= 5 ms.
   The overhead is split: Chalie's part (ServerAsks.sample minus the model: the gate,
   decided on the loop from the policy's lock-free view, and the day's budget, known in
   memory) and the rest, the protocol's second tools/call (on 2026-07-28 the server's
   request comes back as input-required and the client sends the call again; the
   server runs it twice).
2. ``progress``: a server sends progress notifications stamped with the wall-clock time;
   the figure is the p50/p99 delay until the ToolProgress event reaches a subscriber
   of the conversation on the event bus (what a chat session's feed is). Floor: <= 20 ms.
3. ``progress to chat``: the same, end to end: a real daemon, a real WebSocket client
   whose turn calls the stamping tool; once with the capable fixture (the mcp SDK's
   stdio server, which writes each message through two worker-thread hops,
   ``anyio.wrap_file``), once with ``tools/fixture_mcp/stamper.py`` (raw JSON-RPC, no
   hop of its own); "after the daemon's stdio reader" is Chalie's part of the delay.
   Floor: <= 20 ms.

Run: ``python tools/bench/bench_mcp_asks.py [--calls 50]``

Measured December 2026 on the shared 2-vCPU machine, other sessions busy (``--calls 40``).
Before issue 23's last session (load ~10): overhead 7.19 ms, progress p99 37 ms. After it
(the gate decided on the loop, the budget known in memory), load 8 to 10:
call+sample 4.75 ms, plain call 1.67 ms, model alone 0.42 ms, overhead 2.66 ms (ratio
0.53), of it Chalie's 0.25 ms and the protocol's second call 2.41 ms. Progress: p50 1.4 to
1.8 ms everywhere; p99 12.9 ms to a WebSocket client at load 8 (ratio 0.64), 88.7 ms at
load 10, with Chalie's part (after the daemon's stdio reader) p99 1.5 to 5.3 ms in every
run and the raw server's end-to-end p99 6.7 to 29 ms: the tail is the time before the
daemon reads the line (the server's own writes, and the host's run queue at a load of 8 to
10 on 2 cores), not batching, a poller or a hop inside Chalie.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from actors.child_ref import ChildRef
from actors.mcp.asks import ServerAsks
from chalie.mcp.spec import ServerSpec
from chalie.process.config import ModelConfig
from chalie.providers.client import ModelClient
from chalie.providers.types import ChatMessage, ModelRequest
from chalie.wire.events import ToolProgress
from chalie.wire.messages import TurnContext
from tools.fake_llm import FakeModelServer, load_script
from tools.fixture_mcp.rig import FAST, ROOT, Rig, capable_config
from tools.waiting import wait_until


def ctx() -> TurnContext:
    return TurnContext(
        conversation_id="bench",
        turn_id="t",
        channel="chat",
        human_present=True,
        scope="unrestricted",
    )


def line(name: str, figure: float, floor: float, unit: str) -> None:
    print(f"{name:<28} {figure:9.2f} {unit}   floor {floor:g} {unit}   ratio {figure / floor:.2f}")


def quantile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


class ReaderStamps:
    """When the daemon's stdio reader took each progress line from the server's pipe
    (our reader's line parser, chalie.mcp.stdio._parse, wrapped for the bench only): splits
    a delay into the server and the pipe's part and Chalie's part."""

    def __init__(self) -> None:
        from chalie.mcp import stdio

        self.seen: dict[str, float] = {}
        self._stdio = stdio
        self._orig = stdio._parse
        pattern = re.compile(rb'"message":\s*"([0-9.]+)"')

        def parse(line: bytes) -> Any:
            if b"notifications/progress" in line:
                found = pattern.search(line)
                if found:
                    self.seen[found.group(1).decode()] = time.time()
            return self._orig(line)

        stdio._parse = parse  # type: ignore[assignment]

    def close(self) -> None:
        self._stdio._parse = self._orig  # type: ignore[assignment]


def progress_to_chat(n: int, fixture: str = "capable") -> tuple[list[float], list[float]]:
    """(delays server send -> WebSocket client, of them the part after the daemon's reader),
    ms: a real daemon in this process, a fixture server over stdio (``capable``: the mcp
    SDK's server; ``stamper``: raw JSON-RPC, no thread hop of its own), a real WebSocket
    client whose turn calls ``_mcp_cap_stamp``."""
    from websockets.asyncio.client import connect

    from actors.conversation.chat_bridge import ChatBridge
    from chalie.gate.tokens import FIRST_TOKEN_FILE
    from chalie_app import root as daemon

    stamp = {"name": "_mcp_cap_stamp", "arguments": {"n": n, "pause": 0.06, "act_summary": "s"}}
    find = {"name": "find_tools", "arguments": {"query": ["_mcp_cap_stamp"], "act_summary": "f"}}
    script = {"steps": [{"tool_calls": [find]}, {"tool_calls": [stamp]}, {"text": "Done."}]}
    model = FakeModelServer(load_script(json.dumps(script))).start()
    stamps = ReaderStamps()
    home = Path(tempfile.mkdtemp(prefix="bma-", dir="/tmp"))
    config = capable_config(model, home, fixture)
    box: dict[str, Any] = {}
    ready = threading.Event()

    def on_ready(rt: Any) -> None:
        box["rt"] = rt
        ready.set()

    thread = threading.Thread(
        target=daemon.run, args=(config,), kwargs={"ready": on_ready}, daemon=True
    )
    logging.disable(logging.WARNING)  # the daemon's lines would drown the figures
    thread.start()
    total: list[float] = []
    after_reader: list[float] = []
    try:
        assert ready.wait(120), "the daemon did not start"
        rt = box["rt"]
        chat = rt.child("chat", ChatBridge).within(10)
        wait_until(chat.is_alive, 60, "the chat child")
        url = chat.call(ChatBridge.addresses)["websocket"]
        token = (home / FIRST_TOKEN_FILE).read_text().strip()
        found = rt.services.discovery
        wait_until(lambda: "_mcp_cap_stamp" in found.find(["_mcp_cap_stamp"]).names, 60, "tool")

        async def go() -> None:
            headers = {"Authorization": f"Bearer {token}"}
            async with connect(url, additional_headers=headers) as ws:
                send = {
                    "type": "send",
                    "channel": "chat-openai",
                    "text": "stamp",
                    "client_msg_id": "b",
                }
                await ws.send(json.dumps(send))
                while True:
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
                    now = time.time()
                    if frame["type"] == "permission_request":
                        rid = frame["request_id"]
                        answer = {"type": "answer", "request_id": rid, "answer": "allow_once"}
                        await ws.send(json.dumps(answer))
                    elif frame["type"] == "tool_progress" and frame.get("message"):
                        sent = float(frame["message"])
                        total.append((now - sent) * 1000)
                        read = stamps.seen.get(frame["message"])
                        if read is not None:
                            after_reader.append((now - read) * 1000)
                    elif frame["type"] == "turn_finished":
                        return

        asyncio.run(go())
    finally:
        if "rt" in box:
            box["rt"].request_stop()
        thread.join(60)
        model.stop()
        stamps.close()
        logging.disable(logging.NOTSET)
    return total, after_reader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    script = {"on_user": {"text": "Valletta", "input_tokens": 10, "output_tokens": 2}}
    model = FakeModelServer(load_script(json.dumps(script))).start()
    with tempfile.TemporaryDirectory() as tmp:
        rig = Rig(Path(tmp))
        try:
            cfg = ModelConfig(base_url=model.url + "/v1", model="scripted", retries=0, stream=False)
            asks = ServerAsks(
                FAST, rig.db, ChildRef.to(rig.policy, "policy"), rig.bus, {"default": cfg}
            )
            rig.deps.asks = asks
            answered: list[float] = []  # how long ServerAsks.sample took (the model within)
            sample = asks.sample

            async def timed_sample(*a: Any, **k: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await sample(*a, **k)
                finally:
                    answered.append((time.perf_counter() - started) * 1000)

            asks.sample = timed_sample  # type: ignore[method-assign]
            rig.add(
                ServerSpec(
                    name="cap",
                    transport="stdio",
                    command=sys.executable,
                    args=("-m", "tools.fixture_mcp.capable"),
                    cwd=str(ROOT),
                    sampling_tokens=100_000_000,
                )
            )
            rig.start()
            rig.wait_tools("cap", 6, 60)
            rig.allow("_mcp_cap_*")
            rig.allow("_mcp_cap.sampling")

            def timed(tool: str, params: dict[str, Any]) -> float:
                started = time.perf_counter()
                out = rig.run(tool, params, context=ctx())
                assert out.status == "success", out.envelope
                return (time.perf_counter() - started) * 1000

            direct = ModelClient("default", cfg)
            request = ModelRequest(
                system="s", messages=(ChatMessage(role="user", text="q?"),), max_tokens=64
            )

            async def model_once() -> float:
                started = time.perf_counter()
                await direct.complete(request, lambda _d: None)
                return (time.perf_counter() - started) * 1000

            for _ in range(5):  # warm up every path
                timed("_mcp_cap_think", {"question": "q?"})
                timed("_mcp_cap_count", {"n": 0})
                rig.loop.submit(model_once()).result(10)
            answered.clear()
            sampled, plain, bare = [], [], []
            for _ in range(args.calls):
                sampled.append(timed("_mcp_cap_think", {"question": "q?"}))
                plain.append(timed("_mcp_cap_count", {"n": 0}))
                bare.append(rig.loop.submit(model_once()).result(10))
            rig.loop.submit(direct.aclose()).result(5)
            s, p, m = (statistics.median(x) for x in (sampled, plain, bare))
            print(
                f"sampling: call+sample {s:.2f} ms, plain call {p:.2f} ms, model alone {m:.2f} ms"
            )
            ours = statistics.median(answered) - m
            print(
                f"  of the overhead: gate, budget, request and answer {ours:.2f} ms; the rest,"
                f" {s - p - m - ours:.2f} ms, is the protocol's second tools/call (2026-07-28:"
                " the server's request comes back as input-required and the call is sent again)"
            )
            line("sampling overhead", s - p - m, 5.0, "ms")

            delays: list[float] = []
            after_reader: list[float] = []
            lock = threading.Lock()
            stamps = ReaderStamps()

            def keep(event: Any) -> None:
                if isinstance(event, ToolProgress) and event.message:
                    now = time.time()
                    read = stamps.seen.get(event.message)
                    with lock:
                        delays.append((now - float(event.message)) * 1000)
                        if read is not None:
                            after_reader.append((now - read) * 1000)

            sub = rig.bus.subscribe("bench", keep)
            n = max(20, args.calls * 2)
            try:
                timed("_mcp_cap_stamp", {"n": n, "pause": 0.06})  # under the 20/s flood cap
                wait_until(lambda: len(delays) >= n, 10, "progress events")
            finally:
                sub.close()
                stamps.close()
            p50, p99 = quantile(delays, 0.5), quantile(delays, 0.99)
            print(
                f"progress: {len(delays)} events, p50 {p50:.2f} ms, p99 {p99:.2f} ms;"
                f" after the daemon's stdio reader p50 {quantile(after_reader, 0.5):.2f} ms,"
                f" p99 {quantile(after_reader, 0.99):.2f} ms"
            )
            line("progress delay p99", p99, 20.0, "ms")
        finally:
            rig.close()
            model.stop()
    figures = {}
    for fixture in ("capable", "stamper"):
        total, after = progress_to_chat(max(40, args.calls * 2), fixture)
        figures[fixture] = total
        print(
            f"progress to a WebSocket client ({fixture}): {len(total)} events,"
            f" p50 {quantile(total, 0.5):.2f} ms, p99 {quantile(total, 0.99):.2f} ms;"
            f" after the daemon's stdio reader p50 {quantile(after, 0.5):.2f} ms,"
            f" p99 {quantile(after, 0.99):.2f} ms"
        )
    line("progress to chat p99", quantile(figures["capable"], 0.99), 20.0, "ms")
    line("  (raw server) p99", quantile(figures["stamper"], 0.99), 20.0, "ms")


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()

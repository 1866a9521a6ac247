"""Inbound MCP under load: N concurrent agents calling talk_to_chalie, then an auth-rejection flood.

Starts a real ``chalie run`` (its own process) on a temporary data directory,
with a scripted model (``tools.fake_llm``, its own process) that answers
every turn instantly with one calculator call and then a final answer. The
agents are official mcp SDK clients in this process, one token each.

Prints, beside their floors (issue 11): calls/s, errors, p50/p99 latency,
the daemon's RSS at start, after warm-up and at the end; then 401s/s for a
flood of requests with unknown tokens, and proof that no turn started.

The calculator is pinned for the external_agent channel so each turn's tool
call really runs; the calculator's trail rows are printed by status.

Run: python tools/bench/bench_mcp_server.py [--agents 100] [--seconds 60] [--mode auto]
[--gateway]. With ``--gateway`` (gateway mode, tokens created with the permission) each
agent calls find_tools once, then the calculator directly, over and over: no turn, no
model; the talk_to_chalie floor does not apply to it.

Measured on a quiet 2-vCPU machine (December 2026, defaults): mode=auto 216-218 calls/s,
0 errors, p50 ~430 ms, p99 ~830 ms, 3.7-3.8 ms of daemon CPU a call at 0.81 cores, RSS
flat (489 -> 498 MB); 401s ~29,800/s with no turn started. mode=legacy (2025-11-25
stateful sessions, SSE answers): 160-178 calls/s (BELOW the floor; the SDK's stateful
transport costs ~1 ms more a call).

Third session, a host that was slower for hours and then quiet: mode=auto 149-209 calls/s
over nine runs while it was slow (5.6-3.9 ms of daemon CPU a call); interleaved with the
previous session's commit then, 167-176 (old) vs 168-170 (new): the host, not the code,
moved. After the session's last changes (a step's tail of text stored with its answer,
channels and token estimates kept in memory), interleaved with the commit before them:
204.4 / 210.1 vs 191.2 / 207.3, then 231.6 / 216.2 vs 226.4 / 199.9; final run 220.8
calls/s, 3.7 ms a call, p99 815 ms. 401s 27,900-30,300/s. legacy 155-165.
--gateway: 764-840 calls/s, 0 errors, 1.0-1.1 ms of daemon CPU a call, p99 249-274 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp.client import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from chalie.gate.tokens import TokenStore  # noqa: E402

CHALIE = (sys.executable, "-m", "chalie")
# The daemon, the model and the CLI find this checkout even where it is not installed.
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}
FLOOR_CALLS = 200.0
FLOOR_REJECTIONS = 2000.0
SCRIPT = {
    "on_user": {
        "tool_calls": [
            {"name": "calculator", "arguments": {"expression": "2+2", "act_summary": "adding"}}
        ]
    },
    "on_tool": {"text": "2+2 is 4."},
}
ARGS = {"message": "what is 2+2?", "project_or_task_name": "bench"}
# Gateway mode: each agent finds the calculator once, then calls it directly.
FIND = {"query": ["calculator"], "act_summary": "looking for arithmetic"}
ADD = {"expression": "2+2", "act_summary": "adding"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_model(home: Path) -> tuple[subprocess.Popen[str], str]:
    script = home / "script.json"
    script.write_text(json.dumps(SCRIPT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.fake_llm", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=ENV,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, line.rsplit(" ", 1)[-1].strip()


def start_daemon(
    home: Path, model_url: str, agents: int, gateway: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    (home / "config.toml").write_text(
        f"[mcp_server]\nport = {port}\nmax_concurrent_turns = 4\n"
        f"gateway = {'true' if gateway else 'false'}\n"
        "requests_per_minute = 1000000\nmax_sessions = 10000\n"
        f'[models.default]\nprovider = "openai"\nbase_url = "{model_url}/v1"\n'
        'model = "scripted"\nstream = true\n'
        # The scripted model calls the calculator straight away: pinned, so the turn may.
        '[channels.external_agent]\npinned = ["calculator"]\n'
    )
    proc = subprocess.Popen(
        [*CHALIE, "--home", str(home), "run"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx2.post(url, json={}, timeout=2).status_code == 401:
                break
        except httpx2.TransportError:
            time.sleep(0.1)
    else:
        raise SystemExit("the daemon's MCP server did not come up")
    subprocess.run(
        [*CHALIE, "--home", str(home), "policy", "set", "external_agent", "calculator", "allow"],
        check=True,
        stdout=subprocess.DEVNULL,
        env=ENV,
    )
    return proc, url


async def agent(
    url: str,
    secret: str,
    name: str,
    mode: str,
    warm_until: float,
    until: float,
    out: dict[str, Any],
    per_conversation: int,
    gateway: bool = False,
) -> None:
    headers = {"Authorization": f"Bearer {secret}"}
    conversation: str | None = None
    made = 0
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode) as client:  # type: ignore[arg-type]
            if gateway:
                found = await client.call_tool("find_tools", FIND)
                if found.is_error:
                    out["samples"].append(f"find_tools failed: {str(found.content)[:160]}")
            while (now := time.time()) < until:
                phase = "warm" if now < warm_until else "run"
                began = time.perf_counter()
                result = None
                args: dict[str, Any] = {**ARGS, "agent_name": name}
                if conversation is not None and made % per_conversation:
                    args["conversation_id"] = conversation
                made += 1
                try:
                    if gateway:
                        result = await client.call_tool("calculator", ADD)
                        text = " ".join(getattr(c, "text", "") for c in result.content)
                        ok = not result.is_error and "4" in text
                    else:
                        result = await client.call_tool("talk_to_chalie", args)
                        ok = not result.is_error and "4" in result.structured_content["answer"]
                        conversation = result.structured_content.get("conversation_id")
                except Exception as exc:
                    ok = False
                    out["samples"].append(repr(exc)[:200])
                if ok:
                    if phase == "run":
                        out["latencies"].append(time.perf_counter() - began)
                else:
                    out[f"{phase}_errors"] += 1
                    if result is not None and len(out["samples"]) < 5:
                        out["samples"].append(str(result.content)[:200])


def client_process(
    url: str,
    secrets: list[str],
    first: int,
    mode: str,
    warm_until: float,
    until: float,
    per_conversation: int,
    gateway: bool = False,
) -> dict[str, Any]:
    """One load process: its share of the agents, each with its own token and session."""
    out: dict[str, Any] = {"latencies": [], "warm_errors": 0, "run_errors": 0, "samples": []}
    cpu_began = time.process_time()

    async def run() -> None:
        await asyncio.gather(
            *(
                agent(
                    url,
                    s,
                    f"agent-{first + i}",
                    mode,
                    warm_until,
                    until,
                    out,
                    per_conversation,
                    gateway,
                )
                for i, s in enumerate(secrets)
            )
        )

    asyncio.run(run())
    out["cpu"] = time.process_time() - cpu_began
    return out


def load(
    url: str,
    secrets: list[str],
    mode: str,
    seconds: float,
    pid: int,
    procs: int,
    model_pid: int,
    per_conversation: int,
    gateway: bool = False,
) -> dict[str, Any]:
    warm = min(5.0, max(1.0, seconds / 3))
    warm_until = time.time() + 3.0 + warm  # 3 s for the load processes to start
    until = warm_until + seconds
    share = -(-len(secrets) // procs)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(procs) as pool:
        parts = [
            pool.apply_async(
                client_process,
                (
                    url,
                    secrets[i : i + share],
                    i,
                    mode,
                    warm_until,
                    until,
                    per_conversation,
                    gateway,
                ),
            )
            for i in range(0, len(secrets), share)
        ]
        while time.time() < warm_until:
            time.sleep(0.05)
        out: dict[str, Any] = {"rss_warm": rss_mb(pid), "rss": []}
        cpu_began, model_began = cpu_seconds(pid), cpu_seconds(model_pid)
        while time.time() < until:
            out["rss"].append(rss_mb(pid))
            time.sleep(1.0)
        out["cpu"] = cpu_seconds(pid) - cpu_began
        out["model_cpu"] = cpu_seconds(model_pid) - model_began
        results = [part.get(timeout=seconds + 120) for part in parts]
    out["elapsed"] = seconds
    out["latencies"] = [x for r in results for x in r["latencies"]]
    out["errors"] = sum(r["run_errors"] for r in results)
    out["warm_errors"] = sum(r["warm_errors"] for r in results)
    out["samples"] = [x for r in results for x in r["samples"]]
    # Whole-life CPU of the load processes (warm-up included), per second measured.
    out["client_cpu"] = sum(r["cpu"] for r in results) * seconds / (until - warm_until + warm)
    return out


async def reject_flood(url: str, seconds: float, concurrency: int = 32) -> tuple[int, int, float]:
    """Keep-alive connections sending tools/call with unknown tokens, written with raw
    sockets so the load generator costs far less than the server it measures."""
    parsed = httpx2.URL(url)
    host, port, path = parsed.host, parsed.port or 80, parsed.raw_path.decode()
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}'
    until = time.monotonic() + seconds
    counts = {"401": 0, "other": 0}

    async def worker(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        request = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer chalie_not-a-real-token-{i:04d}-xxxxxxxxxxxxxxxx\r\n"
            "Accept: application/json, text/event-stream\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        try:
            while time.monotonic() < until:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = head.split(b" ", 2)[1]
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                counts["401" if status == b"401" else "other"] += 1
        finally:
            writer.close()

    began = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return counts["401"], counts["other"], time.monotonic() - began


def count(db: Path, table: str) -> int:
    conn = sqlite3.connect(str(db))
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def tool_calls(db: Path) -> dict[str, int]:
    """Trail rows of the calculator by status and code (warm-up included)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT status, COALESCE(code, ''), count(*) FROM trail "
            "WHERE tool = 'calculator' GROUP BY 1, 2"
        ).fetchall()
    return {f"{status}{'/' + code if code else ''}": int(n) for status, code, n in rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--auth-seconds", type=float, default=5.0)
    parser.add_argument("--mode", choices=("auto", "legacy"), default="auto")
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument(
        "--calls-per-conversation",
        type=int,
        default=10,
        help="an agent continues its conversation this many calls, then starts a new one",
    )
    parser.add_argument(
        "--gateway",
        action="store_true",
        help="gateway mode: agents call the calculator directly (find_tools once, then calls)",
    )
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="chb-", dir="/tmp"))
    model = daemon = None
    try:
        with TokenStore(home / "chalie.db") as store:
            secrets = [
                store.create(f"agent-{i}", scope="gateway" if args.gateway else "agent")
                for i in range(args.agents)
            ]
        model, model_url = start_model(home)
        daemon, url = start_daemon(home, model_url, args.agents, args.gateway)
        rss_start = rss_mb(daemon.pid)
        out = load(
            url,
            secrets,
            args.mode,
            args.seconds,
            daemon.pid,
            args.procs,
            model.pid,
            args.calls_per_conversation,
            args.gateway,
        )
        lat = sorted(out["latencies"])
        calls = len(lat)
        rate = calls / out["elapsed"]
        p50 = statistics.median(lat) * 1000 if lat else float("nan")
        p99 = lat[int(len(lat) * 0.99) - 1] * 1000 if lat else float("nan")
        what = (
            "gateway mode: direct calculator calls (no turn, no model)"
            if args.gateway
            else f"talk_to_chalie, {args.calls_per_conversation} calls a conversation"
        )
        print(
            f"inbound MCP, {args.agents} agents in {args.procs} client processes, "
            f"mode={args.mode}, {what}, {out['elapsed']:.1f} s measured after warm-up:"
        )
        floor = "no floor" if args.gateway else f"floor {FLOOR_CALLS:.0f}"
        print(f"  calls/s            {rate:8.1f}   ({floor})")
        print(f"  errors             {out['errors']:8d}   (floor 0; warm-up {out['warm_errors']})")
        print(f"  latency p50        {p50:8.1f} ms")
        print(f"  latency p99        {p99:8.1f} ms")
        per_call = out["cpu"] / calls * 1000 if calls else float("nan")
        cores = out["cpu"] / out["elapsed"]
        print(f"  daemon CPU         {cores:8.2f} cores, {per_call:.1f} ms a call")
        model_cores = out["model_cpu"] / out["elapsed"]
        client_cores = out["client_cpu"] / out["elapsed"]
        print(f"  model / clients    {model_cores:8.2f} / {client_cores:.2f} cores (same machine)")
        rss = out["rss"] or [0.0]
        print(
            f"  daemon RSS MB      start {rss_start:.0f}, warm {out['rss_warm']:.0f}, "
            f"run min {min(rss):.0f} / max {max(rss):.0f} / end {rss[-1]:.0f}"
        )
        for s in out["samples"][:5]:
            print(f"  sample error: {s}")
        calls_by = tool_calls(home / "chalie.db")
        print(
            "  tool calls         "
            + ", ".join(f"{n} {status}" for status, n in sorted(calls_by.items()))
            + (
                "   (every call; floor: all success)"
                if args.gateway
                else "   (each turn one calculator call; floor: all success)"
            )
        )
        turns_before = count(home / "chalie.db", "conversation_turns")
        trail_before = count(home / "chalie.db", "trail")
        ok, other, took = asyncio.run(reject_flood(url, args.auth_seconds))
        print(f"auth rejection, {took:.1f} s, 32 connections:")
        print(
            f"  401/s              {ok / took:8.1f}   (floor {FLOOR_REJECTIONS:.0f}; other {other})"
        )
        new_turns = count(home / "chalie.db", "conversation_turns") - turns_before
        new_rows = count(home / "chalie.db", "trail") - trail_before
        print(f"  turns started      {new_turns:8d}   trail rows {new_rows}   (floor 0)")
        return 0
    finally:
        for proc in (daemon, model):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

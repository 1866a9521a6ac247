"""MCP outbound figures, each printed beside its floor (issue 10).

1. ``call``: a remote tool through Chalie's whole path (dispatch, JSON Schema,
   gate allow, trail row, MCP executor, connection actor, the persistent
   session) against a direct mcp SDK call to the same server process, in
   one run, interleaved. Floor: ratio <= 1.2.
2. ``idle``: N servers (default 50) x 20 tools connected and idle; the
   daemon-side CPU of their heartbeats over a window. All connections go to
   one fixture server process (each is its own session). The window runs
   with a 5 s interval (6x the default 30 s) and the figure is scaled to 30 s.
   Floor: < 1 % of one core.
3. ``changed``: a server adds 50 tools and announces list_changed; the time
   until find_tools (a real DiscoveryActor with the default embedder) finds
   the 50th. Floor: < 1 s.
4. ``hung``: p99 of calls to a healthy (stdio) server, alone and then while another
   server hangs (accepts TCP, never answers) and a third has 20 calls stuck
   in flight. Floor: p99 unchanged (ratio ~1).
5. ``ready``: ``chalie run`` until every actor is alive, with 0 and with 20
   configured servers (stdio commands that never answer). Floor: the same.

Run: ``python tools/bench/bench_mcp.py [--only call,idle,changed,hung,ready] [--calls 300]``

Measured on a quiet 2-vCPU machine, December 2026 (second session; the call figure in
alternating blocks of 25, 1000 calls):

- call http: direct 1.13-1.39 ms, Chalie 1.40-1.62 ms, 1.17-1.27x (met in some runs only).
- call stdio (the fixture's echo, no work): direct 0.76-0.80 ms, Chalie 1.02-1.12 ms,
  1.30-1.43x (NOT met). call time (mcp-server-time get_current_time): 1.26-1.42x (NOT met).
  The overhead is ~0.2-0.3 ms whatever the tool: four thread hand-offs (caller ->
  dispatcher -> loop -> dispatcher -> caller, ~75 us) plus the dispatcher's work (JSON
  Schema against the remote schema, the gate, a trail row committed before the reply,
  rendering: ~95 us). Before the dispatcher's timers moved into its inbox, the 2 ms
  trail-flush timer woke a timer thread in the middle of the next call: +170 us a call.
- idle: 50 x 20 at a 5 s beat 3.6-4.1 % of a core, 0.60-0.69 % scaled to 30 s (met).
- changed: 50 tools in find_tools 189-232 ms after list_changed (met).
- hung: p99 2.10 -> 2.29 ms (ratio 0.86-1.09) over 2000 calls (met).
- ready: 1.06-1.09 s with none, 1.11-1.16 s with 20 servers (met).

Third session (same machine, a noisier host: the same commit measured 20 % slower on
the inbound bench than the day before): call http 1.19-1.33x, stdio 1.33-1.50x, time
1.29-1.60x; the bare hand-offs of the same shape cost 0.02-0.04 ms (two) and 0.05-0.11
ms (four). A per-call trace of the stdio path (1.08 ms): caller -> dispatcher 13 us;
validate, gate, start 47 us (53 us of that thread's CPU); loop pickup 20-22 us; result
-> done 31 us; -> dispatcher 26 us; render, trail commit, reply 60 us (56 us CPU); ->
caller 14 us. Replying before the trail commit, or reporting from inside the call's task,
moved time between these segments and did not shorten the whole. idle 0.56-0.80 %;
changed 217-225 ms; hung ratio 0.61-2.04 over repeated runs of both this and the previous
session's commit (p99 of 2000 ~1 ms calls on this host is noise); ready 1.05-1.09.

Fourth session (``--calls 1000``): call http 1.25x, stdio 1.41x, time 1.28x, git (a tool
that does work: 3 ms) 1.10x; idle 0.45 %; changed 194 ms; hung 1.12; ready 1.05. Chalie's
path adds a fixed 0.2-0.3 ms whatever the tool: against a 0.75-0.9 ms round trip to a
tool that does nothing, that is 1.25-1.45x; against one that does 3 ms of work, 1.10x.
An inline no-op through the same dispatcher costs 0.14-0.18 ms on its own (0.16-0.2x of
the zero-work round trip), and the same session called from another thread with no
dispatcher 0.06 ms more than the direct call: the 1.2x floor on a zero-work tool leaves
less than the dispatcher's own fixed cost. In the dispatcher, per call (thread CPU): JSON
Schema 15 us, trail commit 30 us (10 us in a tight loop on the same file: the rest is a
cold cache once per call), render 8 us, the executor's start 10 us, the result mapping on
the loop 15 us.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chalie.mcp.spec import ServerSpec  # noqa: E402
from chalie.process.config import McpConfig  # noqa: E402
from tools.fixture_mcp.rig import FixtureServer, Rig, wait_until  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(x: float) -> str:
    return f"{x * 1000:.2f} ms"


# -- 1. call overhead ---------------------------------------------------------------------


def bench_call(calls: int, transport: str) -> None:
    """``transport``: ``http`` or ``stdio`` (our fixture's echo, no work at all), ``time``
    (the PyPI reference server mcp-server-time over stdio, its get_current_time: almost no
    work), or ``git`` (mcp-server-git over stdio, git_status of a small repository: a tool
    that does real work, as most remote tools do)."""
    from mcp import Client, StdioServerParameters

    from tools.fixture_mcp.rig import stdio_spec

    srv = FixtureServer()
    home = Path(tempfile.mkdtemp(prefix="bm-"))
    rig = Rig(home, config=McpConfig(heartbeat_interval=3600, start_delay=0))
    repo = home / "repo"
    if transport == "git":
        repo.mkdir()
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        for i in range(20):
            (repo / f"f{i}.txt").write_text(f"{i}\n")
        subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    if transport == "http":
        spec = ServerSpec(name="fx", transport="http", url=srv.url)
    elif transport == "time":
        spec = ServerSpec(
            name="fx",
            transport="stdio",
            command=sys.executable,
            args=("-m", "mcp_server_time", "--local-timezone", "UTC"),
        )
    elif transport == "git":
        spec = ServerSpec(
            name="fx",
            transport="stdio",
            command=sys.executable,
            args=("-m", "mcp_server_git", "-r", str(repo)),
        )
    else:
        spec = stdio_spec("fx")
    tool, arguments = {
        "time": ("get_current_time", {"timezone": "Europe/Paris"}),
        "git": ("git_status", {"repo_path": str(repo)}),
    }.get(transport, ("echo", {"text": "x"}))
    target: Any = (
        srv.url
        if transport == "http"
        else StdioServerParameters(
            command=spec.command,
            args=list(spec.args),
            cwd=spec.cwd or None,
            env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")},
        )
    )
    try:
        rig.add(spec)
        rig.start()
        rig.wait_tools("fx", {"time": 2, "git": 10}.get(transport, 8), 40)
        proxy = f"_mcp_fx_{tool}"
        rig.allow(proxy)
        direct_t: list[float] = []
        chalie_t: list[float] = []

        async def interleaved(n: int, block: int = 25) -> None:
            # Blocks of direct calls and blocks of calls through Chalie, alternating, so both
            # meet the same machine state (this host drifts 10-15 % between runs). The first
            # call of each block is not counted: it pays for the other's block (the direct
            # session's loop was blocked meanwhile).
            async with Client(target, mode="auto", cache=None) as c:
                await c.call_tool(tool, arguments)
                for b in range(max(1, n // block)):
                    for i in range(block + 1):
                        t0 = time.perf_counter()
                        await c.call_tool(tool, arguments)
                        if i:
                            direct_t.append(time.perf_counter() - t0)
                    for i in range(block + 1):
                        t0 = time.perf_counter()
                        out = rig.run(proxy, arguments, call_id=f"c{b}-{i}")
                        if i:
                            chalie_t.append(time.perf_counter() - t0)
                        assert out.status == "success", out.envelope

        for i in range(20):  # warm up the whole path
            rig.run(proxy, arguments, call_id=f"w{i}")
        asyncio.run(interleaved(calls))
        from chalie.ability import Ability
        from chalie.result import ToolResult

        class Noop(Ability):
            name = "bench_noop"
            summary = tooltip = "A no-op."
            examples = ("a", "b", "c", "d", "e", "f")
            parameters = {"type": "object", "properties": {"text": {"type": "string"}}}

            def run(self, params: Any) -> ToolResult:
                return ToolResult.success("x")

        rig.registry.add(Noop, source="bench")
        rig.allow("bench_noop")
        noop_t: list[float] = []
        for i in range(len(chalie_t)):
            t0 = time.perf_counter()
            rig.run("bench_noop", {"text": "x"}, call_id=f"n{i}")
            noop_t.append(time.perf_counter() - t0)
        hop_t: list[float] = []
        route = rig.deps.routes["fx"]
        assert route.link is not None
        for _ in range(len(chalie_t)):  # the same session from another thread: the loop hop only
            t0 = time.perf_counter()
            rig.loop.submit(route.link.call(tool, arguments, 10)).result(10)
            hop_t.append(time.perf_counter() - t0)
        bare2, bare4 = bare_handoffs(rig.loop, len(chalie_t))
        d, c = statistics.median(direct_t), statistics.median(chalie_t)
        print(
            f"call ({transport})  direct SDK median {ms(d)} (p95 {ms(pct(direct_t, 0.95))}); "
            f"through Chalie median {ms(c)} (p95 {ms(pct(chalie_t, 0.95))}); "
            f"ratio {c / d:.2f}x  [floor <= 1.20x]  n={len(chalie_t)}"
        )
        print(
            f"      (the same session called from another thread, no dispatcher: median "
            f"{ms(statistics.median(hop_t))}; an inline no-op through the same dispatcher: "
            f"{ms(statistics.median(noop_t))})"
        )
        print(
            f"      (bare thread hand-offs, no work: caller -> loop -> caller {ms(bare2)}; "
            f"caller -> thread -> loop -> thread -> caller {ms(bare4)}: the shape of the path "
            "through a dispatcher thread)"
        )
    finally:
        rig.close()
        srv.kill()
        shutil.rmtree(home, ignore_errors=True)


def bare_handoffs(loop: Any, n: int) -> tuple[float, float]:
    """Medians of the same path shapes with no work at all: what the hand-offs cost here."""
    import queue
    from concurrent.futures import Future

    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def relay() -> None:  # a stand-in for the dispatcher thread
        while (item := inbox.get()) is not None:
            kind, fut = item
            if kind == "go":
                loop.call_soon(lambda f=fut: inbox.put(("back", f)))
            else:
                fut.set_result(None)

    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    two: list[float] = []
    four: list[float] = []
    for _ in range(n):
        f2: Future[None] = Future()
        t0 = time.perf_counter()
        loop.call_soon(f2.set_result, None)
        f2.result(10)
        two.append(time.perf_counter() - t0)
        f4: Future[None] = Future()
        t0 = time.perf_counter()
        inbox.put(("go", f4))
        f4.result(10)
        four.append(time.perf_counter() - t0)
    inbox.put(None)
    thread.join(10)
    return statistics.median(two), statistics.median(four)


# -- 2. idle heartbeat CPU -------------------------------------------------------------------


def bench_idle(servers: int, window: float) -> None:
    srv = FixtureServer("--extra", "12")  # 8 + 12 = 20 tools
    home = Path(tempfile.mkdtemp(prefix="bm-"))
    interval = 5.0
    rig = Rig(
        home,
        config=McpConfig(heartbeat_interval=interval, probe_timeout=5, start_delay=0),
        dispatcher=False,
    )
    try:
        for i in range(servers):
            rig.add(ServerSpec(name=f"s{i}", transport="http", url=srv.url))
        t0 = time.monotonic()
        rig.start()
        for i in range(servers):
            rig.wait_tools(f"s{i}", 20, 120)
        up = time.monotonic() - t0
        time.sleep(2)  # let the connect-time work settle
        cpu0, wall0 = time.process_time(), time.monotonic()
        time.sleep(window)
        cpu = time.process_time() - cpu0
        wall = time.monotonic() - wall0
        beats = sum(
            1
            for r in rig.admin.store.servers()
            if r.last_heartbeat and r.last_heartbeat > time.time() - window
        )
        share = cpu / wall * 100
        scaled = share * interval / 30.0
        print(
            f"idle  {servers} servers x 20 tools online in {up:.1f} s; {window:.0f} s idle at a "
            f"{interval:g} s heartbeat: {share:.2f} % of a core ({beats} servers beat); scaled "
            f"to the 30 s default: {scaled:.2f} %  [floor < 1 %]"
        )
    finally:
        rig.close()
        srv.kill()
        shutil.rmtree(home, ignore_errors=True)


# -- 3. list_changed to find_tools ------------------------------------------------------------


def bench_changed() -> None:
    from actors.discovery import DiscoveryActor, DiscoveryHandle

    srv = FixtureServer()
    home = Path(tempfile.mkdtemp(prefix="bm-"))
    rig = Rig(home, config=McpConfig(heartbeat_interval=3600, start_delay=0))
    discovery = DiscoveryActor.start(registry=rig.registry, home=None)
    handle = DiscoveryHandle(discovery, timeout=60)
    rig.deps.discovery = handle
    try:
        handle.status()  # the index is built (embedder loaded) before we measure
        rig.add(ServerSpec(name="fx", transport="http", url=srv.url))
        rig.start()
        rig.wait_tools("fx", 8)
        rig.allow("_mcp_fx_grow")
        rig.deps.side.wait_idle(60)
        out = rig.run("_mcp_fx_grow", {"count": 50})
        t0 = time.perf_counter()
        assert out.status == "success", out.envelope
        wait_until(lambda: "_mcp_fx_grown_50" in handle.find(["_mcp_fx_grown_50"]).names, 30)
        seen = time.perf_counter() - t0
        by_meaning = handle.find(["grown tool number 37"]).names
        print(
            f"changed  50 tools added: the 50th is in find_tools {ms(seen)} after the server "
            f"announced list_changed  [floor < 1000 ms]; 'grown tool number 37' finds "
            f"{'_mcp_fx_grown_37' in by_meaning}"
        )
    finally:
        discovery.stop()
        rig.close()
        srv.kill()
        shutil.rmtree(home, ignore_errors=True)


# -- 4. a hung server ------------------------------------------------------------------------


def bench_hung(calls: int) -> None:
    from tools.fixture_mcp.rig import stdio_spec

    stuck = FixtureServer()
    home = Path(tempfile.mkdtemp(prefix="bm-"))
    rig = Rig(
        home,
        config=McpConfig(
            heartbeat_interval=1,
            probe_timeout=1,
            connect_timeout=20,
            backoff_base=0.2,
            backoff_cap=1,
            call_timeout=120,
            start_delay=0,
        ),
    )
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        hung.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(hung.accept()[0])
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        rig.add(stdio_spec("good"))
        rig.add(ServerSpec(name="stuck", transport="http", url=stuck.url))
        rig.start()
        rig.wait_tools("good", 8)
        rig.wait_tools("stuck", 8)
        rig.allow("_mcp_good_*")
        rig.allow("_mcp_stuck_*")

        def measure(tag: str) -> list[float]:
            out = []
            for i in range(calls):
                t0 = time.perf_counter()
                assert rig.run("_mcp_good_echo", {"text": "x"}, call_id=f"{tag}{i}").status == (
                    "success"
                )
                out.append(time.perf_counter() - t0)
            return out

        measure("w")
        alone = measure("a")
        spec = ServerSpec(
            name="hung",
            transport="http",
            url=f"http://127.0.0.1:{hung.getsockname()[1]}/mcp",
            connect_timeout=2,
        )
        rig.admin.add(spec)
        rig.reload()
        stuck_calls = [
            rig.call("_mcp_stuck_slow", {"seconds": 600}, call_id=f"s{i}") for i in range(20)
        ]
        time.sleep(1)
        with_hung = measure("h")
        assert not any(f.done() for f in stuck_calls)
        a99, h99 = pct(alone, 0.99), pct(with_hung, 0.99)
        print(
            f"hung  calls to a healthy server: p99 alone {ms(a99)} (median "
            f"{ms(statistics.median(alone))}); with a hung server reconnecting and 20 calls "
            f"stuck on a third: p99 {ms(h99)} (median {ms(statistics.median(with_hung))}); "
            f"ratio {h99 / a99:.2f}  [floor: unchanged]  n={calls}"
        )
    finally:
        stop.set()
        hung.close()
        for s in held:
            s.close()
        rig.close()
        stuck.kill()
        shutil.rmtree(home, ignore_errors=True)


# -- 5. daemon ready time ----------------------------------------------------------------------


def ready_time(servers: int) -> float:
    from chalie.mcp.admin import McpAdmin
    from chalie.process import control

    home = Path(tempfile.mkdtemp(prefix="bm-", dir="/tmp"))
    try:
        admin = McpAdmin(home / "chalie.db", home)
        for i in range(servers):
            admin.add(
                ServerSpec(
                    name=f"s{i}",
                    transport="stdio",
                    command=sys.executable,
                    args=("-c", "import time; time.sleep(120)"),
                )
            )
        admin.close()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CHALIE_HOME": str(home)}
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "chalie", "--home", str(home), "run"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        try:
            while True:
                try:
                    reply = control.ControlClient(home, timeout=2).call("status")
                    if reply.ok and all(c["alive"] for c in reply.data["actors"]):
                        return time.monotonic() - t0
                except control.DaemonNotRunning:
                    pass
                if proc.poll() is not None or time.monotonic() - t0 > 120:
                    raise RuntimeError("the daemon did not become ready")
                time.sleep(0.02)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def bench_ready(runs: int) -> None:
    none = [ready_time(0) for _ in range(runs)]
    twenty = [ready_time(20) for _ in range(runs)]
    n, t = statistics.median(none), statistics.median(twenty)
    print(
        f"ready  chalie run until every actor is alive: no servers {n:.2f} s, 20 servers "
        f"(none answering) {t:.2f} s (medians of {runs}); ratio {t / n:.2f}  [floor: the same]"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="call,idle,changed,hung,ready")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--servers", type=int, default=50)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    chosen = set(args.only.split(","))
    if "call" in chosen:
        bench_call(args.calls, "http")
        bench_call(args.calls, "stdio")
        bench_call(args.calls, "time")
        bench_call(args.calls, "git")
    if "idle" in chosen:
        bench_idle(args.servers, args.window)
    if "changed" in chosen:
        bench_changed()
    if "hung" in chosen:
        bench_hung(max(args.calls, 2000))  # p99 needs many calls on a noisy host
    if "ready" in chosen:
        bench_ready(args.runs)


if __name__ == "__main__":
    main()

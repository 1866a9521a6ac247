"""A server listing 10,000 tools (capped at 5,000) through a real daemon: find_tools latency
while it syncs, and the daemon's memory per 1,000 remote tools (issue 18).

Starts ``chalie run`` (the default embedder, no model), measures find_tools (through the
control socket's ``tools.call``: the whole dispatch path) quiet, then adds a stdio
fixture server (``tools/fixture_mcp/server.py --many N``) and keeps finding a built-in
tool while the server's tools are embedded and indexed, until the last one is findable.
Prints the latency beside its floor, the sync time, and the daemon's RSS growth per 1,000
remote tools (VmRSS of the daemon process only; its workers and the server are apart).

Floors: a find during the sync never waits behind the sync: max < 2 s (today's code: 20 s
and then discovery-index-error for everyone); RSS < 15 MB per 1,000 tools (the probe: +300 MB
for 5,000, 60 MB per 1,000).

Run: python tools/bench/bench_many_tools.py [--tools 10000] [--short]
(--short: 2,000 tools.)

One run (2 cpus shared with ~7 other sessions, python 3.11.7, 2026-12-01)::

    server lists 10000 tools, 5000 kept (the cap); indexed in 71.8 s
    find_tools: quiet p50 2.4 ms; during the sync (4692 finds, 0 errors) p50 6.0 ms,
        p99 164.3 ms, max 1472 ms; floor max 2000 ms, ratio 0.74
    daemon RSS 478 -> 568 MB: 18.0 MB per 1,000 remote tools; floor 15 MB, ratio 1.20

A second run at the end of the session (the host busier): indexed in 96.3 s; quiet p50 2.4 ms;
during the sync (4450 finds, 0 errors) p50 8.0 ms, p99 208.0 ms, max 3596 ms (ratio 1.80, one
outlier); RSS 516 -> 564 MB, 9.7 MB per 1,000 tools (ratio 0.64). Where a find can still
wait: behind one batch put into the index (~0.2 s, of which ~0.1 s is the name index's
Tantivy commit; one batch of 64 measured 0.18 s p50, 0.7-1.3 s max on this host).

Before (the same bench, --short): 109 MB per 1,000 tools, most of it free memory kept in
malloc arenas (chalie/process/heap.py); and finds during the sync waited 20 s, then failed with
discovery-index-error. What is left per tool is mostly its proxy class (~6 KB).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chalie.mcp.session import MAX_TOOLS  # noqa: E402
from chalie.process import control  # noqa: E402

FIND_MAX_FLOOR_S = 2.0
RSS_PER_1000_FLOOR_MB = 15.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def call(home: Path, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    started = control.request(home, "tools.call", {"tool": tool, "arguments": arguments})
    assert started.ok, started
    while True:
        reply = control.request(home, "tools.poll", {"call_id": started.data["call_id"], "wait": 5})
        assert reply.ok, reply
        if reply.data["state"] == "done":
            outcome: dict[str, Any] = reply.data["outcome"]
            return outcome


def timed_find(home: Path, queries: list[str]) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    out = call(home, "find_tools", {"queries": queries})
    return time.perf_counter() - t0, out


def wait_ready(home: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited with {proc.returncode}")
        try:
            reply = control.request(home, "status", timeout=2)
        except control.DaemonNotRunning:
            time.sleep(0.1)
            continue
        index = reply.data.get("discovery") or {}
        if (
            reply.ok
            and all(c["alive"] for c in reply.data["actors"])
            and index.get("state") == "ready"
        ):
            return
        time.sleep(0.1)
    raise SystemExit("the daemon was not ready within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, default=10_000)
    parser.add_argument("--short", action="store_true", help="2,000 tools")
    args = parser.parse_args()
    listed = 2000 if args.short else args.tools
    kept = min(listed, MAX_TOOLS)
    home = Path(tempfile.mkdtemp(prefix="chb-", dir="/tmp"))
    (home / "config.toml").write_text(
        "[chat]\nport = 0\n[mcp_server]\nport = 0\n[mcp]\nstart_delay = 0\n"
        "[discovery]\nwrite_examples = false\n"
    )
    env = {**os.environ, "CHALIE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    log = open(home / "daemon.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "chalie", "--home", str(home), "run"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
    )  # fmt: skip
    try:
        wait_ready(home, proc)
        for _ in range(5):
            timed_find(home, ["clock"])
        quiet = [timed_find(home, ["clock"])[0] for _ in range(30)]
        time.sleep(1.0)
        before = rss_mb(proc.pid)
        added = subprocess.run(
            [sys.executable, "-m", "chalie", "--home", str(home), "mcp", "add", "big",
             "--command", sys.executable, "--cwd", str(ROOT),
             "--arg", "-m", "--arg", "tools.fixture_mcp.server", "--arg", "--many",
             "--arg", str(listed)],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        started = time.monotonic()
        last = f"_mcp_big_many_{kept - 20}"  # the listing's own tools come first
        during: list[float] = []
        errors = 0
        while True:
            took, out = timed_find(home, ["clock", last])
            during.append(took)
            errors += out["status"] != "success"
            if last in out["envelope"]:
                break
        synced = time.monotonic() - started
        time.sleep(2.0)
        after = rss_mb(proc.pid)
        cpu = sum(os.times()[2:4])
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    worst = max(during)
    per_1000 = (after - before) / (kept / 1000)
    q50 = statistics.median(quiet) * 1000
    d50 = statistics.median(during) * 1000
    d99 = sorted(during)[int(0.99 * (len(during) - 1))] * 1000
    print(f"server lists {listed} tools, {kept} kept (the cap); indexed in {synced:.1f} s")
    print(
        f"find_tools: quiet p50 {q50:.1f} ms; during the sync ({len(during)} finds, "
        f"{errors} errors) p50 {d50:.1f} ms, p99 {d99:.1f} ms, max {worst * 1000:.0f} ms; "
        f"floor max {FIND_MAX_FLOOR_S * 1000:.0f} ms, ratio {worst / FIND_MAX_FLOOR_S:.2f}"
    )
    print(
        f"daemon RSS {before:.0f} -> {after:.0f} MB: {per_1000:.1f} MB per 1,000 remote tools; "
        f"floor {RSS_PER_1000_FLOOR_MB:.0f} MB, ratio {per_1000 / RSS_PER_1000_FLOOR_MB:.2f}"
    )
    print(f"(the daemon and children's CPU: {cpu:.1f} s)")
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Idle memory of a running daemon with its workers, and the time from ``chalie run`` to ready.

Starts ``python -m chalie --home <tmp> run`` as an operator would, once cold
(an empty data directory: the discovery index is built) and ``--runs`` times
warm (the index is there), and prints for each run:

- start to ``daemon started`` and start to ``discovery ready`` (from the
  daemon's own JSON log lines, stamped when read);
- idle RSS (VmRSS from /proc) of the daemon alone and of the daemon with every
  descendant (its ability workers and the warm spare), after ``--settle``
  seconds of idling.

Floors: issue 8 asks for idle RSS <= 300 MB in all and warm start-to-ready
<= 2 s. Usage: ``PYTHONPATH=. python tools/bench/bench_daemon.py [--runs 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.processes import descendants

RSS_FLOOR_MB = 300.0
READY_FLOOR_S = 2.0


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def first_find(home: Path) -> float:
    """Seconds for one find_tools call through the daemon (the first loads the model)."""
    from chalie.process.control import ControlClient

    client = ControlClient(home, timeout=60)
    began = time.monotonic()
    started = client.call(
        "tools.call",
        {
            "tool": "find_tools",
            "arguments": {"query": ["current time in Tokyo"], "act_summary": "bench"},
        },
    )
    if not started.ok:
        raise RuntimeError(f"find_tools did not start: {started}")
    while True:
        news = client.call("tools.poll", {"call_id": started.data["call_id"], "wait": 5.0})
        if not news.ok:
            raise RuntimeError(f"find_tools failed: {news}")
        if news.data["state"] == "done":
            client.close()
            outcome = news.data["outcome"]
            if outcome["status"] != "success" or "clock" not in outcome["envelope"]:
                raise RuntimeError(f"find_tools did not find the clock: {outcome}")
            return time.monotonic() - began


def one_run(home: Path, settle: float, timeout: float = 120.0) -> dict[str, Any]:
    env = {**os.environ, "CHALIE_HOME": str(home)}
    env.pop("CHALIE_ABILITIES_DIR", None)
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "chalie", "--home", str(home), "run"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen: dict[str, float] = {}
    ready = threading.Event()

    def read_log() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            try:
                msg = str(json.loads(line).get("msg", ""))
            except ValueError:
                continue
            now = time.monotonic() - began
            if msg == "daemon started":
                seen.setdefault("started", now)
            elif msg.startswith("discovery ready"):
                seen.setdefault("discovery", now)
            if "started" in seen and "discovery" in seen:
                ready.set()

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        if not ready.wait(timeout):
            raise RuntimeError(f"daemon not ready within {timeout} s: {seen}")
        time.sleep(settle)
        below = descendants(proc.pid)
        daemon_kb = rss_kb(proc.pid)
        workers_kb = sum(rss_kb(p) for p in below)
        # One find loads the embedding model; it stays until embedder.idle_unload.
        find_s = first_find(home)
        after_find_kb = rss_kb(proc.pid) + sum(rss_kb(p) for p in descendants(proc.pid))
        return {
            "first_find_s": find_s,
            "after_find_mb": after_find_kb / 1024,
            "started_s": seen["started"],
            "ready_s": max(seen["started"], seen["discovery"]),
            "daemon_mb": daemon_kb / 1024,
            "total_mb": (daemon_kb + workers_kb) / 1024,
            "processes": 1 + len(below),
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        reader.join(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="warm runs (after one cold run)")
    parser.add_argument("--settle", type=float, default=3.0, help="idle seconds before measuring")
    opts = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="chb-", dir="/tmp"))
    try:
        cold = one_run(home, opts.settle)
        warm = [one_run(home, opts.settle) for _ in range(opts.runs)]
    finally:
        shutil.rmtree(home, ignore_errors=True)

    def line(label: str, value: float, floor: float, unit: str) -> str:
        verdict = "ok" if value <= floor else "OVER"
        return (
            f"{label:<36} {value:8.2f} {unit:<3} floor {floor:7.2f} {unit:<3} "
            f"ratio {value / floor:5.2f}  {verdict}"
        )

    print(
        f"cold run (index built): started {cold['started_s']:.2f} s, ready {cold['ready_s']:.2f} s"
    )
    ready = statistics.median(r["ready_s"] for r in warm)
    started = statistics.median(r["started_s"] for r in warm)
    total = statistics.median(r["total_mb"] for r in warm)
    daemon = statistics.median(r["daemon_mb"] for r in warm)
    procs = warm[0]["processes"]
    print(f"warm runs: {opts.runs}, median of each figure")
    print(f"{'start to daemon started':<36} {started:8.2f} s")
    print(line("start to discovery ready (warm)", ready, READY_FLOOR_S, "s"))
    print(f"{'idle RSS, daemon alone':<36} {daemon:8.1f} MB")
    print(line(f"idle RSS, daemon + {procs - 1} workers", total, RSS_FLOOR_MB, "MB"))
    after = statistics.median(r["after_find_mb"] for r in warm)
    find = statistics.median(r["first_find_s"] for r in warm)
    print(f"{'first find after start (loads model)':<36} {find:8.2f} s")
    print(f"{'RSS in all after the first find':<36} {after:8.1f} MB  (until embedder.idle_unload)")
    for i, r in enumerate(warm):
        print(
            f"  run {i + 1}: ready {r['ready_s']:.2f} s, daemon {r['daemon_mb']:.1f} MB, "
            f"total {r['total_mb']:.1f} MB in {r['processes']} processes, "
            f"first find {r['first_find_s']:.2f} s, then {r['after_find_mb']:.1f} MB"
        )


if __name__ == "__main__":
    main()

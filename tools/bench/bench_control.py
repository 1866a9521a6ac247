"""The daemon and its control socket: start-up, a control round trip, a CLI tool call, shutdown.

Starts a real ``chalie run`` on a temporary data directory and talks to it
over the real control socket, as the CLI does (one REQ socket per request).

Run: python tools/bench/bench_control.py
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chalie.process import control


def start(home: Path) -> tuple[subprocess.Popen[bytes], float]:
    began = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "chalie", "--home", str(home), "run"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = control.ControlClient(home, timeout=2)
    while True:
        try:
            reply = client.call("status")
        except control.DaemonNotRunning:
            time.sleep(0.01)
            continue
        if reply.ok and all(c["alive"] for c in reply.data["actors"]):
            return proc, time.perf_counter() - began
        time.sleep(0.01)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="chb-", dir="/tmp"))
    try:
        starts, stops = [], []
        for _ in range(3):
            proc, took = start(home)
            starts.append(took)
            time.sleep(3)  # discovery builds its index after start; stop a settled daemon
            began = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
            stops.append(time.perf_counter() - began)
        proc, _ = start(home)
        time.sleep(3)  # let discovery finish building its index in the background
        client = control.ControlClient(home, timeout=10)
        assert client.call(
            "policy.set", {"channel": "chat", "permission": "clock", "decision": "allow"}
        ).ok
        rtt: dict[str, list[float]] = {"status": [], "policy.pending": []}
        for command, samples in rtt.items():
            for _ in range(500):
                t = time.perf_counter()
                assert client.call(command).ok
                samples.append((time.perf_counter() - t) * 1e6)
        calls = []
        for _ in range(300):
            t = time.perf_counter()
            started = client.call(
                "tools.call", {"tool": "clock", "arguments": {"act_summary": "b"}}
            )
            call_id = started.data["call_id"]
            while True:
                news = client.call("tools.poll", {"call_id": call_id, "wait": 2.0})
                if news.data["state"] == "done":
                    break
            assert news.data["outcome"]["status"] == "success"
            calls.append((time.perf_counter() - t) * 1e6)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        print(f"machine: {os.cpu_count()} cpus, python {sys.version.split()[0]}")
        print(
            f"daemon start to ready (all actors alive), median of 3: "
            f"{statistics.median(starts) * 1000:.0f} ms"
        )
        print(
            f"SIGTERM to exit 0 of a settled daemon (tree, workers, loop), median of 3: "
            f"{statistics.median(stops) * 1000:.0f} ms"
        )
        for command, samples in rtt.items():
            print(
                f"control round trip, {command} (n=500): p50 {statistics.median(samples):.0f} us, "
                f"p95 {percentile(samples, 0.95):.0f} us"
            )
        print(
            f"tools.call + tools.poll of clock through the dispatcher (n=300): "
            f"p50 {statistics.median(calls):.0f} us, p95 {percentile(calls, 0.95):.0f} us"
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

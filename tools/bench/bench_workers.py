"""Worker-process figures: call latency beside its floor, throughput, crash and hang recovery.

The floor is a bare ZeroMQ round trip to a child process (a ROUTER in the
measuring thread, a DEALER that echoes in the child): what any call into a
worker process pays at least. Run from the repository root:
``python tools/bench/bench_workers.py`` (``--latency-only`` for the first figure).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import zmq

from actors.workers.worker_pool import WorkerPoolActor, WorkerPoolHandle
from chalie.wire.messages import TurnContext, WorkerJob

NOOP = "tools.sample_abilities:Noop"
SLEEP = "tools.sample_abilities:Sleep"
CONTEXT = TurnContext(conversation_id="bench", turn_id="t")
_ids = iter(range(10**9))


def job(ability: str, **params: object) -> WorkerJob:
    return WorkerJob(job_id=f"j{next(_ids)}", ability=ability, params=params, context=CONTEXT)


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("benchmark condition not reached")
        time.sleep(step)


def all_idle(handle: WorkerPoolHandle) -> bool:
    return all(w["state"] == "idle" for w in handle.status()["workers"])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


ECHO = """
import sys, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.connect(sys.argv[1])
sock.send(b"ready")
while True:
    frame = sock.recv()
    if frame == b"bye":
        break
    sock.send(frame)
"""


def zmq_floor(n: int = 3000) -> list[float]:
    """Round trips of a 200-byte frame to an echoing child process over ipc, in microseconds."""
    with tempfile.TemporaryDirectory(prefix="chalie-floor-") as tmp:
        endpoint = f"ipc://{tmp}/floor.sock"
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(endpoint)
        child = subprocess.Popen([sys.executable, "-c", ECHO, endpoint])
        try:
            peer, _ = router.recv_multipart()
            frame = b"x" * 200
            samples = []
            for i in range(n + 300):
                began = time.perf_counter()
                router.send_multipart([peer, frame])
                router.recv_multipart()
                if i >= 300:
                    samples.append((time.perf_counter() - began) * 1e6)
            router.send_multipart([peer, b"bye"])
            child.wait(10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            router.close(linger=0)
            ctx.term()
    return samples


def latency(handle: WorkerPoolHandle, n: int = 3000) -> None:
    for _ in range(300):
        handle.submit(job(NOOP), timeout=10).result(10)
    samples = []
    for _ in range(n):
        began = time.perf_counter()
        result = handle.submit(job(NOOP), timeout=10).result(10)
        samples.append((time.perf_counter() - began) * 1e6)
        assert result.status == "success", result
    floor = zmq_floor(n)
    p50, floor50 = statistics.median(samples), statistics.median(floor)
    print(
        f"worker call (no-op), submit -> result, n={n}: "
        f"p50 {p50:.0f} us, p99 {pct(samples, 0.99):.0f} us"
        f" | floor, bare ZeroMQ round trip to a child process: p50 {floor50:.0f} us,"
        f" p99 {pct(floor, 0.99):.0f} us | ratio {p50 / floor50:.2f}x"
    )


def throughput(handle: WorkerPoolHandle, n: int = 20000, window: int = 64) -> None:
    done = threading.Semaphore(0)
    slots = threading.BoundedSemaphore(window)
    failures = []

    def finished(fut: object) -> None:
        result = fut.result()  # type: ignore[attr-defined]
        if result.status != "success":
            failures.append(result)
        slots.release()
        done.release()

    began = time.perf_counter()
    for _ in range(n):
        slots.acquire()
        handle.submit(job(NOOP), timeout=30).add_done_callback(finished)
    for _ in range(n):
        done.acquire()
    elapsed = time.perf_counter() - began
    print(
        f"throughput, 2 workers, {window} calls in flight, n={n}: {n / elapsed:,.0f} calls/s"
        f" ({len(failures)} failed)"
    )


def busy_worker(handle: WorkerPoolHandle) -> tuple[int, int]:
    """(slot, pid) of the worker running the sleeping job."""
    found: list[tuple[int, int]] = []

    def check() -> bool:
        found[:] = [
            (w["slot"], w["pid"]) for w in handle.status()["workers"] if w["state"] == "busy"
        ]
        return bool(found)

    wait_for(check)
    return found[0]


def replaced(handle: WorkerPoolHandle, slot: int, old_pid: int) -> Callable[[], bool]:
    def check() -> bool:
        w = handle.status()["workers"][slot]
        return w["pid"] not in (None, old_pid) and w["state"] == "idle"

    return check


def spares_ready(handle: WorkerPoolHandle) -> bool:
    return all(s["state"] == "idle" for s in handle.status()["spares"])


def recovery(handle: WorkerPoolHandle, sig: signal.Signals, code: str, n: int) -> str:
    """Kill (or freeze) the busy worker n times; medians of failure, takeover, full strength."""
    failed, ready, replenished = [], [], []
    for _ in range(n):
        wait_for(lambda: all_idle(handle) and spares_ready(handle), timeout=30)
        fut = handle.submit(job(SLEEP, seconds=10.0), timeout=30)
        slot, pid = busy_worker(handle)
        began = time.perf_counter()
        os.kill(pid, sig)
        while sig == signal.SIGSTOP and not fut.done():
            # Stopped again should anything outside send it a SIGCONT.
            time.sleep(0.02)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
        result = fut.result(10)
        failed.append((time.perf_counter() - began) * 1e3)
        assert result.code == code, result
        wait_for(replaced(handle, slot, pid), step=0.0005)
        ready.append((time.perf_counter() - began) * 1e3)
        wait_for(lambda: spares_ready(handle), timeout=30)
        replenished.append((time.perf_counter() - began) * 1e3)
    med = statistics.median
    text = (
        f"call gets {code} after {med(failed):.0f} ms; replacement ready (serving) after"
        f" {med(ready):.0f} ms (max {max(ready):.0f} ms)"
    )
    if handle.status()["spares"]:
        text += f"; spare replenished after {med(replenished):.0f} ms"
    return text


def main() -> None:
    os.chdir(Path(__file__).resolve().parents[2])
    with tempfile.TemporaryDirectory() as home:
        handle = WorkerPoolHandle()
        pool = WorkerPoolActor.start(Path(home), workers=2, handle=handle)
        try:
            wait_for(lambda: all_idle(handle), timeout=30)
            latency(handle)
            if "--latency-only" in sys.argv:
                return
            throughput(handle)
            print(
                "SIGKILL mid-call, n=9, medians:",
                recovery(handle, signal.SIGKILL, "worker-crashed", 9),
            )
            print(
                "hang (SIGSTOP) mid-call, n=5, medians:",
                recovery(handle, signal.SIGSTOP, "tool-timeout", 5),
            )
        finally:
            pool.stop()
    print(f"load average while measuring: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as home:
        handle = WorkerPoolHandle()
        pool = WorkerPoolActor.start(Path(home), workers=2, spares=0, handle=handle)
        try:
            wait_for(lambda: all_idle(handle), timeout=30)
            print(
                "without a warm spare: SIGKILL mid-call, n=9, medians:",
                recovery(handle, signal.SIGKILL, "worker-crashed", 9),
            )
        finally:
            pool.stop()


if __name__ == "__main__":
    main()

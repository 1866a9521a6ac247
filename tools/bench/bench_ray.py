"""A worker ability through Ray beside the same ability through the local pool; Ray's idle memory.

Figures (issue 33, section 2):

- per-call overhead: a worker-process no-op (``tools.sample_abilities:Noop``)
  called through the real dispatcher, from tool call to rendered envelope,
  with ``[workers] engine = "ray"`` (a Ray task on a local head started here,
  with token auth, as ``ray start --head`` runs it) beside the same call with
  the local engine (the ZeroMQ pool hosted on the dispatcher's thread, as the
  daemon runs it). The floor is the local pool; the figure is the Ray call;
  the overhead is their difference (target: <= 2 ms), each round alternating
  the two, so load on the shared machine hits both alike.
- Ray's idle memory: the resident memory (PSS, so shared pages are counted
  once) of the head's processes after the calls, once they are idle, and what
  joining the cluster added to the daemon's own process (the Ray driver).

Run from the repository root: ``python tools/bench/bench_ray.py [--n 300] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pykka

from actors.calls.dispatcher import DispatcherActor, submit
from actors.gate.policy import PolicyActor
from actors.workers.worker_pool import HostedPool, WorkerPoolHandle
from chalie.calls.registry import Registry
from chalie.process.config import WorkersConfig
from chalie.services import Services
from chalie.wire.bus import EventBus
from chalie.wire.messages import ToolCall, TurnContext
from tools import sample_abilities
from tools.ray_head import RayHead
from tools.waiting import wait_until

TARGET_MS = 2.0


def pss_kib(pid: int) -> int:
    """Proportional resident memory of one process, KiB (0 when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def timed_ms(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300, help="calls a round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="chbr-", dir="/tmp"))
    head = RayHead(cpus=2).start()
    os.environ.update(head.env)  # before Ray is first imported: it reads them once
    registry = Registry()
    registry.add(sample_abilities.Noop, source="bench")
    bus = EventBus()
    policy = PolicyActor.start(home / "chalie.db", bus)
    policy.proxy().set("chat", "sample_noop", "allow").get()
    rss_before = rss_kib(os.getpid())
    handle = WorkerPoolHandle()
    local = DispatcherActor.start(
        registry,
        Services(),
        home / "local.db",
        policy,
        handle,
        bus,
        pool=HostedPool(home / "pool", workers=2, handle=handle),
    )
    on_ray = DispatcherActor.start(
        registry,
        Services(),
        home / "ray.db",
        policy,
        None,
        bus,
        worker_settings=WorkersConfig(engine="ray", address=head.address),
    )
    ctx = TurnContext(
        conversation_id="bench", turn_id="t", channel="chat", injected=("sample_noop",)
    )
    call = ToolCall(call_id="b", tool="sample_noop", arguments={"act_summary": "b"}, context=ctx)
    try:
        started = time.monotonic()
        for name, dispatcher in (("local pool", local), ("ray", on_ray)):
            wait_until(
                lambda d=dispatcher: submit(d, call).result(120).status == "success",
                180,
                what=f"the {name} serving",
            )
        print(
            f"ray {__import__('ray').__version__}; first calls served after "
            f"{time.monotonic() - started:.1f} s (the head was already up)"
        )
        for dispatcher in (local, on_ray):
            for _ in range(100):
                submit(dispatcher, call).result(30)
        print(f"worker no-op through the dispatcher, {args.n} sequential calls a round:")
        overheads, figures, floors = [], [], []
        for r in range(args.rounds):
            floor = timed_ms(lambda: submit(local, call).result(30), args.n)
            figure = timed_ms(lambda: submit(on_ray, call).result(30), args.n)
            fp, bp = statistics.median(figure), statistics.median(floor)
            f90 = sorted(figure)[int(0.9 * len(figure))]
            figures.append(fp)
            floors.append(bp)
            overheads.append(fp - bp)
            print(
                f"  round {r + 1}: ray p50 {fp:6.3f} ms (p90 {f90:6.3f})   local pool p50 "
                f"{bp:6.3f} ms   overhead {fp - bp:6.3f} ms   ratio {fp / bp:5.1f}"
            )
        over = statistics.median(overheads)
        verdict = "within" if over <= TARGET_MS else "ABOVE"
        print(
            f"  => ray call p50 {statistics.median(figures):.3f} ms   floor (local pool) "
            f"{statistics.median(floors):.3f} ms   overhead {over:.3f} ms, ratio "
            f"{statistics.median(figures) / statistics.median(floors):.1f} (median of "
            f"{args.rounds} rounds): {verdict} the {TARGET_MS:g} ms target"
        )
        time.sleep(5)  # let the head's workers go idle
        pids = head.pids()
        total = sum(pss_kib(p) for p in pids)
        print(f"Ray's idle memory: the head's {len(pids)} processes, PSS {total / 1024:.0f} MiB")
        names: dict[str, int] = {}
        for p in pids:
            try:
                name = Path(f"/proc/{p}/comm").read_text().strip()
            except OSError:
                continue
            names[name] = names.get(name, 0) + pss_kib(p)
        for name, kib in sorted(names.items(), key=lambda kv: -kv[1]):
            print(f"  {name:<24} {kib / 1024:7.1f} MiB")
        grown = rss_kib(os.getpid()) - rss_before
        print(
            f"  the daemon's own process (a Ray driver now, beside the local pool's dispatcher): "
            f"RSS +{grown / 1024:.0f} MiB"
        )
    finally:
        local.stop()
        on_ray.stop()
        pykka.ActorRegistry.stop_all()
        head.stop()


if __name__ == "__main__":
    main()

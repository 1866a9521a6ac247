"""Dispatcher overhead beside its floors: an inline no-op and a worker-process no-op.

Figures (each printed beside the floor it is built on, and the ratio):

- immediate no-op through the dispatcher (``isolation = "immediate"``, run
  on the dispatcher's own thread, as the clock and the calculator are), from
  tool call to rendered envelope, with everything a real call pays: the hop
  into the dispatcher actor, pre-validation (defaults, action map, Params),
  classify, the gate (an ``allow`` entry, from the PolicyActor's view), the
  trail row (SQLite WAL, a real file; for a call this quick one insert,
  committed before the reply), rendering, and the reply. Floor: a bare
  pykka ask round trip (the same two hand-offs: caller -> actor -> caller).
  Target: 5x.
- the same no-op in an inline lane (``isolation = "inline"``, every ability
  that may wait): two more hand-offs, dispatcher -> lane thread ->
  dispatcher. Each is a wake-up of a sleeping thread and a pass of the GIL;
  across the two cores of this machine that costs ~70 us each, on one core
  (``taskset -c 0``) ~15 us. No target of its own: a call that may wait
  must not run on the dispatcher's thread, and the hand-off is the price.
- a call into a worker process through the dispatcher (2 workers). Floor: a
  bare ZeroMQ round trip (ROUTER in this process, an echoing DEALER in a
  child process, msgpack frames over ipc).

The machine may be shared, so every figure is measured in ``--rounds``
alternating rounds (floor, figure, floor, figure, ...), each round's p50 is
printed, and the process CPU time per call is printed beside the wall-clock
figures (CPU time is much less sensitive to other processes).

Measured on the shared 2-core machine (issue 8, 8 helpers at work, load
average 3.5 to 11): inline p50 92 to 122 us (floor 18.5 us, ratio 5 to 6.5;
the old dispatcher: 114 to 170 us), worker call p50 228 to 255 us (floor 37
to 58 us). At load 11 the dispatcher thread spent 94 us of CPU per inline
call and the lane thread 39 us; at rest the Python work of a call is about
40 us, the rest is thread wake-ups and the trail commit.

Issue 17 section 6 (targets: inline <= 5x its floor, worker call <= 3x; ratios from the
same round). Alternating runs of the old and the new code, ``--short``, the shared machine
at load 8 to 10 (7 sessions on 2 cores): inline 100-121 us, ratio 7.4-9.1 (the dispatcher's
own work for a call on one thread, no hand-offs: 72-79 us CPU) before; 79-83 us, ratio
5.7-6.1 (57-62 us) after; worker call ratio 11.9-17.5 before, 10.0-14.9 after; the pool
alone 4.0-9.1 before, 3.6-4.3 after. The hand-offs (context switches a call: ~15 before,
~8-12 after; the floor has ~5.4) are most of what is left above the floors. With the lazy
cancelled event and the worker's class cache too (load 13 to 18): own work 70-79 us before,
51-55 us after; the best round after: inline 70.2 us, ratio 5.3; worker call 162 us, 6.6.

Eighth session (December 2026, a quiet 2-core VM; ``--short``). Placement: every figure
and its floor are measured twice, left to the scheduler and with every thread of this
process on one CPU (``placed``), because the scheduler keeps the floor's two threads on
one CPU (a hand-off is a context switch, ~10 us) but spreads a call that works between
its hand-offs over both, where each hand-off wakes a halted vCPU (~40-60 us on this VM,
most of it in the kernel: perf puts 40% of the dispatcher thread's samples in
``try_to_wake_up``). A pykka ask to an actor that spins 0/20/40/80 us: 86/117/138/192 us
across CPUs, 22/43/63/104 us on one. The work itself also runs 2-4 times slower right
after a hand-off than in a loop on one thread (the dispatcher's own work: 48-72 us CPU
alone, 70-210 us in place). Figures, two runs: immediate no-op 167-221 us (ratio 5.5-7.3)
left to the scheduler, 59-76 us (2.7-2.8) on one CPU; lane call 204-298 us (7.4-9.9) and
88-107 us (4.0-4.8); worker call with the pool hosted on the dispatcher's thread 468-505
us (3.0-3.8) and 366-409 us (3.2-3.3), with a broker thread of its own 485-570 us
(3.5-3.7) and 406-418 us (3.2-3.4); the pool alone 1.8-2.2. Pinning the daemon's threads
to one CPU was tried in the daemon (``bench_turns``) and not taken: turns/s rose from
136-146 to 178-202 but the act-loop step p50 went from 1.9-2.3 ms to 4.1 ms.

Run: ``python tools/bench/bench_dispatch.py [calls] [--rounds N] [--short]
[--placement scheduler|one-cpu|both]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
import pykka
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from actors.calls.dispatcher import DispatcherActor, submit
from actors.gate.policy import PolicyActor
from chalie.ability import Ability
from chalie.calls import dispatch as steps
from chalie.calls.execution import Job
from chalie.calls.invoke import invoke
from chalie.calls.registry import Registry
from chalie.calls.trail import CallRecord, Trail
from chalie.result import ToolResult
from chalie.services import Services
from chalie.wire.actor_messages import Dispatch, Executed
from chalie.wire.bus import EventBus
from chalie.wire.messages import ToolCall, ToolOutcome, TurnContext
from tools.waiting import wait_until

# Issue 17 section 6: the dispatcher's overhead, as ratios to the floors measured in the same run.
INLINE_TARGET = 5.0
WORKER_TARGET = 3.0


# Where the threads of this process run while a figure and its floor are measured.
PLACEMENTS: Final = {
    "scheduler": "threads where the kernel puts them",
    "one-cpu": "every thread of this process on one CPU (child processes keep them all)",
}


@contextlib.contextmanager
def placed(how: str) -> Iterator[None]:
    """Measure a figure and its floor under the same thread placement.

    Left to the scheduler, the floor's two threads (a caller and an actor that answers
    at once) are often kept on one CPU, where a hand-off costs a context switch, while
    a call that does real work between hand-offs has its threads on both CPUs, where
    each hand-off wakes the other CPU (on this VM tens of microseconds). The ratio then
    compares the two placements as much as the work. ``one-cpu`` puts every thread of
    this process on one CPU for the measurement, floor and figure alike; worker
    processes, and the floor's echo process, keep every CPU.
    """
    if how == "scheduler":
        yield
        return
    every = os.sched_getaffinity(0)
    cpu = min(every)

    def pin(cpus: set[int]) -> None:
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), cpus)

    pin({cpu})
    try:
        yield
    finally:
        pin(every)


class NoopParams(msgspec.Struct, forbid_unknown_fields=True):
    """Do nothing."""

    action: Literal["ping"] = "ping"
    note: str = ""


class Noop(Ability):
    name = "noop"
    summary = "Does nothing; measures the dispatcher."
    tooltip = "Nothing"
    examples = ("a", "b", "c", "d", "e", "f")
    Params = NoopParams
    actions = {"ping": ()}

    def run(self, params: NoopParams) -> ToolResult:
        return ToolResult.success("ok")


class QuickNoop(Noop):
    """The same no-op declared ``immediate``: run on the dispatcher's thread, as clock and
    calculator are (actors/calls/executors/immediate.py)."""

    name = "quick_noop"
    isolation = "immediate"


class ProcNoop(Ability):
    name = "proc_noop"
    summary = "Does nothing in a worker process; measures the dispatcher's process path."
    tooltip = "Nothing, elsewhere"
    examples = ("a", "b", "c", "d", "e", "f")
    isolation = "process"

    def run(self, params: dict[str, object]) -> ToolResult:
        return ToolResult.success("ok")


class _Ping:
    pass


class Echo(pykka.ThreadingActor):
    """The floor of an actor hop: an actor that answers at once."""

    def on_receive(self, message: Any) -> Any:
        return None


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter_ns() - t) / 1000)
    return out


def measure(fn: Callable[[], object], n: int) -> tuple[float, float, float]:
    """(p50 wall-clock us, process CPU us per call, context switches per call) over n calls."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    cpu = time.process_time()
    samples = timed(fn, n)
    spent = (time.process_time() - cpu) / n * 1e6
    after = resource.getrusage(resource.RUSAGE_SELF)
    switches = (after.ru_nvcsw - before.ru_nvcsw + after.ru_nivcsw - before.ru_nivcsw) / n
    return statistics.median(samples), spent, switches


def rounds(
    label: str,
    floor_label: str,
    fn: Callable[[], object],
    floor: Callable[[], object],
    n: int,
    count: int,
    target: float | None,
    untargeted: str = "part of a figure, no target of its own",
) -> float:
    """Alternate floor and figure; print each round and the median of the rounds.

    ``target`` is the ratio (figure / floor, both from the same round) to stay within.
    Returns the median ratio.
    """
    figures: list[tuple[float, float, float]] = []
    floors: list[tuple[float, float, float]] = []
    ratios: list[float] = []
    for r in range(count):
        floors.append(measure(floor, n))
        figures.append(measure(fn, n))
        (fp, fc, fs), (bp, bc, bs) = figures[-1], floors[-1]
        ratios.append(fp / bp)
        print(
            f"  round {r + 1}: {label} p50 {fp:6.1f} us (cpu {fc:5.1f} us, {fs:4.1f} switches"
            f" a call)   {floor_label} p50 {bp:6.1f} us (cpu {bc:5.1f} us, {bs:4.1f} switches)"
            f"   ratio {fp / bp:4.1f} (cpu {fc / bc:4.1f})"
        )
    fig = statistics.median(p for p, _, _ in figures)
    flo = statistics.median(p for p, _, _ in floors)
    cpu = statistics.median(c for _, c, _ in figures)
    cpu_floor = statistics.median(c for _, c, _ in floors)
    ratio = statistics.median(ratios)
    if target is None:
        verdict = untargeted
    else:
        verdict = f"{'within' if ratio <= target else 'ABOVE'} the {target:g}x target"
    print(
        f"  => {label}: p50 {fig:.1f} us (cpu {cpu:.1f} us/call)   floor ({floor_label}) "
        f"{flo:.1f} us (cpu {cpu_floor:.1f} us/call)   ratio {ratio:.1f} "
        f"(cpu {cpu / cpu_floor:.1f}; median of {count} rounds): {verdict}"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("calls", nargs="?", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--short", action="store_true", help="1000 calls a round, 3 rounds")
    parser.add_argument(
        "--placement",
        choices=(*PLACEMENTS, "both"),
        default="both",
        help="where this process's threads run while measuring (see placed())",
    )
    args = parser.parse_args()
    placements = list(PLACEMENTS) if args.placement == "both" else [args.placement]
    n, count = (1000, 3) if args.short else (args.calls, args.rounds)
    home = Path(tempfile.mkdtemp(prefix="chalie-bench-"))
    registry = Registry()
    registry.add(Noop, source="bench")
    registry.add(QuickNoop, source="bench")
    bus = EventBus()
    policy = PolicyActor.start(home / "chalie.db", bus)
    policy.proxy().set("chat", "noop", "allow").get()
    policy.proxy().set("chat", "quick_noop", "allow").get()
    dispatcher = DispatcherActor.start(registry, Services(), home / "chalie.db", policy, None, bus)
    echo = Echo.start()
    ctx = TurnContext(
        conversation_id="bench", turn_id="t1", channel="chat", injected=("noop", "quick_noop")
    )
    arguments = {"act_summary": "bench", "note": "x"}
    call = ToolCall(call_id="c1", tool="noop", arguments=arguments, context=ctx)
    quick = ToolCall(call_id="c0", tool="quick_noop", arguments=arguments, context=ctx)
    try:
        for _ in range(500):  # warm-up; also lets the dispatcher fetch the policy view
            submit(dispatcher, call).result(5)
            submit(dispatcher, quick).result(5)
        for each in (call, quick):
            outcome = submit(dispatcher, each).result(5)
            assert outcome.status == "success", outcome.envelope
        figures = (
            (
                "immediate no-op through the dispatcher (run on its thread, as clock and "
                "calculator are), gate (allow) + trail included",
                "dispatch",
                quick,
                INLINE_TARGET,
            ),
            (
                "inline no-op through the dispatcher (run in a lane thread: every ability "
                "that may wait)",
                "lane call",
                call,
                None,
            ),
        )
        for title, label, each, target in figures:
            print(f"{title}, n={n} a round:")
            for how in placements:
                print(f"  placement {how}: {PLACEMENTS[how]}")
                with placed(how):
                    rounds(
                        label,
                        "pykka ask",
                        lambda each=each: submit(dispatcher, each).result(5),
                        lambda: echo.ask(_Ping()),
                        n,
                        count,
                        target,
                        "no target (two more cross-thread hand-offs; see the module docstring)",
                    )
        samples = timed(lambda: submit(dispatcher, quick).result(5), n)
        print(
            f"  immediate, last run: p50 {statistics.median(samples):.1f} us   "
            f"p90 {pct(samples, 0.9):.1f} us   p99 {pct(samples, 0.99):.1f} us"
        )
        parts(home, policy)

        callers = 4
        per = max(1, n // callers)

        def caller() -> None:
            for _ in range(per):
                submit(dispatcher, call).result(5)

        threads = [threading.Thread(target=caller) for _ in range(callers)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rate = callers * per / (time.perf_counter() - began)
        print(f"throughput, inline (lane) no-op, {callers} concurrent callers: {rate:,.0f} calls/s")
        worker_path(home, registry, bus, policy, n, count, placements)
        print(f"load average while measuring: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    finally:
        pykka.ActorRegistry.stop_all()


def parts(home: Path, policy: pykka.ActorRef[Any]) -> None:
    """The parts of an inline call, each measured alone on this thread."""
    trail = Trail(home / "parts.db")

    def record() -> CallRecord:
        return trail.record_for(
            call_id="c",
            turn_id="t",
            conversation_id="b",
            channel="chat",
            tool="noop",
            permission="noop.ping",
            params='{"note":"x"}',
            act_summary="bench",
        )

    recs = iter([record() for _ in range(2000)])

    def coalesced() -> None:  # the hot path: a quick call's start and end, one insert
        rec = next(recs)
        trail.defer_start(rec)
        trail.finish(rec, status="success", code=None, decision="allow", decided_by="policy")

    one_row = timed(coalesced, 2000)
    params = {"note": "x"}
    pre = timed(lambda: steps.prevalidate(Noop, params), 5000)
    result = ToolResult.success("ok")
    rend = timed(lambda: steps.render_outcome("noop", result, "ping"), 5000)
    print(
        "  parts (p50): "
        f"trail row of a quick call (one insert) {statistics.median(one_row):.1f} us, "
        f"pre-validation {statistics.median(pre):.1f} us, "
        f"render {statistics.median(rend):.1f} us"
    )
    print(
        "  an immediate call crosses two threads' hand-offs (caller -> dispatcher -> caller),"
        " as the floor does, plus the Python steps and the trail insert; a lane call two more"
        " (dispatcher -> lane -> dispatcher)"
    )
    trail.close()
    print(
        "  the dispatcher's own work for one call (every step above, the trail insert, the "
        f"reply), on one thread with no hand-offs: {steps_alone(home, policy):.1f} us CPU"
    )


class _RunNow:
    """An executor that runs the job at once on the calling thread (steps_alone only)."""

    def __init__(self) -> None:
        self.ran: list[tuple[Job, ToolResult]] = []

    def start(self, job: Job, done: Callable[[ToolResult], None]) -> None:
        self.ran.append((job, invoke(job.instance, job.value)))

    def cancel(self, job_id: str) -> None:
        pass

    def close(self) -> None:
        pass


def steps_alone(home: Path, policy: pykka.ActorRef[Any], n: int = 5000) -> float:
    """CPU us of one inline call's dispatcher steps, driven on this thread (min of 5 runs)."""
    registry = Registry()
    registry.add(Noop, source="bench")
    now = _RunNow()
    dispatcher = DispatcherActor(
        registry,
        Services(),
        home / "alone.db",
        policy,
        None,
        EventBus(),
        executors={"inline": lambda env: now},
    )
    dispatcher.on_start()
    ctx = TurnContext(conversation_id="bench", turn_id="t9", channel="chat", injected=("noop",))
    call = ToolCall(
        call_id="c9", tool="noop", arguments={"act_summary": "bench", "note": "x"}, context=ctx
    )
    deadline = time.monotonic() + 10
    while dispatcher._policy_view(policy) is None and time.monotonic() < deadline:
        time.sleep(0.01)

    def one() -> None:
        reply: Future[ToolOutcome] = Future()
        dispatcher.on_receive(Dispatch(call, reply))
        job, result = now.ran.pop()
        dispatcher.on_receive(Executed(int(job.job_id.rsplit("-", 1)[1]), result))
        assert reply.result(0).status == "success"

    try:
        for _ in range(500):
            one()
        best = float("inf")
        for _ in range(5):
            began = time.thread_time()
            for _ in range(n // 5):
                one()
            best = min(best, (time.thread_time() - began) / (n // 5) * 1e6)
        return best
    finally:
        dispatcher.on_stop()


ECHO = """
import sys, zmq
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.connect(sys.argv[1])
sock.send(b"ready")
while True:
    frame = sock.recv()
    if frame == b"stop":
        break
    sock.send(frame)
"""


def zmq_floor(home: Path) -> tuple[Callable[[], object], Callable[[], None]]:
    """A bare ZeroMQ round trip to a child process: msgpack frame out, the same frame back."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    endpoint = f"ipc://{home}/floor.sock"
    sock.bind(endpoint)
    child = subprocess.Popen([sys.executable, "-c", ECHO, endpoint])
    ident, _ = sock.recv_multipart()
    frame = msgspec.msgpack.encode(
        {"kind": "worker_job", "job_id": "j", "ability": "x:Y", "params": {}, "context": None}
    )

    def round_trip() -> object:
        sock.send_multipart([ident, frame])
        return sock.recv_multipart()

    def close() -> None:
        sock.send_multipart([ident, b"stop"])
        child.wait(5)
        sock.close(0)

    return round_trip, close


def worker_path(
    home: Path,
    registry: Registry,
    bus: EventBus,
    policy: pykka.ActorRef[Any],
    n: int,
    count: int,
    placements: list[str],
) -> None:
    """The same call to an ability in a worker process, through the dispatcher (2 workers):
    with the pool hosted on the dispatcher's thread, as the daemon runs it (the target), and
    with a WorkerPoolActor's broker thread of its own (for comparison)."""
    from actors.workers.worker_pool import HostedPool, WorkerPoolActor, WorkerPoolHandle

    registry.add(ProcNoop, source="bench", ref=f"{Path(__file__).resolve()}:ProcNoop")
    policy.proxy().set("chat", "proc_noop", "allow").get()
    hosted_handle = WorkerPoolHandle()
    hosted = DispatcherActor.start(
        registry,
        Services(),
        home / "hosted.db",
        policy,
        hosted_handle,
        bus,
        pool=HostedPool(home / "hosted", workers=2, handle=hosted_handle),
    )
    handle = WorkerPoolHandle()
    pool = WorkerPoolActor.start(home / "pool", workers=2, handle=handle)
    threaded = DispatcherActor.start(registry, Services(), home / "thread.db", policy, handle, bus)
    ctx = TurnContext(
        conversation_id="bench", turn_id="t2", channel="chat", injected=("proc_noop",)
    )
    call = ToolCall(call_id="w", tool="proc_noop", arguments={"act_summary": "bench"}, context=ctx)
    for dispatcher in (hosted, threaded):
        wait_until(
            lambda d=dispatcher: submit(d, call).result(10).status == "success",
            20,
            what="the workers started",
        )
        for _ in range(300):
            submit(dispatcher, call).result(10)
    floor, close = zmq_floor(home)
    for _ in range(300):
        floor()
    m = max(500, n // 2)
    print(f"worker-process no-op through the dispatcher (2 workers), n={m} a round:")
    from chalie.wire.messages import WorkerJob

    jobs = iter(range(10**9))
    ref = f"{Path(__file__).resolve()}:ProcNoop"

    def pool_only() -> object:
        work = WorkerJob(job_id=f"p{next(jobs)}", ability=ref, params={}, context=ctx)
        return handle.submit(work, timeout=10).result(10)

    try:
        for how in placements:
            print(f"  placement {how}: {PLACEMENTS[how]}")
            with placed(how):
                print("  the pool hosted on the dispatcher's thread (as the daemon runs it):")
                rounds(
                    "worker call",
                    "zmq round trip",
                    lambda: submit(hosted, call).result(10),
                    floor,
                    m,
                    count,
                    WORKER_TARGET,
                )
                print("  the pool on a broker thread of its own (a WorkerPoolActor):")
                rounds(
                    "worker call, broker thread",
                    "zmq round trip",
                    lambda: submit(threaded, call).result(10),
                    floor,
                    m,
                    count,
                    None,
                    "for comparison: two more thread hand-offs a call",
                )
                print("  that pool alone (WorkerPoolHandle.submit -> result, no dispatcher):")
                rounds("pool call", "zmq round trip", pool_only, floor, m, count, None)
    finally:
        close()
        hosted.stop()
        threaded.stop()
        pool.stop()


if __name__ == "__main__":
    main()

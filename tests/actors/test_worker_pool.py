"""The worker pool with real processes and real ipc sockets, and the broker's pure bookkeeping."""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import logging
import math
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
import zmq

from actors.process.supervisor import Supervisor
from actors.workers import worker_pool
from actors.workers.worker_pool import Broker, WorkerPoolActor, WorkerPoolHandle
from chalie.calls.registry import Registry, abilities_in
from chalie.process.supervision import ChildSpec
from chalie.result import ToolResult
from chalie.wire.frames import MAX_DEPTH
from chalie.wire.messages import (
    ControlRequest,
    Heartbeat,
    TurnContext,
    WorkerJob,
    WorkerReady,
    WorkerResult,
    decode,
    encode,
)
from chalie.workers.broker_state import (
    IPC_PATH_MAX,
    BrokerState,
    broker_endpoint,
    encode_credentials,
    from_tool_result,
    new_credentials,
    read_credentials,
    to_tool_result,
    worker_proof,
)
from tools import sample_abilities
from tools.waiting import wait_until

# Starts processes, loads a model or builds indexes: deselect with -m "not slow".
pytestmark = pytest.mark.slow

SAMPLES = "tools.sample_abilities"
CTX = TurnContext(conversation_id="conv-1", turn_id="turn-1")
SECRET = b"s" * 32


def job(ability: str, job_id: str | None = None, **params: Any) -> WorkerJob:
    return WorkerJob(
        job_id=job_id or uuid.uuid4().hex,
        ability=ability if ":" in ability else f"{SAMPLES}:{ability}",
        params=params,
        context=CTX,
    )


def sample_registry() -> Registry:
    registry = Registry()
    for cls in abilities_in(sample_abilities):
        registry.add(cls, source="tests")
    return registry


def pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def all_idle(handle: WorkerPoolHandle) -> bool:
    workers = handle.status()["workers"]
    return bool(workers) and all(w["state"] == "idle" for w in workers)


def busy_pid(handle: WorkerPoolHandle) -> int:
    found: list[int] = []

    def check() -> bool:
        found[:] = [w["pid"] for w in handle.status()["workers"] if w["state"] == "busy"]
        return bool(found)

    wait_until(check)
    return found[0]


def worker_pids(handle: WorkerPoolHandle) -> list[int]:
    return [w["pid"] for w in handle.status()["workers"] if w["pid"]]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def pool_handle(home: Path) -> Iterator[WorkerPoolHandle]:
    handle = WorkerPoolHandle()
    ref = WorkerPoolActor.start(home, workers=2, handle=handle, heartbeat=0.1, liveness=8)
    wait_until(lambda: all_idle(handle), timeout=30)
    yield handle
    ref.stop()


@pytest.fixture
def handle(pool_handle: WorkerPoolHandle) -> WorkerPoolHandle:
    wait_until(lambda: all_idle(pool_handle), timeout=30)
    return pool_handle


def call(handle: WorkerPoolHandle, j: WorkerJob, timeout: float = 10.0) -> WorkerResult:
    return handle.submit(j, timeout=timeout).result(timeout=timeout + 10)


# -- round trips -----------------------------------------------------------------


def test_echo_round_trip_carries_params_context_and_meta(handle: WorkerPoolHandle) -> None:
    result = call(handle, job("Echo", text="héllo ✓"))
    assert result.status == "success"
    assert result.body == "héllo ✓"
    assert result.meta["conversation"] == "conv-1"
    tool = to_tool_result(result)
    assert tool.ok and tool.body == "héllo ✓"


def test_process_isolated_abilities_run_in_a_worker_process_not_the_daemon(
    handle: WorkerPoolHandle,
) -> None:
    entry = sample_registry().get("sample_echo")
    assert entry is not None and entry.cls.isolation == "process"
    result = call(handle, WorkerJob(job_id="iso", ability=entry.ref, params={"text": "x"}))
    pid = result.meta["pid"]
    assert pid != os.getpid()
    assert pid in worker_pids(handle)


def test_the_handle_is_safe_to_use_from_many_threads(handle: WorkerPoolHandle) -> None:
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(lambda i: call(handle, job("Echo", text=str(i))), range(200)))
    assert [r.body for r in results] == [str(i) for i in range(200)]


# -- failures of the ability or its reference --------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        "tests.no_such_module:Thing",
        f"{SAMPLES}:NoSuchAbility",
        "os:getcwd",
        "no-colon-at-all",
        "/nonexistent/dir/ability.py:Thing",
    ],
)
def test_a_bad_import_reference_is_a_structured_unknown_tool_error(
    handle: WorkerPoolHandle, ref: str
) -> None:
    result = call(handle, WorkerJob(job_id=uuid.uuid4().hex, ability=ref))
    assert result.status == "error"
    assert result.code == "unknown-tool"
    assert result.hint


def test_a_module_that_fails_on_import_is_an_internal_error(
    handle: WorkerPoolHandle, tmp_path: Path
) -> None:
    broken = tmp_path / "broken_ability.py"
    broken.write_text("raise RuntimeError('module is broken')\n")
    result = call(handle, WorkerJob(job_id="broken", ability=f"{broken}:Thing"))
    assert result.code == "internal-error"
    assert "RuntimeError" in result.body


def test_parameters_the_ability_rejects_are_an_invalid_param_error(
    handle: WorkerPoolHandle,
) -> None:
    result = call(handle, job("Echo", text=5))
    assert result.code == "invalid-param"
    assert "text" in result.body


@pytest.mark.parametrize(
    ("ability", "code"),
    [
        ("Raises", "unhandled-exception"),
        ("Unsendable", "internal-error"),
        ("Huge", "internal-error"),
        ("Deep", "internal-error"),
    ],
)
def test_an_ability_failure_in_the_worker_becomes_an_error_result(
    handle: WorkerPoolHandle, ability: str, code: str
) -> None:
    result = call(handle, job(ability))
    assert result.status == "error" and result.code == code
    assert call(handle, job("Echo", text="still fine")).body == "still fine"


# -- crashes, hangs, timeouts, cancels --------------------------------------------


def test_sigkill_mid_call_gives_worker_crashed_and_a_replacement_serves_the_next_call(
    handle: WorkerPoolHandle,
) -> None:
    future = handle.submit(job("Sleep", seconds=30.0), timeout=60)
    victim = busy_pid(handle)
    os.kill(victim, signal.SIGKILL)
    result = future.result(timeout=10)
    assert result.code == "worker-crashed"
    wait_until(lambda: all_idle(handle) and victim not in worker_pids(handle))
    assert pid_gone(victim)
    assert len(worker_pids(handle)) == 2
    served = {call(handle, job("Pid")).body for _ in range(6)}
    assert str(victim) not in served


def test_without_a_spare_a_crashed_worker_is_respawned(tmp_path: Path) -> None:
    handle = WorkerPoolHandle()
    ref = WorkerPoolActor.start(tmp_path, workers=1, spares=0, handle=handle)
    try:
        wait_until(lambda: all_idle(handle), timeout=30)
        (victim,) = worker_pids(handle)
        assert handle.status()["spares"] == []
        assert call(handle, job("KillSelf")).code == "worker-crashed"
        assert call(handle, job("Echo", text="back"), timeout=30).body == "back"
        (replacement,) = worker_pids(handle)
        assert replacement != victim and pid_gone(victim)
        assert handle.status()["workers"][0]["restarts"] == 1
    finally:
        ref.stop()


def test_a_ready_spare_takes_over_a_dead_workers_slot() -> None:
    book = BrokerState(1, spares=1, heartbeat=0.1)
    add(book, b"a", 0, 100, 0.0)
    add(book, b"s", 1, 101, 0.0)
    ready(book, b"a", 100, 0.1)
    ready(book, b"s", 101, 0.1)
    book.submit(job("Echo", "j1"), 10, None, 0.1)
    assert [w.identity for _, w in book.assignments()] == [b"a"]  # never the spare
    book.submit(job("Echo", "j2"), 10, None, 0.1)
    assert book.assignments() == []
    crashed = book.remove_worker(b"a", 0.2)
    assert crashed is not None and crashed.job.job_id == "j1"
    assert book.workers[b"s"].slot == 0
    assert [w.identity for _, w in book.assignments()] == [b"s"]
    assert book.slots_to_spawn(0.2) == [1]  # a new spare, not a new worker
    status = book.status()
    assert status["workers"][0]["pid"] == 101 and status["workers"][0]["restarts"] == 1
    assert status["spares"][0]["state"] == "down"
    # A spare that becomes ready while a slot is empty fills it.
    book.remove_worker(b"s", 0.3)
    add(book, b"t", 1, 102, 0.3)
    assert book.workers[b"t"].slot == 1
    ready(book, b"t", 102, 0.4)
    assert book.workers[b"t"].slot == 0


@pytest.mark.parametrize("ability", ["Exit", "KillSelf"])
def test_an_ability_that_kills_its_own_worker_gives_worker_crashed(
    handle: WorkerPoolHandle, ability: str
) -> None:
    result = call(handle, job(ability))
    assert result.code == "worker-crashed"
    assert call(handle, job("Echo", text="after")).body == "after"


def keep_frozen(pid: int, future: concurrent.futures.Future[WorkerResult]) -> WorkerResult:
    """SIGSTOP a worker, again and again until its call resolves: a stray SIGCONT
    from outside the test must not thaw it."""
    deadline = time.monotonic() + 10
    while not future.done() and time.monotonic() < deadline:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    return future.result(timeout=10)


def test_a_hung_worker_is_killed_and_replaced_and_its_call_gets_tool_timeout(
    handle: WorkerPoolHandle,
) -> None:
    future = handle.submit(job("Sleep", seconds=30.0), timeout=60)
    victim = busy_pid(handle)
    result = keep_frozen(victim, future)
    assert result.code == "tool-timeout"
    assert "stopped responding" in result.body
    wait_until(lambda: pid_gone(victim))
    wait_until(lambda: all_idle(handle) and victim not in worker_pids(handle))
    assert call(handle, job("Echo", text="x")).status == "success"


def test_a_worker_that_freezes_itself_mid_call_is_detected(handle: WorkerPoolHandle) -> None:
    result = call(handle, job("Freeze"), timeout=30)
    assert result.code == "tool-timeout"


def test_a_call_past_its_timeout_gets_tool_timeout_and_its_worker_is_replaced(
    handle: WorkerPoolHandle,
) -> None:
    began = time.monotonic()
    future = handle.submit(job("Sleep", seconds=30.0), timeout=0.3)
    victim = busy_pid(handle)
    result = future.result(timeout=10)
    assert result.code == "tool-timeout"
    assert time.monotonic() - began < 5
    wait_until(lambda: pid_gone(victim))


def test_cancel_resolves_the_call_as_cancelled_and_stops_the_work(
    handle: WorkerPoolHandle,
) -> None:
    future = handle.submit(job("Sleep", "to-cancel", seconds=30.0), timeout=60)
    victim = busy_pid(handle)
    handle.cancel("to-cancel")
    assert future.result(timeout=10).code == "cancelled"
    wait_until(lambda: pid_gone(victim))
    wait_until(lambda: all_idle(handle))
    handle.cancel("to-cancel")  # a second cancel, or of an unknown id, is harmless
    handle.cancel("never-existed")


def test_cancelling_a_queued_call_leaves_the_busy_workers_alone(handle: WorkerPoolHandle) -> None:
    sleepers = [handle.submit(job("Sleep", seconds=0.8), timeout=30) for _ in range(2)]
    wait_until(lambda: handle.status()["running"] == 2)
    pids = worker_pids(handle)
    queued = handle.submit(job("Echo", "queued", text="never"), timeout=30)
    handle.cancel("queued")
    assert queued.result(timeout=10).code == "cancelled"
    assert all(f.result(timeout=10).status == "success" for f in sleepers)
    assert worker_pids(handle) == pids


# -- hostile input -------------------------------------------------------------------


def test_bad_submissions_resolve_to_errors_instead_of_raising(handle: WorkerPoolHandle) -> None:
    for timeout in (0, -1, math.nan, math.inf, True, "5"):
        result = handle.submit(job("Echo"), timeout=timeout).result(timeout=1)  # type: ignore[arg-type]
        assert result.code == "internal-error", timeout
    assert handle.submit("not a job", timeout=1).result(timeout=1).code == "internal-error"  # type: ignore[arg-type]
    slow = handle.submit(job("Sleep", "dup", seconds=0.3), timeout=10)
    duplicate = handle.submit(job("Echo", "dup"), timeout=10)
    assert duplicate.result(timeout=5).code == "internal-error"
    assert slow.result(timeout=5).status == "success"


def test_a_job_that_cannot_cross_the_process_boundary_is_refused_up_front(
    handle: WorkerPoolHandle,
) -> None:
    unsendable = handle.submit(job("Echo", text=object()), timeout=5).result(timeout=5)
    assert unsendable.code == "internal-error" and "cannot be sent" in unsendable.body
    oversized = handle.submit(job("Echo", text="x" * (17 * 1024 * 1024)), timeout=5)
    assert oversized.result(timeout=5).code == "invalid-param"
    for depth in (MAX_DEPTH, 5000):  # past the receiver's limit; past the encoder's
        deep = handle.submit(job("Echo", text=nested(depth)), timeout=5).result(timeout=5)
        assert deep.code == "internal-error" and "cannot be sent" in deep.body
    assert call(handle, job("Echo", text="fine")).body == "fine"


def test_an_unbound_handle_answers_that_the_pool_is_not_running() -> None:
    loose = WorkerPoolHandle()
    result = loose.submit(job("Echo"), timeout=1).result(timeout=1)
    assert result.code == "internal-error" and "not running" in result.body
    assert loose.status()["running_pool"] is False
    loose.cancel("anything")


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


DEEP_FRAME = b"\x91" * 200_000 + b"\xc0"  # 200,000 levels, far inside the frame limit


def test_strangers_frames_are_dropped_undecoded_and_the_pool_serves_on(
    handle: WorkerPoolHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="chalie.workers")
    broker = handle._broker
    assert broker is not None
    dropped_before = broker.drops.total
    endpoint = handle.status()["endpoint"]
    pids = worker_pids(handle)
    restarts = [w["restarts"] for w in handle.status()["workers"]]
    ctx = zmq.Context()
    rogues = []
    try:
        for identity in (b"rogue", b"rogue.c", b"w0-fake"):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IDENTITY, identity)
            sock.connect(endpoint)
            rogues.append(sock)
        rogue, rogue_control, impostor = rogues
        frames = [
            b"\x00\xffgarbage",
            b"",
            encode(ControlRequest(command="stop")),
            encode(WorkerResult(job_id="nope", status="success", body="forged")),
            encode(Heartbeat(worker_id="rogue")),
        ]
        for frame in frames:
            rogue.send(frame)
        rogue.send_multipart([b"a", b"b", b"c"])
        rogue_control.send(encode(Heartbeat(worker_id="rogue")))
        rogue_control.send(encode(WorkerResult(job_id="nope", status="success")))
        impostor.send(encode(WorkerReady(worker_id="w0-fake", pid=pids[0], proof="0" * 64)))
        for _ in range(20):  # once took the broker thread down, and then the daemon
            rogue.send(DEEP_FRAME)
            rogue_control.send(DEEP_FRAME)
        oversized = ctx.socket(zmq.DEALER)
        oversized.setsockopt(zmq.LINGER, 0)
        oversized.connect(endpoint)
        rogues.append(oversized)
        oversized.send(b"\x00" * (17 * 1024 * 1024))
        wait_until(lambda: broker.drops.total - dropped_before >= 49)
    finally:
        for sock in rogues:
            sock.close(linger=0)
        ctx.term()
    assert "not a live worker of this broker" in caplog.text
    assert call(handle, job("Echo", text="unharmed")).body == "unharmed"
    assert handle._broker is broker  # the broker thread never died
    assert worker_pids(handle) == pids
    assert [w["restarts"] for w in handle.status()["workers"]] == restarts


def test_a_live_workers_malformed_frames_are_dropped_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="chalie.workers")
    broker = Broker(tmp_path, 1, spares=0)
    try:
        me = b"w0-live"
        add(broker.state, me, 0, 4242, 0.0)
        sent: list[tuple[list[bytes], bool]] = [
            ([me, b"\x00\xffgarbage"], False),
            ([me, DEEP_FRAME], False),
            ([me + b".c", DEEP_FRAME], True),
            ([me, b"a", b"b"], False),
            ([me, encode(ControlRequest(command="stop"))], False),
            ([me, encode(WorkerResult(job_id="nope", status="success"))], False),
            ([me + b".c", encode(WorkerResult(job_id="nope", status="success"))], True),
        ]
        for frames, control in sent:
            broker.on_frames(frames, control, 0.1)
        assert broker.drops.total == len(sent)
        text = caplog.text
        assert text.count("undecodable (frame nests deeper than 64 levels)") == 2
        assert "undecodable (" in text and "2 payload frames" in text
        assert "unexpected ControlRequest" in text
        assert "result for a job it does not run" in text
        assert "unexpected WorkerResult on a control socket" in text
        # A Ready without the proof: whoever holds the identity is not our
        # worker, so the slot starts over with a fresh identity.
        broker.on_frames([me, encode(WorkerReady(worker_id="w0-live", pid=4242))], False, 0.2)
        assert "without proof" in caplog.text
        assert me not in broker.state.workers
        assert broker.state.slots_to_spawn(time.monotonic() + 5) == [0]
    finally:
        broker._shutdown()


def test_a_frame_whose_handling_fails_is_dropped_and_the_broker_thread_lives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    handle = WorkerPoolHandle()
    ref = WorkerPoolActor.start(tmp_path, workers=1, spares=0, handle=handle)
    try:
        wait_until(lambda: all_idle(handle), timeout=30)
        broker = handle._broker
        assert broker is not None
        handled = broker.on_frames
        failed: list[bytes] = []

        def once_broken(frames: list[bytes], control: bool, now: float) -> None:
            if not failed:
                failed.append(frames[0])
                raise KeyError("a fault in handling")
            handled(frames, control, now)

        broker.on_frames = once_broken  # type: ignore[method-assign]
        wait_until(lambda: bool(failed))
        assert call(handle, job("Echo", text="still here")).body == "still here"
        assert handle._broker is broker
        assert "handling failed (KeyError)" in caplog.text
    finally:
        ref.stop(timeout=15)


def test_one_turn_of_the_broker_loop_handles_a_bounded_number_of_frames(tmp_path: Path) -> None:
    broker = Broker(tmp_path, 1, spares=0)
    ctx = zmq.Context()
    stranger = ctx.socket(zmq.DEALER)
    stranger.setsockopt(zmq.LINGER, 0)
    try:
        stranger.connect(broker.endpoint)
        waiting = worker_pool.RECEIVE_QUEUE  # as many as ZeroMQ queues for one peer
        for _ in range(waiting):
            stranger.send(b"x")
        wait_until(lambda: bool(broker._router.poll(0)))
        turns = []
        while broker.drops.total < waiting:
            before = broker.drops.total
            broker._receive(16)
            turns.append(broker.drops.total - before)
        assert max(turns) <= 16 and len(turns) >= waiting // 16
    finally:
        stranger.close(linger=0)
        ctx.term()
        broker._shutdown()


def test_a_workers_identity_and_secret_are_on_neither_its_command_line_nor_its_environment(
    handle: WorkerPoolHandle,
) -> None:
    broker = handle._broker
    assert broker is not None
    workers = list(broker.state.workers.values())
    assert workers
    for worker in workers:
        seen = Path(f"/proc/{worker.pid}/cmdline").read_bytes()
        seen += Path(f"/proc/{worker.pid}/environ").read_bytes()
        assert worker.identity not in seen
        assert worker.secret not in seen and worker.secret.hex().encode() not in seen


def test_an_impostor_holding_a_new_workers_identity_gets_no_job_and_the_real_worker_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The worst case of /proc snooping: the impostor has the identity and connects first."""
    caplog.set_level(logging.WARNING, logger="chalie.workers")
    ctx = zmq.Context()
    handle = WorkerPoolHandle()
    leaked: list[tuple[str, zmq.Socket[bytes]]] = []
    issue = worker_pool.new_credentials

    def leaky(slot: int) -> tuple[str, bytes]:
        identity, secret = issue(slot)
        if not leaked:
            broker = handle._broker
            assert broker is not None
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IDENTITY, identity.encode())
            monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
            sock.connect(broker.endpoint)
            # Connected before the real worker is even started.
            assert monitor.poll(5000)
            sock.disable_monitor()
            monitor.close(linger=0)
            leaked.append((identity, sock))
        return identity, secret

    monkeypatch.setattr(worker_pool, "new_credentials", leaky)
    ref = WorkerPoolActor.start(tmp_path, workers=1, spares=0, handle=handle)
    try:
        wait_until(lambda: bool(leaked) and bool(worker_pids(handle)))
        identity, impostor = leaked[0]
        real_pid = worker_pids(handle)[0]
        forged = WorkerReady(worker_id=identity, pid=real_pid, proof="0" * 64)
        impostor.send(encode(forged))
        wait_until(lambda: "without proof" in caplog.text)
        answer = call(handle, job("Echo", text="from the real worker"))
        assert answer.status == "success" and answer.body == "from the real worker"
        assert answer.meta.get("pid") not in (None, os.getpid())
        assert impostor.poll(0) == 0  # never sent a job, or anything else
        assert pid_gone(real_pid) or real_pid not in worker_pids(handle)
    finally:
        for _, sock in leaked:
            sock.close(linger=0)
        ref.stop(timeout=15)
        ctx.term()


FLOODER = """
import sys, time, zmq
endpoint, seconds, peers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
ctx = zmq.Context()
socks = []
for i in range(peers):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 100000)
    s.connect(endpoint)
    socks.append(s)
sent, end = 0, time.monotonic() + seconds
while time.monotonic() < end and sent < 20_000_000:
    for s in socks:
        try:
            s.send(b"x", zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            pass
print(sent)
"""


@contextlib.contextmanager
def flooded(handle: WorkerPoolHandle, broker: Broker) -> Iterator[Callable[[], None]]:
    """A flood of one-byte frames on the pool's socket while the block runs (bounded: 15 s
    or 20 million frames at most); it yields a check that the flood is still going on."""
    flooder = subprocess.Popen(
        [sys.executable, "-c", FLOODER, handle.status()["endpoint"], "15", "4"],
        stdout=subprocess.DEVNULL,
    )

    def still_flooding() -> None:
        assert flooder.poll() is None, "the flood ended before the calls did"
        flooding = broker.drops.total
        wait_until(lambda: broker.drops.total > flooding + 10_000)

    try:
        wait_until(lambda: broker.drops.total > 10_000)
        yield still_flooding
    finally:
        flooder.kill()
        flooder.wait(timeout=30)


def test_a_flood_of_one_byte_frames_starves_neither_heartbeats_nor_calls(tmp_path: Path) -> None:
    handle = WorkerPoolHandle()
    # Strict liveness: a worker unheard for 0.4 s is killed, so starvation shows fast.
    ref = WorkerPoolActor.start(tmp_path, workers=2, handle=handle, heartbeat=0.1, liveness=4)
    try:
        wait_until(lambda: all_idle(handle), timeout=30)
        broker = handle._broker
        assert broker is not None
        pids = worker_pids(handle)
        with flooded(handle, broker) as still_flooding:
            in_flight = handle.submit(job("Sleep", seconds=1.5), timeout=20)
            answers = [call(handle, job("Echo", text=f"n{i}")).body for i in range(20)]
            assert answers == [f"n{i}" for i in range(20)]
            assert in_flight.result(timeout=20).status == "success"
            still_flooding()
        assert worker_pids(handle) == pids  # no worker was killed for missed heartbeats
        assert all(w["restarts"] == 0 for w in handle.status()["workers"])
    finally:
        ref.stop(timeout=15)


def test_a_flood_on_a_hosted_pools_socket_starves_neither_the_dispatchers_mail_nor_its_workers(
    tmp_path: Path,
) -> None:
    """The pool on the dispatcher's thread: the flood is read there, between its calls."""
    from tests.actors.rig import Rig

    handle = WorkerPoolHandle()
    pool = worker_pool.HostedPool(
        tmp_path / "home", workers=2, handle=handle, heartbeat=0.1, liveness=4
    )
    rig = Rig(tmp_path, workers=handle, pool=pool)
    wait_until(lambda: all_idle(handle), timeout=30)
    broker = handle._broker
    assert broker is not None
    pids = worker_pids(handle)
    with flooded(handle, broker) as still_flooding:
        in_flight = rig.call("sample_sleep", {"seconds": 1.5})
        for i in range(20):  # calls through the dispatcher: a worker's and an inline one
            assert rig.run("sample_echo", {"text": f"n{i}"}).status == "success"
            assert rig.run("fast").status == "success"
        assert call(handle, job("Echo", text="direct")).body == "direct"  # from this thread
        assert in_flight.result(20).status == "success"
        still_flooding()
    assert worker_pids(handle) == pids  # no worker was killed for missed heartbeats
    assert all(w["restarts"] == 0 for w in handle.status()["workers"])
    rig.ref.stop()


# -- lifecycle ------------------------------------------------------------------------


def test_stop_reaps_every_worker_and_fails_open_calls(tmp_path: Path) -> None:
    handle = WorkerPoolHandle()
    ref = WorkerPoolActor.start(tmp_path, workers=3, handle=handle)
    wait_until(lambda: all_idle(handle), timeout=30)
    pids = worker_pids(handle)
    assert len(pids) == 3
    wait_until(lambda: all(s["state"] == "idle" for s in handle.status()["spares"]))
    spares = [s["pid"] for s in handle.status()["spares"]]
    assert len(spares) == 1 and spares[0] not in pids
    pids += spares
    running = handle.submit(job("Sleep", seconds=30.0), timeout=60)
    busy_pid(handle)
    ref.stop(timeout=15)
    assert running.result(timeout=5).code == "internal-error"
    assert all(pid_gone(pid) for pid in pids)
    assert handle.submit(job("Echo"), timeout=1).result(timeout=1).code == "internal-error"


def test_the_socket_lives_in_a_private_directory(pool_handle: WorkerPoolHandle, home: Path) -> None:
    endpoint = pool_handle.status()["endpoint"]
    assert endpoint == f"ipc://{home / 'workers' / 'broker.sock'}"
    assert stat.S_IMODE((home / "workers").stat().st_mode) == 0o700


def test_a_restarted_pool_rebinds_the_same_handle(tmp_path: Path) -> None:
    handle = WorkerPoolHandle()
    sup = Supervisor.start(
        [ChildSpec("workers", lambda: WorkerPoolActor.start(tmp_path, workers=1, handle=handle))],
        backoff_base=0.01,
    )
    try:
        wait_until(lambda: all_idle(handle), timeout=30)
        old_pids = worker_pids(handle)
        broker = handle._broker
        assert broker is not None
        # A status request whose reply slot is broken crashes the broker thread.
        broker._command("status", None)
        wait_until(lambda: handle._broker is not broker and all_idle(handle), timeout=30)
        assert all(pid_gone(pid) for pid in old_pids)
        assert call(handle, job("Echo", text="again")).body == "again"
        status = sup.proxy().status().get(timeout=5)
        assert status["children"][0]["restarts"] == 1
        assert "worker-broker" in status["children"][0]["last_error"]
    finally:
        sup.stop(timeout=15)


def test_a_worker_whose_broker_disappears_exits_by_itself(tmp_path: Path) -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/b.sock"
    router.bind(endpoint)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "chalie.workers.worker_process",
            "--endpoint",
            endpoint,
            "--heartbeat",
            "0.05",
            "--broker-timeout",
            "0.5",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    proc.stdin.write(encode_credentials("lonely", SECRET))
    proc.stdin.close()
    try:
        ready = None
        while ready is None:
            assert router.poll(20_000)
            peer, frame = router.recv_multipart()
            msg = decode(frame)
            assert isinstance(msg, (WorkerReady, Heartbeat))
            if isinstance(msg, WorkerReady):
                ready = msg
        assert peer == b"lonely" and ready.pid == proc.pid
        assert ready.proof == worker_proof(SECRET, "lonely", proc.pid)
        router.close(linger=0)
        assert proc.wait(timeout=10) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ctx.term()


@pytest.mark.parametrize("stdin", [b"", b"just-an-identity\n", b"id\nnot hex\n"])
def test_a_worker_started_without_credentials_on_stdin_exits_at_once(stdin: bytes) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "chalie.workers.worker_process",
            "--endpoint",
            "ipc:///nonexistent/b.sock",
        ],
        input=stdin,
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert b"no usable credentials on stdin" in proc.stderr


# -- the pure bookkeeping, with an injected clock -------------------------------------


def add(book: BrokerState, identity: bytes, slot: int, pid: int, now: float) -> None:
    book.add_worker(identity, slot, pid, now, secret=SECRET)


def ready(book: BrokerState, identity: bytes, pid: int, now: float, secret: bytes = SECRET) -> bool:
    """The worker's WorkerReady, with the proof a worker holding ``secret`` sends."""
    return book.on_ready(identity, pid, now, worker_proof(secret, identity.decode(), pid))


def _book(**kw: Any) -> BrokerState:
    book = BrokerState(2, heartbeat=0.1, liveness=3, startup_grace=5.0, **kw)
    add(book, b"a", 0, 100, 0.0)
    add(book, b"b", 1, 101, 0.0)
    return book


def test_book_pairs_jobs_with_ready_workers_only() -> None:
    book = _book()
    assert book.submit(job("Echo", "j1"), 10, None, 0.0) is None
    assert book.assignments() == []
    assert not ready(book, b"a", 999, 0.1)  # impostor: wrong pid
    assert not ready(book, b"zz", 100, 0.1)  # stranger
    assert not ready(book, b"a", 100, 0.1, secret=b"x" * 32)  # impostor: wrong secret
    assert not book.on_ready(b"a", 100, 0.1, "")  # no proof at all
    assert not book.on_ready(b"a", 100, 0.1, "é" * 64)  # non-ASCII proof
    assert book.assignments() == []
    assert ready(book, b"a", 100, 0.1)
    pairs = book.assignments()
    assert [(j.job.job_id, w.identity) for j, w in pairs] == [("j1", b"a")]
    assert book.on_result(b"b", "j1") is None  # not the worker running it
    assert book.on_result(b"a", "j1") is not None
    assert book.status()["workers"][0]["jobs_done"] == 1


def test_book_never_readies_a_worker_spawned_without_a_secret() -> None:
    book = BrokerState(1)
    book.add_worker(b"a", 0, 100, 0.0, secret=b"")
    assert not ready(book, b"a", 100, 0.1, secret=b"")
    assert book.status()["workers"][0]["state"] == "starting"


def test_worker_credentials_round_trip_and_malformed_ones_are_refused() -> None:
    identity, secret = new_credentials(3)
    assert identity.startswith("w3-") and len(secret) == 32
    assert read_credentials(io.BytesIO(encode_credentials(identity, secret))) == (
        identity,
        secret,
    )
    for bad in (b"", b"only-one-line", b"id\nnot-hex\n", b"id\nabcd\n", b"\xff\xfe\n00\n"):
        with pytest.raises(ValueError):
            read_credentials(io.BytesIO(bad))


def test_book_times_out_queued_and_running_jobs_at_their_deadline() -> None:
    book = _book()
    ready(book, b"a", 100, 0.0)
    book.submit(job("Echo", "run"), 1.0, None, 0.0)
    book.assignments()
    book.submit(job("Echo", "queued"), 0.5, None, 0.0)
    book.heard(b"a", 0.45)
    early = book.expire(0.45)
    assert not early.queued and not early.running
    book.heard(b"a", 0.6)
    mid = book.expire(0.6)
    assert [j.job.job_id for j in mid.queued] == ["queued"]
    book.heard(b"a", 1.0)
    late = book.expire(1.0)
    assert [(j.job.job_id, w.identity) for j, w in late.running] == [("run", b"a")]


def test_book_declares_a_silent_worker_hung_after_the_liveness_interval() -> None:
    book = _book()
    ready(book, b"a", 100, 0.0)
    book.submit(job("Sleep", "s"), 100, None, 0.0)
    book.assignments()
    book.heard(b"a", 1.0)
    assert not book.expire(1.25).hung
    hung = book.expire(1.31).hung
    assert [(w.identity, j.job.job_id if j else None) for w, j in hung] == [(b"a", "s")]
    # b never said ready: it gets the startup grace, not the heartbeat limit.
    assert all(w.identity != b"b" for w, _ in hung)
    # (a, declared hung already, is the pool's to kill; idle now, it is not declared again.)
    assert [w.identity for w, _ in book.expire(5.01).hung] == [b"b"]


def test_book_backs_off_respawning_a_slot_whose_workers_die_before_ready() -> None:
    book = _book()
    delays = []
    now = 0.0
    for n in range(4):
        identity = f"x{n}".encode()
        book.remove_worker(b"a" if n == 0 else f"x{n - 1}".encode(), now)
        due = book.slots[0].spawn_at
        assert due is not None
        delays.append(round(due - now, 3))
        assert 0 not in book.slots_to_spawn(now) or delays[-1] == 0
        now = due
        assert 0 in book.slots_to_spawn(now)
        add(book, identity, 0, 200 + n, now)
    assert delays == [0.05, 0.1, 0.2, 0.4]
    ready(book, b"x3", 203, now)
    book.remove_worker(b"x3", now)
    assert book.slots[0].spawn_at == now  # died after ready: replaced at once


def test_book_refuses_duplicates_and_overload() -> None:
    book = _book(max_pending=2)
    assert book.submit(job("Echo", "1"), 1, None, 0.0) is None
    assert book.submit(job("Echo", "1"), 1, None, 0.0) == "duplicate"
    assert book.submit(job("Echo", "2"), 1, None, 0.0) is None
    assert book.submit(job("Echo", "3"), 1, None, 0.0) == "overloaded"


def test_book_cancel_tells_whether_a_worker_must_be_stopped() -> None:
    book = _book()
    ready(book, b"a", 100, 0.0)
    book.submit(job("Echo", "run"), 10, None, 0.0)
    book.assignments()
    book.submit(job("Echo", "wait"), 10, None, 0.0)
    queued, worker = book.cancel("wait")
    assert queued is not None and worker is None
    running, worker = book.cancel("run")
    assert running is not None and worker is not None and worker.identity == b"a"
    assert book.cancel("run") == (None, None)


def test_the_endpoint_falls_back_to_a_short_private_directory_for_a_long_home(
    tmp_path: Path,
) -> None:
    long_home = tmp_path / ("d" * 60) / ("e" * 60)
    endpoint, fallback = broker_endpoint(long_home)
    assert fallback is not None
    try:
        path = endpoint.removeprefix("ipc://")
        assert len(path) <= IPC_PATH_MAX
        assert stat.S_IMODE(fallback.stat().st_mode) == 0o700
        assert stat.S_IMODE((long_home / "workers").stat().st_mode) == 0o700
    finally:
        fallback.rmdir()


def test_results_map_to_and_from_tool_results() -> None:
    ok = ToolResult.success({"a": 1}, meta={"n": 2})
    assert to_tool_result(from_tool_result("j", ok)) == ok
    err = ToolResult.error("invalid-param", "bad", hint="fix it", valid_values=["x", "y"])
    assert to_tool_result(from_tool_result("j", err)) == err
    forged = WorkerResult(job_id="j", status="success", meta={"Bad Key": 1})
    assert to_tool_result(forged).code == "internal-error"


def test_sample_abilities_are_all_process_isolated() -> None:
    registry = sample_registry()
    assert len(registry) >= 10
    assert all(e.cls.isolation == "process" for e in registry)
    assert sample_abilities.Echo.name == "sample_echo"


@pytest.fixture(autouse=True)
def _no_leftover_actors(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if request.node.name.startswith("test_a_restarted_pool"):
        pykka.ActorRegistry.stop_all()


def test_book_tolerates_an_idle_worker_whose_heartbeat_is_late_on_a_loaded_host() -> None:
    book = _book(idle_silence=10.0)
    ready(book, b"a", 100, 0.0)
    ready(book, b"b", 101, 0.0)
    # 0.61 s (the probe's figure) and far more: an idle, live process is not dead.
    assert not book.expire(0.61).hung and not book.expire(5.0).hung
    book.submit(job("Sleep", "s"), 100, None, 5.0)
    (pair,) = book.assignments()
    book.heard(pair[1].identity, 5.0)
    # A worker running a call keeps the strict limit.
    assert [w.identity for w, _ in book.expire(5.31).hung] == [pair[1].identity]
    assert [w.identity for w, _ in book.expire(10.01).hung] != []  # the idle one, at last

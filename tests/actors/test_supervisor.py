"""The supervisor actor with real pykka threads: restarts, escalation, shutdown, ChildRef."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pykka
import pytest

from actors.actor import SupervisedActor
from actors.child_ref import ChildRef, ChildUnavailable
from actors.process.supervisor import Supervisor
from chalie.process.supervision import ChildSpec, OnDemand
from chalie.wire.actor_messages import ChildExit
from tools.waiting import wait_until


@pytest.fixture(autouse=True)
def _no_leftover_actors() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all()


class Journal:
    """What the children did, in order, across incarnations."""

    def __init__(self, fail_starts: int = 0) -> None:
        self.events: list[tuple[str, str]] = []
        self.fail_starts = fail_starts
        self.lock = threading.Lock()

    def add(self, kind: str, who: str) -> None:
        with self.lock:
            self.events.append((kind, who))

    def count(self, kind: str, who: str | None = None) -> int:
        with self.lock:
            return sum(1 for k, w in self.events if k == kind and (who is None or w == who))


class Worker(SupervisedActor):
    def __init__(self, name: str, journal: Journal) -> None:
        super().__init__()
        self.name = name
        self.journal = journal

    def on_start(self) -> None:
        with self.journal.lock:
            failing = self.journal.fail_starts > 0
            self.journal.fail_starts -= 1
        if failing:
            raise RuntimeError(f"{self.name} cannot start")
        self.journal.add("start", self.name)

    def on_stop(self) -> None:
        self.journal.add("stop", self.name)

    def on_receive(self, message: Any) -> Any:
        if message == "ping":
            return self.actor_urn
        if message == "boom":
            raise RuntimeError("boom")
        if message == "slow-boom":
            time.sleep(0.3)
            raise RuntimeError("slow boom")
        if message == "thread-crash":

            def crash() -> None:
                raise ValueError("thread went wrong")

            self.spawn_thread(crash, "crasher")
            return None
        if message == "quit":
            self.stop()
            return None
        return None


def worker_spec(
    name: str, journal: Journal, restart: str = "permanent", shutdown: float = 5.0
) -> ChildSpec:
    return ChildSpec(name, lambda: Worker.start(name, journal), restart, shutdown)  # type: ignore[arg-type]


def start_sup(specs: list[ChildSpec], **kw: Any) -> pykka.ActorRef[Supervisor]:
    kw.setdefault("backoff_base", 0.01)
    return Supervisor.start(specs, **kw)


def status_of(sup: pykka.ActorRef[Supervisor], child_id: str) -> dict[str, Any]:
    status = sup.proxy().status().get(timeout=5)
    return next(c for c in status["children"] if c["id"] == child_id)


def restarted(sup: pykka.ActorRef[Supervisor], child_id: str, times: int) -> Callable[[], bool]:
    def check() -> bool:
        s = status_of(sup, child_id)
        return bool(s["alive"] and s["restarts"] >= times)

    return check


def test_a_child_failing_in_on_start_is_restarted_until_it_starts() -> None:
    journal = Journal(fail_starts=2)
    sup = start_sup([worker_spec("w", journal)])
    wait_until(restarted(sup, "w", 2))
    s = status_of(sup, "w")
    assert s["restarts"] == 2
    assert "cannot start" in s["last_error"]
    assert journal.count("start", "w") == 1


def test_a_child_failing_in_a_message_handler_is_restarted_with_a_new_ref() -> None:
    journal = Journal()
    sup = start_sup([worker_spec("w", journal)])
    old = sup.proxy().child("w").get(timeout=5)
    old.tell("boom")
    wait_until(restarted(sup, "w", 1))
    new = sup.proxy().child("w").get(timeout=5)
    assert new.actor_urn != old.actor_urn
    assert not old.is_alive()
    assert "RuntimeError: boom" in status_of(sup, "w")["last_error"]


def test_a_crash_in_a_thread_of_the_child_restarts_the_child() -> None:
    journal = Journal()
    sup = start_sup([worker_spec("w", journal)])
    old = sup.proxy().child("w").get(timeout=5)
    old.tell("thread-crash")
    wait_until(restarted(sup, "w", 1))
    assert not old.is_alive()
    assert "thread went wrong" in status_of(sup, "w")["last_error"]


def test_permanent_child_is_restarted_even_after_a_normal_stop() -> None:
    journal = Journal()
    sup = start_sup([worker_spec("w", journal, "permanent")])
    sup.proxy().child("w").get(timeout=5).tell("quit")
    wait_until(restarted(sup, "w", 1))
    assert status_of(sup, "w")["last_error"] is None


def decided_not_to_restart(caplog: pytest.LogCaptureFixture, child_id: str) -> Callable[[], bool]:
    # The supervisor logs its decision when it handles the exit: once logged,
    # no restart was scheduled, so there is nothing left to wait for.
    return lambda: any(
        r.getMessage().startswith(f"child {child_id} exited") and "not restarted" in r.getMessage()
        for r in caplog.records
    )


def test_transient_child_is_restarted_after_a_failure_but_not_after_a_normal_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="chalie.supervisor")
    journal = Journal()
    sup = start_sup([worker_spec("t", journal, "transient")])
    sup.proxy().child("t").get(timeout=5).tell("boom")
    wait_until(restarted(sup, "t", 1))
    sup.proxy().child("t").get(timeout=5).tell("quit")
    wait_until(decided_not_to_restart(caplog, "t"))
    s = status_of(sup, "t")
    assert s["alive"] is False and s["restarts"] == 1
    assert sup.proxy().child("t").get(timeout=5) is None


def test_temporary_child_is_never_restarted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="chalie.supervisor")
    journal = Journal()
    sup = start_sup([worker_spec("tmp", journal, "temporary")])
    sup.proxy().child("tmp").get(timeout=5).tell("boom")
    wait_until(decided_not_to_restart(caplog, "tmp"))
    assert status_of(sup, "tmp")["restarts"] == 0
    assert journal.count("start", "tmp") == 1


def test_root_escalation_reports_child_and_last_error_and_stops_the_tree(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="chalie.supervisor")
    journal = Journal(fail_starts=10_000)
    other = Journal()
    escalated: list[tuple[str, str]] = []
    done = threading.Event()

    def on_escalate(child_id: str, error: str) -> None:
        escalated.append((child_id, error))
        done.set()

    sup = start_sup(
        [worker_spec("steady", other), worker_spec("doomed", journal)],
        intensity=3,
        period=10.0,
        on_escalate=on_escalate,
    )
    assert done.wait(5)
    assert escalated[0][0] == "doomed"
    assert "doomed cannot start" in escalated[0][1]
    wait_until(lambda: not sup.is_alive())
    assert other.count("stop", "steady") == 1
    line = next(r.getMessage() for r in caplog.records if "root supervisor" in r.getMessage())
    assert "doomed" in line and "cannot start" in line


def test_a_nested_supervisor_escalates_to_its_parent_which_restarts_it() -> None:
    journal = Journal(fail_starts=10_000)
    escalated: list[tuple[str, str]] = []
    done = threading.Event()

    def inner() -> pykka.ActorRef[Any]:
        return Supervisor.start([worker_spec("leaf", journal)], intensity=1, backoff_base=0.01)

    def on_escalate(child_id: str, error: str) -> None:
        escalated.append((child_id, error))
        done.set()

    root = start_sup([ChildSpec("inner", inner)], intensity=2, period=10.0, on_escalate=on_escalate)
    assert done.wait(10)
    child_id, error = escalated[0]
    assert child_id == "inner"
    assert "leaf" in error and "cannot start" in error
    wait_until(lambda: not root.is_alive())
    # The parent restarted the inner supervisor before giving up itself.
    assert journal.fail_starts < 10_000 - 4


def test_stopping_the_supervisor_stops_children_in_reverse_start_order() -> None:
    journal = Journal()
    sup = start_sup([worker_spec(n, journal) for n in ("a", "b", "c")])
    wait_until(lambda: journal.count("start") == 3)
    sup.stop(timeout=10)
    stops = [w for k, w in journal.events if k == "stop"]
    assert stops == ["c", "b", "a"]
    starts = [w for k, w in journal.events if k == "start"]
    assert starts == ["a", "b", "c"]


class Stubborn(SupervisedActor):
    def on_stop(self) -> None:
        time.sleep(2.0)


def test_a_child_that_will_not_stop_holds_shutdown_only_for_its_timeout() -> None:
    sup = start_sup([ChildSpec("slow", Stubborn.start, shutdown=0.2)])
    wait_until(lambda: status_of(sup, "slow")["alive"])
    began = time.monotonic()
    sup.stop(timeout=10)
    assert time.monotonic() - began < 1.5


def test_a_stale_failure_report_from_an_old_ref_is_ignored() -> None:
    journal = Journal()
    sup = start_sup([worker_spec("w", journal)])
    old = sup.proxy().child("w").get(timeout=5)
    old.tell("boom")
    wait_until(restarted(sup, "w", 1))
    current = sup.proxy().child("w").get(timeout=5)
    sup.tell(ChildExit("w", old.actor_urn, True, "late report"))
    sup.tell(ChildExit("nobody", "urn:x", True, "unknown child"))
    s = status_of(sup, "w")  # an ask: answered after both reports were handled
    assert s["restarts"] == 1 and s["alive"]
    assert s["last_error"] != "late report"
    assert sup.proxy().child("w").get(timeout=5) is current


def test_call_in_flight_at_a_crash_gets_a_structured_error_next_call_reaches_new_child() -> None:
    journal = Journal()
    sup = start_sup([worker_spec("w", journal)])
    ref: ChildRef[Any] = sup.proxy().child_ref("w").get(timeout=5)
    first = ref.ask("ping", timeout=5)
    ref.tell("slow-boom")
    with pytest.raises(ChildUnavailable) as info:
        ref.ask("ping", timeout=5)
    assert info.value.child_id == "w"
    result = info.value.result()
    assert result.code == "internal-error" and result.hint
    wait_until(restarted(sup, "w", 1))
    second = ref.ask("ping", timeout=5)
    assert second != first
    assert ref.within(5).call(Worker.on_receive, "ping") == second


def test_a_typed_handle_checks_the_kind_of_actor_it_reaches() -> None:
    from actors.directory import Directory

    journal = Journal()
    directory = Directory()
    sup = start_sup([worker_spec("w", journal)], directory=directory)
    wait_until(lambda: directory.get("w") is not None)
    worker = directory.ref("w", Worker).within(5)
    assert worker.call(Worker.on_receive, "ping") == worker.ask("ping", timeout=5)
    wrong = directory.ref("w", Stubborn)
    with pytest.raises(ChildUnavailable, match="not a Stubborn"):
        wrong.current()
    with pytest.raises(ChildUnavailable, match="not running"):
        directory.ref("nobody", Worker).tell("ping")
    sup.stop()


class Plain(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> Any:
        if message == "quit":
            self.stop()
        return None


def test_a_plain_actor_child_that_dies_is_noticed_and_restarted() -> None:
    sup = start_sup([ChildSpec("plain", Plain.start)])
    old = sup.proxy().child("plain").get(timeout=5)
    old.tell("quit")
    wait_until(restarted(sup, "plain", 1))
    assert sup.proxy().child("plain").get(timeout=5).actor_urn != old.actor_urn


def test_a_start_function_that_raises_is_retried_then_escalated() -> None:
    calls: list[int] = []
    done = threading.Event()

    def bad_start() -> pykka.ActorRef[Any]:
        calls.append(1)
        raise OSError("no such thing")

    sup = start_sup([ChildSpec("bad", bad_start)], intensity=2, on_escalate=lambda c, e: done.set())
    assert done.wait(5)
    assert len(calls) == 3
    wait_until(lambda: not sup.is_alive())


# -- acall: async code awaits an actor without a thread blocked on it --------------------------


class Answers(SupervisedActor):
    def __init__(self, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.gate = gate

    def double(self, n: int) -> int:
        return n * 2

    def fail(self) -> int:
        raise LookupError("no such thing")

    def hold(self) -> int:
        assert self.gate is not None
        self.gate.wait(10)
        return 1


class NotSupervised(pykka.ThreadingActor):
    def double(self, n: int) -> int:
        return n * 2


def test_acall_answers_values_and_errors_on_the_loop() -> None:
    import asyncio

    from actors.child_ref import ChildRef, ChildUnavailable

    ref = Answers.start()
    child = ChildRef.to(ref)

    async def scenario() -> None:
        loop_thread = threading.get_ident()
        assert await child.acall(Answers.double, 21) == 42
        with pytest.raises(LookupError, match="no such thing"):
            await child.acall(Answers.fail)
        results = await asyncio.gather(*(child.acall(Answers.double, i) for i in range(50)))
        assert results == [2 * i for i in range(50)]
        assert threading.get_ident() == loop_thread

    asyncio.run(scenario())
    ref.stop()

    async def dead() -> None:
        with pytest.raises(ChildUnavailable):
            await child.acall(Answers.double, 1)

    asyncio.run(dead())


def test_acall_on_an_actor_stopped_with_the_call_queued_fails_at_once_and_times_out() -> None:
    import asyncio

    from actors.child_ref import ChildRef, ChildUnavailable

    gate = threading.Event()
    ref = Answers.start(gate)
    child = ChildRef.to(ref).within(0.3)

    async def scenario() -> None:
        held = asyncio.ensure_future(child.within(30).acall(Answers.hold))
        await asyncio.sleep(0)  # the held call is in the actor's hands
        with pytest.raises(TimeoutError):  # the actor is busy past the call's timeout
            await child.acall(Answers.double, 1)
        stopped = ref.stop(block=False)  # the stop is queued behind the held call...
        queued = asyncio.ensure_future(child.within(30).acall(Answers.double, 2))
        await asyncio.sleep(0)  # ...and this call behind the stop
        gate.set()
        assert await held == 1
        with pytest.raises(ChildUnavailable):  # failed by the stop, not after 30 s
            await asyncio.wait_for(queued, 10)
        stopped.get(timeout=10)

    asyncio.run(scenario())


def test_acall_refuses_an_actor_whose_futures_cannot_call_back() -> None:
    import asyncio

    from actors.child_ref import ChildRef

    ref = NotSupervised.start()
    try:
        with pytest.raises(TypeError):
            asyncio.run(ChildRef.to(ref).acall(NotSupervised.double, 1))
    finally:
        ref.stop()


def test_a_child_added_at_run_time_is_supervised_and_a_removed_one_stays_stopped() -> None:
    journal = Journal()
    sup = start_sup([worker_spec("w", journal)])
    sup.proxy().add_child(worker_spec("late", journal)).get(timeout=5)
    late = sup.proxy().child("late").get(timeout=5)
    assert late is not None and late.ask("ping", timeout=5) == late.actor_urn
    with pytest.raises(ValueError, match="two children with id 'late'"):
        sup.proxy().add_child(worker_spec("late", journal)).get(timeout=5)
    late.tell("boom")  # supervised like a child given at start
    wait_until(restarted(sup, "late", 1))
    again = sup.proxy().child("late").get(timeout=5)
    again.tell("slow-boom")  # its restart is scheduled after the removal below
    assert sup.proxy().remove_child("late").get(timeout=5) is True
    assert not again.is_alive()
    assert sup.proxy().child("late").get(timeout=5) is None
    assert sup.proxy().remove_child("late").get(timeout=5) is False
    # the supervisor still serves: a new child under the same id starts afresh
    sup.proxy().add_child(worker_spec("late", journal)).get(timeout=5)
    wait_until(lambda: status_of(sup, "late")["alive"])
    assert status_of(sup, "late")["restarts"] == 0
    assert [c["id"] for c in sup.proxy().status().get(timeout=5)["children"]] == ["w", "late"]


def test_a_transient_child_added_at_run_time_is_restarted_after_a_crash_forgotten_after_exit() -> (
    None
):
    """OTP's simple_one_for_one children, from an OnDemand template."""
    journal = Journal()
    turns = OnDemand("worker", restart="transient", shutdown=1.0)
    sup = start_sup([])
    sup.proxy().add_child(turns.spec("k1", lambda: Worker.start("k1", journal))).get(timeout=5)
    first = sup.proxy().child("k1").get(timeout=5)
    first.tell("boom")
    wait_until(restarted(sup, "k1", 1), what="the crashed child's restart")
    again = sup.proxy().child("k1").get(timeout=5)
    assert again.actor_urn != first.actor_urn
    again.tell("quit")  # a normal exit: final, and the child is forgotten
    wait_until(lambda: not sup.proxy().has_child("k1").get(timeout=5), what="k1 forgotten")
    assert sup.proxy().status().get(timeout=5)["children"] == []
    assert journal.count("start", "k1") == 2


class Held(SupervisedActor):
    """A child whose stop lasts until the test lets it go (30 s at most: a guard)."""

    def __init__(self, journal: Journal, release: threading.Event) -> None:
        super().__init__()
        self.journal = journal
        self.release = release

    def on_stop(self) -> None:
        self.release.wait(30)
        self.journal.add("stop", "slow")


class Gathered(SupervisedActor):
    """A child whose stop ends only when all its siblings are stopping at the same time."""

    def __init__(self, journal: Journal, together: threading.Barrier) -> None:
        super().__init__()
        self.journal = journal
        self.together = together

    def on_stop(self) -> None:
        try:
            self.together.wait()
        except threading.BrokenBarrierError:
            self.journal.add("alone", "slow")  # the others were not stopping meanwhile
        else:
            self.journal.add("stop", "slow")


class Dismisser(Supervisor):
    """A supervisor whose own handler dismisses a child (as Conversations does)."""

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, tuple) and message[0] == "dismiss":
            _, child_id, journal = message
            self.dismiss_child(child_id, then=lambda: journal.add("then", child_id))
            journal.add("dismissed", child_id)
            return None
        return super().on_receive(message)


@pytest.mark.parametrize("hangs, shutdown", [(False, 5.0), (True, 0.3)])
def test_a_dismissed_child_stops_without_blocking_its_supervisor_and_then_runs_after(
    hangs: bool, shutdown: float
) -> None:
    """``then`` runs once the child stopped, or once its shutdown time is up if it hangs."""
    journal = Journal()
    release = threading.Event()
    sup = Dismisser.start([], backoff_base=0.01)
    spec = ChildSpec("slow", lambda: Held.start(journal, release), "transient", shutdown)
    sup.proxy().add_child(spec).get(timeout=5)
    sup.tell(("dismiss", "slow", journal))
    # The supervisor answers at once while the child is still stopping.
    assert sup.proxy().has_child("slow").get(timeout=5) is False
    assert journal.count("then") == 0
    if not hangs:
        release.set()  # the child's stop ends well within its shutdown time
    try:
        wait_until(lambda: journal.count("then") == 1, timeout=10, what="then")
        assert journal.count("stop", "slow") == (0 if hangs else 1)
        assert sup.proxy().dismiss_child("slow").get(timeout=5) is False
    finally:
        release.set()


class Hostess(Supervisor):
    STOP_TOGETHER = True


def test_children_that_stop_together_stop_in_the_time_of_the_slowest() -> None:
    journal = Journal()
    # Each child's stop waits for all four to be stopping: one by one, the first would wait
    # in vain until the barrier's timeout breaks it.
    together = threading.Barrier(4, timeout=10)
    sup = Hostess.start(
        [ChildSpec(f"s{i}", lambda: Gathered.start(journal, together)) for i in range(4)]
    )
    wait_until(lambda: all(c["alive"] for c in sup.proxy().status().get(timeout=5)["children"]))
    sup.stop(timeout=30)
    assert journal.count("stop", "slow") == 4 and journal.count("alone", "slow") == 0


class _Holder(SupervisedActor):
    """Releases what it holds in on_end alone; fails on the message "fail"."""

    def __init__(self, ended: list[str]) -> None:
        super().__init__()
        self.ended = ended

    def on_receive(self, message: Any) -> Any:
        if message == "fail":
            raise RuntimeError("asked to fail")
        return super().on_receive(message)

    def on_end(self) -> None:
        self.ended.append("ended")


def test_on_end_runs_once_on_a_stop_and_once_on_a_failure() -> None:
    stopped: list[str] = []
    ref = _Holder.start(stopped)
    ref.stop()
    assert stopped == ["ended"]
    failed: list[str] = []
    ref = _Holder.start(failed)
    ref.tell("fail")
    wait_until(lambda: bool(failed) and not ref.is_alive(), timeout=5)
    assert failed == ["ended"]

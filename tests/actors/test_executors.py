"""The dispatcher's seams and the defects a review found: executors, gated params, scope, outbox."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar, get_args

import msgspec
import pykka
import pytest

from actors.calls.dispatcher import DispatcherActor, submit
from actors.calls.executors import EXECUTORS, ExecutorEnv
from chalie.ability import Ability
from chalie.calls.envelope import parse
from chalie.calls.execution import Done, Executor, Job
from chalie.calls.outbox import Outbox, OutboxError
from chalie.process.config import WorkerEngine
from chalie.result import ToolResult
from chalie.services import Services
from chalie.store.store_place import Place
from chalie.wire.events import BackgroundResult
from chalie.wire.messages import ISOLATIONS, ToolCall, TurnContext
from tests.actors.rig import EX, Rig, ctx
from tools import sample_abilities
from tools.waiting import wait_until


@pytest.fixture(autouse=True)
def _no_leftover_actors() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all()


class Files(Ability):
    """The default action is the dangerous one."""

    name = "files"
    summary = "Files."
    tooltip = "files"
    examples = EX
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["list", "delete_all"], "default": "delete_all"},
            "path": {"type": "string", "default": "/"},
        },
        "additionalProperties": False,
    }
    actions = {"list": (), "delete_all": ()}
    ran: ClassVar[list[dict[str, Any]]] = []

    def run(self, params: dict[str, Any]) -> ToolResult:
        Files.ran.append(dict(params))
        return ToolResult.success(f"ran {params['action']}")


class Card(Ability):
    name = "card"
    summary = "A card."
    tooltip = "card"
    examples = EX

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success("see the card", rich={"card": {"title": "t"}})


class Remote(Ability):
    """Runs through a third executor registered under isolation "mcp"."""

    name = "remote"
    summary = "A remote tool."
    tooltip = "remote"
    examples = EX
    isolation = "mcp"


class EchoExecutor:
    """A third executor: answers every job with its params, from another thread."""

    def __init__(self, env: ExecutorEnv) -> None:
        self.env = env
        self.cancelled: list[str] = []

    def start(self, job: Job, done: Done) -> None:
        threading.Thread(target=lambda: done(ToolResult.success(f"remote {job.params}"))).start()

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)

    def close(self) -> None:
        pass


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    r = Rig(tmp_path)
    for cls in (Files, Card):
        r.registry.add(cls, source="tests")
    Files.ran.clear()
    r.policy.proxy().set("chat", "card", "allow").get()
    return r


# -- section 1: the gate sees what runs --------------------------------------------------


def test_a_default_action_is_gated_as_that_action(rig: Rig) -> None:
    rig.policy.proxy().set("chat", "files", "allow").get()
    rig.policy.proxy().set("chat", "files.delete_all", "deny").get()
    outcome = rig.run("files", {})
    assert outcome.code == "permission-denied" and "files.delete_all" in outcome.envelope
    assert Files.ran == []
    (row,) = rig.rows()
    assert row.permission == "files.delete_all" and row.decision == "deny"


def test_the_tool_runs_with_exactly_the_params_the_gate_saw(rig: Rig) -> None:
    rig.policy.proxy().set("chat", "files", "allow").get()
    assert rig.run("files", {"action": "list"}).status == "success"
    (row,) = rig.rows()
    assert Files.ran == [{"action": "list", "path": "/"}]
    assert msgspec.json.decode(row.params) == Files.ran[0]
    assert row.permission == "files.list"


@pytest.mark.parametrize("summary", [None, "", "   "])
def test_a_model_call_without_act_summary_runs_with_one_written(rig: Rig, summary: Any) -> None:
    args: dict[str, Any] = {} if summary is None else {"act_summary": summary}
    call = ToolCall(call_id="c", tool="fast", arguments=args, context=ctx())
    outcome = submit(rig.ref, call).result(5)
    assert outcome.status == "success"
    (row,) = rig.rows()
    assert row.act_summary == "test" and row.healed.startswith("act_summary")  # the tooltip


def test_a_framework_call_may_omit_act_summary(rig: Rig) -> None:
    call = ToolCall(call_id="c", tool="fast", arguments={}, context=ctx(initiator="framework"))
    assert submit(rig.ref, call).result(5).status == "success"
    assert rig.rows()[0].act_summary  # the runtime supplied one


def test_an_oversized_act_summary_is_cut_to_the_descriptor_limit(rig: Rig) -> None:
    outcome = rig.run("fast", {"act_summary": "y" * 100_000})
    assert outcome.status == "success"
    assert rig.rows()[0].act_summary == "y" * 200


def test_a_restricted_turn_with_no_tools_can_call_nothing(rig: Rig) -> None:
    closed = ctx(scope="restricted")
    assert rig.run("fast", context=closed).code == "unknown-tool"
    rig.services.turns.inject(closed.turn_id, ["fast"])
    assert rig.run("fast", context=closed).status == "success"
    assert rig.run("lookup", context=closed).code == "unknown-tool"


# -- section 2: rich payloads, the outbox -------------------------------------------------


def test_a_rich_payload_reaches_the_outcome_and_stays_out_of_the_envelope(rig: Rig) -> None:
    outcome = rig.run("card")
    assert outcome.rich == {"card": {"title": "t"}}
    assert "title" not in outcome.envelope


class Unsendable(Card):
    name = "unsendable"

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success("body", rich={"thing": object()})


class Enormous(Card):
    name = "enormous"

    def run(self, params: Any) -> ToolResult:
        return ToolResult.success("body", rich={"blob": "x" * (5 << 20)})


@pytest.mark.parametrize("cls", [Unsendable, Enormous])
def test_a_rich_payload_that_cannot_be_carried_is_a_fault_in_the_tool(
    rig: Rig, cls: type[Ability]
) -> None:
    rig.registry.add(cls, source="tests")
    rig.policy.proxy().set("chat", cls.name, "allow").get()
    outcome = rig.run(cls.name)
    assert outcome.code == "non-canonical-result" and outcome.rich is None
    msgspec.msgpack.encode(outcome)  # the outcome itself can always be sent


def test_a_background_result_waits_in_the_outbox_until_acknowledged(
    tmp_path: Path, rig: Rig
) -> None:
    context = ctx(conversation="conv-box", allow_async=True)
    first = rig.run("card", {"async": True}, call_id="bg", context=context)
    assert first.background and first.status == "success"
    box = Outbox(rig.db)
    wait_until(lambda: len(box.pending("conv-box")) == 1)
    (held,) = box.pending("conv-box")
    assert (held.call_id, held.tool, held.status) == ("bg", "card", "success")
    assert held.rich == {"card": {"title": "t"}} and "see the card" in held.envelope
    # Nobody listened, and the daemon "restarts": the result is still there.
    rig.ref.stop()
    box.close()
    again = Outbox(rig.db)
    (kept,) = again.pending("conv-box")
    assert kept.outbox_id == held.outbox_id
    assert again.ack([kept.outbox_id]) == 1
    assert again.pending("conv-box") == [] and again.ack([kept.outbox_id]) == 0
    again.close()


def test_the_published_background_result_names_its_outbox_row(rig: Rig) -> None:
    context = ctx(conversation="conv-pub", allow_async=True)
    rig.run("card", {"async": True}, call_id="bg2", context=context)
    event = rig.events.queue.get(timeout=5)
    assert isinstance(event, BackgroundResult) and event.outbox_id > 0
    assert event.rich == {"card": {"title": "t"}}


def test_an_outbox_result_is_kept_until_acknowledged_on_either_engine(store_place: Place) -> None:
    box = Outbox(store_place)
    made = [
        box.put(
            BackgroundResult(
                call_id=f"c{i}",
                conversation_id="k" if i < 2 else "other",
                tool="t",
                envelope="e",
                status="success",
                rich={"n": i} if i else None,
            )
        )
        for i in range(3)
    ]
    ids = [m.outbox_id for m in made]
    assert ids == sorted(ids) and len(set(ids)) == 3 and ids[0] > 0
    assert box.waiting() == ["k", "other"]
    held = box.pending("k")
    assert [(r.call_id, r.rich) for r in held] == [("c0", None), ("c1", {"n": 1})]
    assert box.ack([ids[0], ids[1], 10**12]) == 2 and box.ack([ids[0]]) == 0
    assert box.pending("k") == [] and box.waiting() == ["other"]
    box.close()


def test_the_outbox_drops_results_past_its_limits(store_place: Place) -> None:
    box = Outbox(store_place, max_rows=3)
    for i in range(5):
        box.put(
            BackgroundResult(
                call_id=f"c{i}", conversation_id="k", tool="t", envelope="e", status="success"
            )
        )
    box.prune()
    assert [r.call_id for r in box.pending("k")] == ["c2", "c3", "c4"]
    box.close()
    aged = Outbox(store_place, max_age=1e-9)
    assert aged.pending("k") == []
    aged.close()


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda b: b.pending(""), OutboxError),
        (lambda b: b.pending(123), OutboxError),
        (lambda b: b.pending("k", limit=10**9), OutboxError),
        (lambda b: b.ack(["x"]), OutboxError),
        (lambda b: b.ack([1.5]), OutboxError),
        (lambda b: b.ack(range(20_000)), OutboxError),
        (lambda b: b.ack(None), OutboxError),
    ],
)
def test_the_outbox_refuses_bad_arguments(tmp_path: Path, call: Any, error: type) -> None:
    box = Outbox(tmp_path / "o.db")
    with pytest.raises(error):
        call(box)
    box.close()


@pytest.mark.parametrize(
    "bad", [{"max_age": 0}, {"max_age": float("nan")}, {"max_rows": 0}, {"max_rows": True}]
)
def test_bad_outbox_limits_are_refused(tmp_path: Path, bad: dict[str, Any]) -> None:
    with pytest.raises(OutboxError):
        Outbox(tmp_path / "o.db", **bad)


def test_a_worker_result_carries_its_rich_payload(tmp_path: Path) -> None:
    from actors.workers.worker_pool import WorkerPoolActor, WorkerPoolHandle

    handle = WorkerPoolHandle()
    pool = WorkerPoolActor.start(tmp_path / "home", workers=1, handle=handle)
    try:
        rig = Rig(tmp_path, workers=handle)
        rig.registry.add(sample_abilities.RichCard, source="tests")
        rig.policy.proxy().set("chat", "sample_rich_card", "allow").get()
        outcome = rig.call("sample_rich_card").result(20)
        assert outcome.status == "success", outcome.envelope
        assert outcome.rich == {"card": {"title": "hi", "n": 2}}
    finally:
        pool.stop()


# -- section 3: the executor seam ------------------------------------------------------------


def test_a_third_executor_is_one_row_in_the_table(tmp_path: Path) -> None:
    made: list[EchoExecutor] = []

    def factory(env: ExecutorEnv) -> Executor:
        made.append(EchoExecutor(env))
        return made[-1]

    from actors.directory import Directory
    from actors.gate.policy import PolicyActor

    children = Directory()
    rig = Rig(
        tmp_path, executors={**EXECUTORS, "mcp": factory}, parts={"mcp": "conn"}, children=children
    )
    children.set("policy", rig.policy)
    rig.registry.add(Remote, source="tests")
    rig.policy.proxy().set("chat", "remote", "allow").get()
    outcome = rig.run("remote", {})
    assert outcome.status == "success" and "remote {}" in outcome.envelope
    assert made[0].env.parts == {"mcp": "conn"}
    # An executor reaches the actor it talks to through the tree's directory, typed.
    assert made[0].env.children.ref("policy", PolicyActor).current() is rig.policy
    assert rig.run("fast").status == "success"  # the other rows still work


def test_an_isolation_without_an_executor_is_an_internal_error(rig: Rig) -> None:
    rig.registry.add(Remote, source="tests")
    rig.policy.proxy().set("chat", "remote", "allow").get()
    outcome = rig.run("remote")
    assert outcome.code == "internal-error" and "no such executor" in outcome.envelope


class Late:
    """An executor that answers only when told to, to show a late answer is ignored."""

    def __init__(self, env: ExecutorEnv) -> None:
        self.pending: list[Done] = []
        self.cancelled: list[str] = []

    def start(self, job: Job, done: Done) -> None:
        self.pending.append(done)

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)

    def close(self) -> None:
        pass


class SlowRemote(Remote):
    name = "slow_remote"
    timeout = 0.2


def test_a_result_after_the_deadline_is_ignored_and_the_job_cancelled(tmp_path: Path) -> None:
    made: list[Late] = []

    def factory(env: ExecutorEnv) -> Executor:
        made.append(Late(env))
        return made[-1]

    rig = Rig(tmp_path, executors={**EXECUTORS, "mcp": factory})
    rig.registry.add(SlowRemote, source="tests")
    rig.policy.proxy().set("chat", "slow_remote", "allow").get()
    outcome = rig.run("slow_remote")
    assert outcome.code == "tool-timeout"
    assert len(made[0].cancelled) == 1
    made[0].pending[0](ToolResult.success("too late"))
    # The dispatcher still answers, and the trail keeps the timeout.
    assert rig.run("fast").status == "success"
    rows = {r.tool: r for r in rig.rows()}
    assert rows["slow_remote"].code == "tool-timeout"


def test_executor_done_is_turned_into_a_message_on_the_dispatcher_thread(tmp_path: Path) -> None:
    seen: list[str] = []

    class Spy(DispatcherActor):
        def _finish(self, state: Any, result: ToolResult) -> bool:
            seen.append(threading.current_thread().name)
            return super()._finish(state, result)

        def thread_name(self) -> str:
            return threading.current_thread().name

    bus_rig = Rig(tmp_path)
    ref = Spy.start(bus_rig.registry, Services(), bus_rig.db, bus_rig.policy, None, bus_rig.bus)
    own = ref.proxy().thread_name().get(timeout=5)
    out: Future[Any] = submit(
        ref, ToolCall(call_id="x", tool="fast", arguments={"act_summary": "s"}, context=ctx())
    )
    assert out.result(5).status == "success"
    assert seen == [own] and not own.startswith("chalie-inline")
    (env,) = parse(out.result().envelope)
    assert env.content == "fast"


def test_the_context_says_restricted_unless_the_runtime_says_otherwise() -> None:
    plain = TurnContext(conversation_id="c", turn_id="t")
    assert (plain.scope, plain.initiator) == ("restricted", "model")
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(
            {"conversation_id": "c", "turn_id": "t", "scope": "everything"}, TurnContext
        )


# -- TurnTools: released at the end of a turn, bounded when a turn never ends ----------------


def test_turn_tools_are_released_at_the_end_of_a_turn() -> None:
    from chalie.services import TurnTools

    turns = TurnTools()
    turns.inject("t", ["a", "b"])
    assert turns.injected("t") == {"a", "b"}
    turns.forget("t")
    assert turns.injected("t") == frozenset() and len(turns) == 0


def test_turn_tools_stay_bounded_when_turns_never_end() -> None:
    from chalie.services import TurnTools

    now = [0.0]
    turns = TurnTools(max_turns=100, max_names=5, max_age=60.0, clock=lambda: now[0])
    for i in range(1000):
        turns.inject(f"t{i}", [f"tool{j}" for j in range(50)])
    assert len(turns) == 100 and turns.injected("t0") == frozenset()
    assert len(turns.injected("t999")) == 5
    now[0] = 61.0
    assert turns.injected("t999") == frozenset()
    turns.inject("fresh", ["x"])
    assert len(turns) == 1


def test_the_executor_table_has_one_row_for_each_isolation() -> None:
    # An ability may declare any Isolation; the dispatcher must have an executor for each,
    # and a row no ability can select is dead.
    assert sorted(EXECUTORS) == sorted(ISOLATIONS)


def test_the_local_engine_costs_no_ray_import() -> None:
    """With the default [workers] engine, the daemon's modules and its executors load no Ray."""
    code = (
        "import sys\n"
        "import chalie_app.cli, chalie_app.root, chalie.process.daemon, actors.calls.dispatcher\n"
        "import actors.calls.executors.ray_tasks\n"
        "from actors.calls.executors import ExecutorEnv, build\n"
        "from chalie.process.config import Config\n"
        "settings = Config.load(sys.argv[1]).worker_settings\n"
        "built = build(ExecutorEnv(worker_settings=settings))\n"
        "print(type(built['process']).__name__, 'ray' in sys.modules)\n"
    )
    with tempfile.TemporaryDirectory() as home:
        out = subprocess.run(
            [sys.executable, "-c", code, home], capture_output=True, text=True, check=False
        )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ProcessExecutor", "False"]


def test_the_ray_engine_is_one_row_of_the_worker_engines() -> None:
    from actors.calls.executors import WORKER_ENGINES

    assert set(WORKER_ENGINES) == {"local", "ray"}
    assert set(WORKER_ENGINES) == set(get_args(WorkerEngine))

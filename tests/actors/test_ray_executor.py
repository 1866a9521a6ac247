"""Worker abilities on a real Ray cluster ([workers] engine = "ray"), through the real dispatcher.

One Ray head per module (``ray start --head`` takes seconds on two cores),
with token authentication and a ``chromium`` custom resource; each test's
dispatcher joins it as a Ray driver and leaves it when the test ends. The
last test runs a whole daemon on the same head.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest

from actors.executors.ray_tasks import RayExecutor
from chalie.config import RayTaskConfig, WorkersConfig
from chalie.execution import Job
from chalie.registry import Registry
from chalie.result import ToolResult
from tests.actors.rig import Rig, attrs, ctx
from tests.daemon_process import DaemonProcess, short_home
from tools.ray_head import RayHead
from tools.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    # Ray's own modules warn on import and shutdown; they are not this code's warnings.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

if importlib.util.find_spec("ray") is None:  # the chalie[ray] extra is not installed
    pytest.skip("Ray is not installed", allow_module_level=True)

CPUS = 2


@pytest.fixture(scope="module")
def head() -> Iterator[RayHead]:
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
    with RayHead(cpus=CPUS, resources={"chromium": 1}) as started:
        os.environ.update(started.env)
        try:
            yield started
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture(autouse=True)
def _leave_the_cluster() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all()  # each dispatcher closes its executor: ray.shutdown
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


def settings(head: RayHead, **over: Any) -> WorkersConfig:
    return WorkersConfig(engine="ray", address=head.address, **over)


def rig(tmp_path: Path, head: RayHead, **over: Any) -> Rig:
    return Rig(tmp_path, worker_settings=settings(head, **over))


def cpus_free() -> float:
    """The cluster's free CPUs, as this process (a Ray driver by now) sees them.

    Ray is imported after the head fixture put the token in the environment: Ray
    reads its settings when it is first loaded."""
    import ray

    return float(ray.available_resources().get("CPU", 0.0))


def ray_worker(pid: int) -> bool:
    """Whether ``pid`` is a process Ray started to run tasks (not this test, not a pool worker)."""
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    return b"ray" in cmdline and pid != os.getpid()


def test_a_worker_ability_runs_as_a_ray_task_with_the_same_envelope(
    tmp_path: Path, head: RayHead
) -> None:
    r = rig(tmp_path, head)
    out = r.call("sample_echo", {"text": "hi"}, context=ctx(conversation="c-ray")).result(120)
    assert out.status == "success", out.envelope
    assert "hi" in out.envelope
    (row,) = r.rows()
    assert row.status == "success"
    pid = int(attrs(out)["pid"])
    assert ray_worker(pid)
    assert attrs(out)["conversation"] == "c-ray"  # the turn's context travelled with the job


def test_a_call_past_its_timeout_is_a_tool_timeout_and_its_task_is_killed(
    tmp_path: Path, head: RayHead
) -> None:
    r = rig(tmp_path, head)
    assert r.run("sample_echo", {"text": "warm"}).status == "success"  # connected
    out = r.call("sample_short_sleep", {"seconds": 60}).result(30)
    assert out.code == "tool-timeout"
    # The task's CPU comes back long before its 60 s sleep would end: ray.cancel killed it.
    wait_until(lambda: cpus_free() == CPUS, 20, what="the timed-out task's CPU released")
    assert r.rows(tool="sample_short_sleep")[0].code == "tool-timeout"


def test_cancelling_the_turn_cancels_the_ray_task(tmp_path: Path, head: RayHead) -> None:
    r = rig(tmp_path, head)
    assert r.run("sample_echo", {"text": "warm"}).status == "success"
    pending = r.call("sample_sleep", {"seconds": 60}, context=ctx(turn="t-cancel"))
    wait_until(lambda: cpus_free() < CPUS, 20, what="the task running on the cluster")
    assert r.ref.proxy().cancel_turn("t-cancel").get(timeout=10) == 1
    assert pending.result(10).code == "cancelled"
    wait_until(lambda: cpus_free() == CPUS, 20, what="the cancelled task's CPU released")


@pytest.mark.parametrize("tool", ["sample_kill_self", "sample_exit"])
def test_a_task_whose_worker_dies_is_worker_crashed_as_in_the_local_pool(
    tmp_path: Path, head: RayHead, tool: str
) -> None:
    r = Rig(tmp_path, worker_settings=settings(head))
    from tools import sample_abilities

    r.registry.add(sample_abilities.Exit, source="tests")
    r.policy.proxy().set("chat", "sample_exit", "allow").get()
    out = r.call(tool).result(120)
    assert out.code == "worker-crashed", out.envelope
    assert r.rows()[0].code == "worker-crashed"
    assert r.run("sample_echo", {"text": "after"}).status == "success"  # the cluster serves on


COUNTING_CRASH = textwrap.dedent(
    '''
    """A drop-in that counts its runs in a file beside it, then dies."""
    import os

    from chalie.ability import Ability

    COUNT_FILE = {count!r}

    class CountThenDie(Ability):
        name = "count_then_die"
        summary = "Append a line to a file, then end the process."
        tooltip = "count then die"
        examples = ("one", "two", "three", "four", "five", "six")
        isolation = "process"

        def run(self, params):
            with open(COUNT_FILE, "a") as f:
                f.write("ran\\n")
            os._exit(7)
    '''
)


def test_a_crashed_call_is_never_run_a_second_time(tmp_path: Path, head: RayHead) -> None:
    count = tmp_path / "count.txt"
    dropins = tmp_path / "dropins"
    dropins.mkdir()
    (dropins / "count_then_die.py").write_text(
        COUNTING_CRASH.replace("{count!r}", repr(str(count)))
    )
    executor = RayExecutor(settings(head, ship_dropins=False), dropins)
    try:
        result = run_one(executor, dropins, "count_then_die")
        assert result.code == "worker-crashed"
    finally:
        executor.close()
    # Ray retries a task whose worker died three times by default; a call with side
    # effects must run once.
    assert count.read_text() == "ran\n"


SHIPPED = textwrap.dedent(
    '''
    """A drop-in that says where it runs from."""
    import os

    from chalie.ability import Ability
    from chalie.result import ToolResult

    class WhereAmI(Ability):
        name = "where_am_i"
        summary = "Report the folder this ability's module was loaded from."
        tooltip = "where"
        examples = ("one", "two", "three", "four", "five", "six")
        isolation = "process"

        def run(self, params):
            return ToolResult.success(os.path.dirname(os.path.abspath(__file__)))
    '''
)


def run_one(executor: RayExecutor, dropins: Path, tool: str, timeout: float = 120) -> ToolResult:
    """One call of a drop-in straight through the executor (no dispatcher)."""
    from concurrent.futures import Future

    registry = Registry.collect(package=None, entry_points=False, dropin=dropins)
    entry = registry.get(tool)
    assert entry is not None, registry.failures
    job = Job(
        job_id=f"job-{tool}",
        call_id=f"call-{tool}",
        entry=entry,
        instance=entry.cls(ctx()),
        params={},
        value=None,
        context=ctx(),
        timeout=timeout,
    )
    done: Future[ToolResult] = Future()
    executor.start(job, done.set_result)
    return done.result(timeout)


def test_drop_ins_are_shipped_to_the_cluster_with_the_runtime_env(
    tmp_path: Path, head: RayHead
) -> None:
    dropins = tmp_path / "dropins"
    dropins.mkdir()
    (dropins / "where_am_i.py").write_text(SHIPPED)
    executor = RayExecutor(settings(head), dropins)
    try:
        wait_until(lambda: executor.status()["state"] == "ready", 120, what="connected")
        assert executor.status()["dropins_shipped"] is True
        # The folder is gone from this host: the cluster runs the copy Ray was given.
        dropins.rename(tmp_path / "moved")
        result = run_one_entry(executor, tmp_path / "moved", "where_am_i", dropins)
        assert result.status == "success", result.body
        assert "working_dir_files" in str(result.body)
        assert str(tmp_path) not in str(result.body)
    finally:
        executor.close()


def run_one_entry(executor: RayExecutor, found_in: Path, tool: str, dropins: Path) -> ToolResult:
    """Like :func:`run_one`, with the entry's reference naming the original folder."""
    from concurrent.futures import Future

    from chalie.registry import Entry

    registry = Registry.collect(package=None, entry_points=False, dropin=found_in)
    entry = registry.get(tool)
    assert entry is not None, registry.failures
    ref = entry.ref.replace(str(found_in.resolve()), str(dropins.resolve()))
    job = Job(
        job_id=f"job-{tool}",
        call_id=f"call-{tool}",
        entry=Entry(entry.cls, entry.source, ref),
        instance=entry.cls(ctx()),
        params={},
        value=None,
        context=ctx(),
        timeout=120,
    )
    done: Future[ToolResult] = Future()
    executor.start(job, done.set_result)
    return done.result(120)


def test_an_ability_runs_only_on_a_node_with_the_resource_it_asks_for(
    tmp_path: Path, head: RayHead
) -> None:
    wants = {
        "sample_echo": RayTaskConfig(resources={"chromium": 1}),  # the head has it
        "sample_short_sleep": RayTaskConfig(resources={"gpu_box": 1}),  # no node has it
    }
    r = rig(tmp_path, head, abilities=wants)
    assert r.call("sample_echo", {"text": "x"}).result(120).status == "success"
    # Nothing can run it: it waits unscheduled until its deadline, then is withdrawn.
    out = r.call("sample_short_sleep", {"seconds": 0.01}).result(30)
    assert out.code == "tool-timeout"


def test_an_unreachable_cluster_is_service_unavailable_not_a_hang(tmp_path: Path) -> None:
    from tools.ray_head import free_port

    r = Rig(
        tmp_path,
        worker_settings=WorkersConfig(engine="ray", address=f"127.0.0.1:{free_port()}"),
    )
    out = r.call("sample_echo", {"text": "x"}).result(120)
    assert out.code in {"service-unavailable", "tool-timeout"}, out.envelope


RAY_DROPIN = textwrap.dedent(
    '''
    """A worker ability dropped into the daemon's home, run on the Ray cluster."""
    import os

    from chalie.ability import Ability
    from chalie.result import ToolResult

    class WhoRuns(Ability):
        name = "who_runs"
        summary = "Report the process and the folder that ran the call."
        tooltip = "who runs"
        examples = ("one", "two", "three", "four", "five", "six")
        isolation = "process"

        def run(self, params):
            return ToolResult.success(
                {"pid": os.getpid(), "cwd": os.getcwd(), "ppid": os.getppid()}
            )
    '''
)


def test_a_daemon_with_the_ray_engine_runs_a_worker_ability_on_the_cluster(
    tmp_path: Path, head: RayHead
) -> None:
    home = short_home()
    (home / "abilities").mkdir()
    (home / "abilities" / "who_runs.py").write_text(RAY_DROPIN)
    (home / "config.toml").write_text(
        f'[mcp_server]\nport = 0\n[workers]\nengine = "ray"\naddress = "{head.address}"\n'
    )
    daemon = DaemonProcess(home, tmp_path / "daemon.log").start()
    try:
        assert daemon.cli("policy", "set", "chat", "who_runs", "allow").returncode == 0
        out = subprocess.run(
            [sys.executable, "-m", "chalie", "--home", str(home), "tools", "call", "who_runs"],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr + daemon.log()[-3000:]
        assert "working_dir_files" in out.stdout  # the shipped drop-in folder
        pid = int(out.stdout.split('"pid":')[1].split(",")[0].strip())
        assert pid in head.pids()  # a process of the Ray head, not of the daemon
    finally:
        import shutil
        import signal

        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.signal(signal.SIGTERM)

        shutil.rmtree(home, ignore_errors=True)

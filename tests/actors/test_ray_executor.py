"""Worker abilities on a real Ray cluster ([workers] engine = "ray"), through the real dispatcher.

One Ray head per module (``ray start --head`` takes seconds on two cores),
with token authentication and a ``chromium`` custom resource; each test's
dispatcher joins it as a Ray driver and leaves it when the test ends. The
last test runs a whole daemon on the same head.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pykka
import pytest

from actors.calls.executors.ray_tasks import RayExecutor
from chalie.calls.execution import Job
from chalie.calls.registry import Entry, Registry
from chalie.process.config import RayTaskConfig, WorkersConfig
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
    if os.environ.get("CI"):  # .ci/run installs it: missing there is a defect, not a skip
        pytest.fail("Ray is not installed: .ci/run installs chalie[ray]", pytrace=False)
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
        result = run_one(executor, dropin_entry(dropins, "count_then_die"))
        assert result.code == "worker-crashed"
    finally:
        executor.close()
    # Ray retries a task whose worker died three times by default; a call with side
    # effects must run once.
    assert count.read_text() == "ran\n"


WHO_RUNS = textwrap.dedent(
    '''
    """A worker ability dropped in: says which process ran it, loaded from which folder."""
    import os

    from chalie.ability import Ability
    from chalie.result import ToolResult

    class WhoRuns(Ability):
        name = "who_runs"
        summary = "Report the process that ran the call and the folder of its module."
        tooltip = "who runs"
        examples = ("one", "two", "three", "four", "five", "six")
        isolation = "process"
        timeout = 150.0  # a first task on a fresh cluster starts a worker on a loaded host

        def run(self, params):
            folder = os.path.dirname(os.path.abspath(__file__))
            return ToolResult.success({"pid": os.getpid(), "folder": folder})
    '''
)


def dropin_entry(folder: Path, tool: str) -> Entry:
    registry = Registry.collect(package=None, entry_points=False, dropin=folder)
    entry = registry.get(tool)
    assert entry is not None, registry.failures
    return entry


def run_one(executor: RayExecutor, entry: Entry, timeout: float = 120) -> ToolResult:
    """One call of an ability straight through the executor (no dispatcher)."""
    job = Job(
        job_id=f"job-{entry.name}",
        call_id=f"call-{entry.name}",
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
    (dropins / "who_runs.py").write_text(WHO_RUNS)
    executor = RayExecutor(settings(head), dropins)
    try:
        wait_until(lambda: executor.status()["state"] == "ready", 120, what="connected")
        assert executor.status()["dropins_shipped"] is True
        # The folder is gone from this host: the cluster runs the copy Ray was given.
        dropins.rename(tmp_path / "moved")
        found = dropin_entry(tmp_path / "moved", "who_runs")
        # The daemon's registry named the file where it was when the daemon started.
        ref = found.ref.replace(str((tmp_path / "moved").resolve()), str(dropins.resolve()))
        result = run_one(executor, Entry(found.cls, found.source, ref))
        assert result.status == "success", result.body
        folder = json.loads(str(result.body))["folder"]
        assert "working_dir_files" in folder  # Ray's unpacked copy
        assert str(tmp_path) not in folder
    finally:
        executor.close()


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
    assert out.code == "service-unavailable", out.envelope
    assert "not reachable" in out.envelope


def ray_daemon(tmp_path: Path, address: str) -> DaemonProcess:
    """A real daemon whose worker abilities run on Ray; its drop-in folder holds who_runs."""
    home = short_home()
    (home / "abilities").mkdir()
    (home / "abilities" / "who_runs.py").write_text(WHO_RUNS)
    (home / "config.toml").write_text(
        f'[mcp_server]\nport = 0\n[workers]\nengine = "ray"\naddress = "{address}"\n'
        "local_cpus = 1\n"
    )
    return DaemonProcess(home, tmp_path / "daemon.log").start()


def call_who_runs(daemon: DaemonProcess) -> dict[str, Any]:
    """``chalie tools call who_runs`` as an operator runs it; the ability's answer."""
    assert daemon.cli("policy", "set", "chat", "who_runs", "allow").returncode == 0
    out = daemon.cli_process("tools", "call", "who_runs", timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr + daemon.log()[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("[who_runs(status=success") and lines[-1] == "[end:who_runs]"
    found: dict[str, Any] = json.loads("\n".join(lines[1:-1]))
    return found


def end(daemon: DaemonProcess) -> None:
    if daemon.proc is not None and daemon.proc.poll() is None:
        assert daemon.signal(signal.SIGTERM, timeout=120) == 0, daemon.log()[-3000:]
    shutil.rmtree(daemon.home, ignore_errors=True)


def test_a_daemon_with_the_ray_engine_runs_a_worker_ability_on_the_cluster(
    tmp_path: Path, head: RayHead
) -> None:
    daemon = ray_daemon(tmp_path, head.address)
    try:
        answer = call_who_runs(daemon)
        assert "working_dir_files" in answer["folder"]  # the shipped drop-in folder
        assert answer["pid"] in head.pids()  # a process of the Ray head, not of the daemon
        workers = daemon.status()["workers"]  # what `chalie status` shows
        assert isinstance(workers, dict)
        assert (workers["engine"], workers["address"], workers["state"]) == (
            "ray",
            head.address,
            "ready",
        )
        assert workers["dropins_shipped"] is True
    finally:
        end(daemon)


def test_address_local_starts_a_cluster_in_the_daemon_that_ends_with_it(
    tmp_path: Path, head: RayHead
) -> None:
    daemon = ray_daemon(tmp_path, "local")
    try:
        answer = call_who_runs(daemon)
        pid = answer["pid"]
        assert pid not in head.pids() and ray_worker(pid)  # a cluster of the daemon's own
    finally:
        end(daemon)
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), 60, what="the daemon's cluster gone")

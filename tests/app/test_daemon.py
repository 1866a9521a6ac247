"""The daemon: its JSON logs, its loop thread, and `chalie run` as a real process.

Process tests start ``chalie run`` with a temporary CHALIE_HOME, talk to it
over the real control socket, and stop it with real signals.
"""

from __future__ import annotations

import asyncio
import fcntl
import io
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.loop import EventLoopThread, LoopNotRunning
from chalie.process import control, daemon, logs
from chalie_app import root
from tests.daemon_process import DaemonProcess, short_home
from tools.processes import alive, descendants
from tools.waiting import wait_until

pytestmark = pytest.mark.slow

# -- structured logs ---------------------------------------------------------------


def _log_line(*args: object, **extra: object) -> dict[str, object]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("chalie.test.logs")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning(*args, extra=extra)  # type: ignore[arg-type]
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert text.count("\n") == 1
    parsed: dict[str, object] = json.loads(text)
    return parsed


def test_a_log_line_is_one_json_object_with_the_standard_fields_and_extras() -> None:
    line = _log_line("worker %s ready", "w1", worker="w1", pid=42)
    assert line["level"] == "warning"
    assert line["logger"] == "chalie.test.logs"
    assert line["msg"] == "worker w1 ready"
    assert (line["worker"], line["pid"]) == ("w1", 42)
    assert str(line["ts"]).endswith("Z")


def test_secret_named_fields_are_redacted_at_any_depth() -> None:
    line = _log_line(
        "connecting",
        token="abc123",
        headers={"Authorization": "Bearer abc123", "accept": "json"},
        servers=[{"api_key": "k-999", "url": "http://x"}],
    )
    assert "abc123" not in json.dumps(line) and "k-999" not in json.dumps(line)
    assert line["token"] == logs.REDACTED
    assert line["headers"] == {"Authorization": logs.REDACTED, "accept": "json"}
    assert line["servers"] == [{"api_key": logs.REDACTED, "url": "http://x"}]


def test_bearer_tokens_in_message_text_are_masked() -> None:
    line = _log_line("got header Bearer sk-live-123 from %s", "client", note="password=hunter2")
    assert "sk-live-123" not in str(line["msg"])
    assert "hunter2" not in str(line["note"])


def test_a_field_that_is_not_json_does_not_drop_the_line() -> None:
    line = _log_line("odd", thing=object())
    assert str(line["thing"]).startswith("<object object")


def test_a_multi_line_message_and_traceback_stay_on_one_line() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("chalie.test.exc")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        raise ValueError("line one\nline two")
    except ValueError:
        logger.exception("failed\nbadly")
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue().count("\n") == 1
    line = json.loads(stream.getvalue())
    assert "ValueError: line one" in line["exc"]


# -- the loop thread -----------------------------------------------------------------


def test_the_loop_thread_runs_submitted_coroutines_on_uvloop() -> None:
    lt = EventLoopThread()
    lt.start()
    try:

        async def where() -> tuple[str, int]:
            await asyncio.sleep(0)
            return type(asyncio.get_running_loop()).__module__, threading.get_ident()

        module, ident = lt.submit(where()).result(5)
        assert module.startswith("uvloop")
        assert ident == lt.thread_ident != threading.get_ident()
    finally:
        assert lt.stop()


def test_stopping_the_loop_cancels_pending_tasks_and_joins_the_thread() -> None:
    lt = EventLoopThread()
    lt.start()
    cancelled = threading.Event()
    running = threading.Event()

    async def forever() -> None:
        running.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    fut = lt.submit(forever())
    assert running.wait(5)  # the task is parked in its sleep, not merely scheduled
    assert lt.stop(timeout=5)
    assert cancelled.is_set()
    assert fut.cancelled()
    assert not lt.is_alive()


def test_a_failing_coroutine_reports_to_its_future_and_the_loop_keeps_running() -> None:
    lt = EventLoopThread()
    lt.start()
    try:

        async def boom() -> None:
            raise RuntimeError("inside the loop")

        with pytest.raises(RuntimeError, match="inside the loop"):
            lt.submit(boom()).result(5)

        async def ok() -> int:
            return 7

        assert lt.submit(ok()).result(5) == 7
    finally:
        lt.stop()


def test_work_handed_to_a_stopped_loop_is_refused_cleanly() -> None:
    lt = EventLoopThread()
    lt.start()
    lt.stop()

    async def never() -> None:
        raise AssertionError("must not run")

    with pytest.raises(LoopNotRunning):
        lt.submit(never())


# -- the single-instance lock and the pid file -------------------------------------------


def test_the_instance_lock_refuses_a_second_holder(tmp_path: Path) -> None:
    with daemon.instance_lock(tmp_path):
        with pytest.raises(daemon.AlreadyRunning, match="already running"):
            with daemon.instance_lock(tmp_path):
                pass
    with daemon.instance_lock(tmp_path):
        pass  # released: a new holder gets it


def test_the_lock_fd_is_not_inherited_by_child_processes(tmp_path: Path) -> None:
    with daemon.instance_lock(tmp_path):
        code = (
            "import fcntl, os, sys\n"
            f"fds = [int(f) for f in os.listdir('/proc/self/fd')]\n"
            f"target = os.path.realpath({str(tmp_path / control.LOCK_NAME)!r})\n"
            "held = [f for f in fds if os.path.realpath(f'/proc/self/fd/{f}') == target]\n"
            "sys.exit(1 if held else 0)\n"
        )
        assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
    assert fcntl  # the lock is an flock: released by the kernel when the holder dies


def test_pid_file_is_written_atomically_and_removed_only_by_its_owner(tmp_path: Path) -> None:
    path = daemon.write_pid_file(tmp_path)
    assert int(path.read_text()) == os.getpid()
    assert (path.stat().st_mode & 0o777) == 0o600
    assert control.read_pid(tmp_path) is None  # no lock held: the pid file alone proves nothing
    with daemon.instance_lock(tmp_path):
        assert control.read_pid(tmp_path) == os.getpid()
    path.write_text("1\n")  # another daemon's pid file
    daemon.remove_pid_file(tmp_path)
    assert path.exists()
    path.write_text(f"{os.getpid()}\n")
    daemon.remove_pid_file(tmp_path)
    assert not path.exists()


# -- `chalie run` as a real process ------------------------------------------------------


@pytest.fixture
def home() -> Iterator[Path]:
    import shutil

    path = short_home()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def spawn(home: Path, tmp_path: Path) -> Iterator[type[DaemonProcess]]:
    started: list[DaemonProcess] = []

    class Tracked(DaemonProcess):
        def __init__(self, home_: Path = home, argv: list[str] | None = None) -> None:
            super().__init__(home_, tmp_path / f"daemon-{len(started)}.log", argv)
            started.append(self)

    yield Tracked
    leftovers: set[int] = set()
    for d in started:
        if d.proc is not None and d.proc.poll() is None:
            leftovers |= descendants(d.pid)
        d.kill()
    for pid in leftovers:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def worker_pids(status: dict[str, object]) -> set[int]:
    workers = status["workers"]
    assert isinstance(workers, dict), workers
    pids = {int(w["pid"]) for w in workers["workers"] if w.get("pid")}
    return pids


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_run_stops_cleanly_on_a_signal_and_leaves_no_process_behind(
    spawn: type[DaemonProcess], home: Path, signum: int
) -> None:
    d = spawn().start()
    status = d.status()
    assert status["pid"] == d.pid
    assert (home / control.PID_NAME).read_text().strip() == str(d.pid)
    assert (home.stat().st_mode & 0o777) == 0o700
    order = [c["id"] for c in status["actors"]]  # type: ignore[attr-defined]
    # The supervisor stops children in reverse start order: control closes first,
    # the dispatcher (which hosts the worker pool) after everything that calls it.
    assert order[0] == "policy" and order[-1] == "control"
    assert "workers" not in order  # the pool runs on the dispatcher's thread
    assert order.index("dispatcher") < order.index("conversations")
    pids = worker_pids(status)
    assert len(pids) == 2
    below = descendants(d.pid)
    assert pids <= below
    assert d.signal(signum) == 0
    wait_until(lambda: not any(alive(p) for p in below), 5, what="no orphan processes left")
    assert not (home / control.PID_NAME).exists()
    assert not control.socket_path(home).exists()
    lines = d.log_lines()
    assert any(line["msg"] == "daemon started" for line in lines)
    assert lines[-1]["msg"] == "daemon stopped"
    assert all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)


def test_a_second_daemon_on_the_same_home_refuses_to_start(spawn: type[DaemonProcess]) -> None:
    first = spawn().start()
    second = spawn().start(wait=False)
    assert second.wait(30) == daemon.EXIT_ALREADY_RUNNING
    assert "already running on" in second.log() and f"pid {first.pid}" in second.log()
    assert first.status()["pid"] == first.pid  # the first one is untouched
    assert first.signal(signal.SIGTERM) == 0


def test_a_stale_pid_file_from_a_killed_daemon_does_not_block_the_next_start(
    spawn: type[DaemonProcess], home: Path
) -> None:
    first = spawn().start()
    below = descendants(first.pid)
    first.kill()  # SIGKILL: no clean-up ran
    assert (home / control.PID_NAME).exists()
    second = spawn().start()
    assert second.status()["pid"] == second.pid
    assert second.signal(signal.SIGTERM) == 0
    # Workers of the killed daemon notice their broker is gone and exit.
    wait_until(lambda: not any(alive(p) for p in below), 10, what="old workers gone")


def test_chalie_stop_stops_the_daemon_over_the_control_socket(spawn: type[DaemonProcess]) -> None:
    d = spawn().start()
    out = d.cli_process("stop")
    assert out.returncode == 0, out.stderr
    assert f"daemon {d.pid} stopped" in out.stdout
    assert d.wait(10) == 0


ESCALATING_DAEMON = textwrap.dedent(
    """
    import sys
    from actors.actor import SupervisedActor
    from chalie.process import logs
    from chalie.process.config import Config
    from chalie.process.supervision import ChildSpec
    from chalie_app import root

    class Doomed(SupervisedActor):
        def on_start(self):
            raise RuntimeError("doomed child cannot open its socket")

    logs.configure()
    spec = lambda rt: ChildSpec("doomed", Doomed.start)
    sys.exit(root.run(Config.load(sys.argv[1]), extra_children=[spec]))
    """
)


def test_root_escalation_shuts_down_with_a_nonzero_exit_naming_the_child(
    spawn: type[DaemonProcess], home: Path, tmp_path: Path
) -> None:
    script = tmp_path / "escalate.py"
    script.write_text(ESCALATING_DAEMON)
    d = spawn(argv=[sys.executable, str(script), str(home)]).start(wait=False)
    assert d.wait(60) == daemon.EXIT_ESCALATED
    final = [
        line
        for line in d.log_lines()
        if line["logger"] == "chalie.process.daemon" and line.get("child") == "doomed"
    ]
    assert final, d.log()
    assert "doomed child cannot open its socket" in str(final[-1]["last_error"])
    assert "doomed" in str(final[-1]["msg"]) and final[-1]["level"] == "error"
    assert not (home / control.PID_NAME).exists()


def test_a_duplicate_ability_name_is_a_one_line_start_up_error(
    spawn: type[DaemonProcess], home: Path
) -> None:
    (home / "abilities").mkdir()
    (home / "abilities" / "clash.py").write_text(CLOCK_CLASH)
    d = spawn().start(wait=False)
    assert d.wait(30) == daemon.EXIT_STARTUP_FAILED
    errors = [line for line in d.log_lines() if line["level"] == "error"]
    assert len(errors) == 1 and "two abilities named 'clock'" in str(errors[0]["msg"])
    assert "\n" not in str(errors[0]["msg"])


def test_a_broken_config_is_a_one_line_error_and_a_nonzero_exit(
    spawn: type[DaemonProcess], home: Path
) -> None:
    (home / "config.toml").write_text("workers = [oops\n")
    d = spawn().start(wait=False)
    assert d.wait(30) != 0
    err = d.log().strip().splitlines()
    assert len(err) == 1 and "config.toml" in err[0]


CLOCK_CLASH = textwrap.dedent(
    """
    from chalie.ability import Ability
    from chalie.result import ToolResult

    class FakeClock(Ability):
        name = "clock"
        summary = "A second clock that must not be allowed to shadow the first."
        tooltip = "fake clock"
        examples = ("a", "b", "c", "d", "e", "f")

        def run(self, params):
            return ToolResult.success("tick")
    """
)


def test_a_data_directory_too_deep_for_an_ipc_socket_is_a_start_up_error(tmp_path: Path) -> None:
    from chalie.process.config import Config

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    result = root.run(Config.load(deep))
    assert result == daemon.EXIT_STARTUP_FAILED
    assert not (deep / control.PID_NAME).exists()


def test_the_loop_thread_logs_its_close_as_a_structured_line() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("chalie.loop")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        lt = EventLoopThread(name="loop-under-test")
        lt.start()
        assert lt.stop()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert {"msg": "event loop closed", "loop_thread": "loop-under-test"}.items() <= lines[
        -1
    ].items()


def test_exit_process_does_not_wait_for_a_stuck_non_daemon_thread() -> None:
    code = (
        "import threading, time\n"
        "from chalie.process import daemon, logs\n"
        "logs.configure()\n"
        "threading.Thread(target=time.sleep, args=(60,), name='stuck-ability').start()\n"
        "daemon.exit_process(5, grace=0.2)\n"
    )
    began = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 5
    assert time.monotonic() - began < 20
    line = json.loads(out.stderr.strip().splitlines()[-1])
    assert line["threads"] == ["stuck-ability"]


def test_exit_process_exits_normally_when_no_thread_is_left() -> None:
    code = "from chalie.process import daemon\ndaemon.exit_process(0)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stderr) == (0, "")


def test_exit_process_runs_the_exit_handlers_and_flushes_what_was_written(tmp_path: Path) -> None:
    """It skips the interpreter's finalisation, never the handlers nor buffered output."""
    log = tmp_path / "handlers.log"
    code = (
        "import atexit, logging, sys\n"
        "from chalie.process import daemon\n"
        f"logging.basicConfig(filename={str(log)!r}, level=logging.INFO)\n"
        "atexit.register(lambda: print('handler ran', flush=False))\n"
        "logging.getLogger('t').info('last line before exit')\n"
        "sys.stdout.write('buffered')\n"
        "daemon.exit_process(3)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 3
    assert out.stdout == "bufferedhandler ran\n"
    assert "last line before exit" in log.read_text()

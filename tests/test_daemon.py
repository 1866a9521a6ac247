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
from chalie import control, daemon, logs

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

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    fut = lt.submit(forever())
    time.sleep(0.05)
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
    assert control.read_pid(tmp_path) == os.getpid()
    path.write_text("1\n")  # another daemon's pid file
    daemon.remove_pid_file(tmp_path)
    assert path.exists()
    path.write_text(f"{os.getpid()}\n")
    daemon.remove_pid_file(tmp_path)
    assert not path.exists()

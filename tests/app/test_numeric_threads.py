"""The daemon sets its numeric libraries' thread count (issue 30, medium): left to
themselves, OpenBLAS's threads spun a start-up solve for over 8 minutes on a loaded machine.
A real daemon process: the numpy it loaded runs the count it set, and so do its workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.daemon_process import DaemonProcess, short_home

pytestmark = pytest.mark.slow


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            if f"\nPPid:\t{pid}\n" in status:
                found.append(int(entry))
    return found


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_the_daemon_and_its_workers_run_the_numeric_thread_count_it_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = short_home()
    for name in [k for k in os.environ if k.endswith("_NUM_THREADS")]:
        monkeypatch.delenv(name)  # the daemon's own setting, not one it inherits
    d = DaemonProcess(home, home / "daemon.log").start()
    try:
        workers = [p for p in children(d.pid) if "chalie" in Path(f"/proc/{p}/cmdline").read_text()]
        assert workers, "no worker process"
        for pid in workers:
            seen = environ(pid)
            assert seen.get("OPENBLAS_NUM_THREADS") == "1", (pid, seen)
            assert seen.get("OMP_NUM_THREADS") == "1", (pid, seen)
    finally:
        d.kill()

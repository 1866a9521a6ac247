"""The daemon process's lifecycle, without the actors: its lock, its pid file, its exit.

One daemon runs on one data directory. :func:`instance_lock` is an ``flock`` on
``<home>/chalie.lock``: the kernel drops it when the process dies, so a stale
pid file left by a SIGKILLed daemon never blocks the next start; a live daemon
does. :func:`write_pid_file` and :func:`remove_pid_file` keep ``chalie.pid``;
:func:`exit_process` leaves once the tree stopped. The composition root that
assembles the supervisor tree and runs it is :mod:`chalie_app.root`.

Exit codes: :data:`EXIT_OK` for a requested stop, :data:`EXIT_ESCALATED` when
the tree gave up, :data:`EXIT_ALREADY_RUNNING`, :data:`EXIT_STARTUP_FAILED`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final, NoReturn

from chalie.process import control
from chalie.process.home import Home
from chalie.process.quick_exit import quick_exit

log = logging.getLogger("chalie.process.daemon")

EXIT_OK: Final = 0
EXIT_STARTUP_FAILED: Final = 1
EXIT_ALREADY_RUNNING: Final = 3
EXIT_ESCALATED: Final = 70  # sysexits EX_SOFTWARE: the runtime itself gave up


class StartupError(RuntimeError):
    """The daemon cannot start; the message is the one line the operator sees."""


class AlreadyRunning(StartupError):
    pass


# -- the single-instance lock and the pid file ------------------------------------------


@contextlib.contextmanager
def instance_lock(home: Path) -> Iterator[None]:
    """Hold the data directory's lock for the block; AlreadyRunning when another daemon has it."""
    # os.open gives a non-inheritable fd: worker subprocesses never hold the lock.
    try:
        fd = os.open(Home(home).lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StartupError(f"cannot use data directory {home}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = control.read_pid(home)
            who = f" (pid {pid})" if pid else ""
            raise AlreadyRunning(f"a daemon is already running on {home}{who}") from None
        yield
    finally:
        os.close(fd)  # closing the only fd releases the flock


def write_pid_file(home: Path) -> Path:
    path = Home(home).pid_file
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(tmp, path)  # readers never see a half-written pid
    return path


def remove_pid_file(home: Path) -> None:
    path = Home(home).pid_file
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text().strip()) == os.getpid():
            path.unlink()


def exit_process(code: int, *, grace: float = 2.0) -> NoReturn:
    """Exit with ``code`` once the daemon has stopped; stuck ability threads do not hold it.

    Python cannot kill a thread: an inline ability that ignores its
    cancellation (a blocking read, a long sleep) would keep the interpreter
    alive after the tree stopped. Its call already ended on the trail (the
    dispatcher closes calls in flight when it stops), so after ``grace``
    seconds the process leaves without it.
    """
    deadline = time.monotonic() + grace
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]
    if stuck:
        log.warning("threads still busy at exit; leaving without them", extra={"threads": stuck})
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(code)
    # A clean stop: every actor closed what it owns (chalie.process.quick_exit).
    quick_exit(code)

"""Leaving a finished process without the interpreter's finalisation.

A normal exit tears down every imported module and collects everything left: about
20 ms of each ``chalie`` command's 100 ms of work, and for the daemon, with its model
runtime, indexes and HTTP stack, most of a ``chalie stop`` (about 1 s of 2 on a loaded
machine). :func:`quick_exit` keeps what a normal exit promises (the exit handlers run,
logging's flush among them; the standard streams are flushed; a ``SystemExit`` code
means what it means to Python) and then leaves with :func:`os._exit`.

The daemon joins its threads first, with a grace (:func:`chalie.process.daemon.exit_process`): a
stuck ability thread must not hold its exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import NoReturn


def exit_code(code: object) -> int:
    """What the interpreter would exit with for ``SystemExit(code)`` (a text is printed,
    to stderr, and exits 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def quick_exit(code: int) -> NoReturn:
    """Leave with ``code`` after what the interpreter's own exit does first: wait for the
    threads that are not daemon threads (and the thread pools' exit hooks), run the exit
    handlers, flush the standard streams."""
    threading = sys.modules.get("threading")
    if threading is not None and threading.current_thread() is threading.main_thread():
        getattr(threading, "_shutdown", lambda: None)()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)

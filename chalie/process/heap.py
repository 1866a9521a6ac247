"""The daemon's heap: few malloc arenas, and free memory handed back after a big update.

glibc gives each new thread its own malloc arena (up to 8 per core) and keeps what an
arena once held. Tantivy starts a thread for every index writer, onnxruntime has its own,
and each writer's 15 MB heap then stays in its arena: a 5,000-tool sync left the daemon
~130 MB larger, most of it free memory in arenas. :func:`limit_arenas` (called once at
``chalie run``, before the actors start threads) caps the arenas at :data:`ARENAS`;
:func:`trim` returns free heap pages to the system (the discovery actor calls it when a
big update has drained). Both are no-ops where the C library is not glibc.

:func:`pin_numeric_threads` (also at ``chalie run``, before numpy is first imported) sets
the thread count of the numeric libraries (OpenBLAS, OpenMP, MKL): left to themselves
they start a spinning thread a core beside onnxruntime's and the actors', and on a loaded
machine one ``np.linalg.solve`` at start-up spun for over 8 minutes (issue 30). The
worker processes inherit it. An operator's own setting of a variable stands.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import MutableMapping
from typing import Any, Final

log = logging.getLogger("chalie.process.heap")

ARENAS: Final = 2
# The numeric libraries' thread count: their work in the daemon is small (a linear head's
# solve, vector arithmetic); the embedder's threads are onnxruntime's own setting.
NUMERIC_THREADS: Final = 1
NUMERIC_THREAD_VARS: Final = (
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


def pin_numeric_threads(
    environ: MutableMapping[str, str] = os.environ, threads: int = NUMERIC_THREADS
) -> dict[str, str]:
    """Set each numeric library's thread count the environment does not set yet; what it
    set. Takes effect for a library loaded after it (call before numpy is imported)."""
    made = {}
    for name in NUMERIC_THREAD_VARS:
        if name not in environ:
            environ[name] = made[name] = str(threads)
    return made


M_ARENA_MAX: Final = -8  # glibc's mallopt parameter number


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap the malloc arenas threads created from now on use; True when it took."""
    libc = _libc()
    if libc is None:
        return False
    done = bool(libc.mallopt(M_ARENA_MAX, int(arenas)))
    log.debug("malloc arenas capped at %d: %s", arenas, done)
    return done


def trim() -> bool:
    """Hand free heap memory back to the system; True when some was."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))

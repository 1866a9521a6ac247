"""The daemon's heap: few malloc arenas, and free memory handed back after a big update.

glibc gives each new thread its own malloc arena (up to 8 per core) and keeps what an
arena once held. Tantivy starts a thread for every index writer, onnxruntime has its own,
and each writer's 15 MB heap then stays in its arena: a 5,000-tool sync left the daemon
~130 MB larger, most of it free memory in arenas. :func:`limit_arenas` (called once at
``chalie run``, before the actors start threads) caps the arenas at :data:`ARENAS`;
:func:`trim` returns free heap pages to the system (the discovery actor calls it when a
big update has drained). Both are no-ops where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Any, Final

log = logging.getLogger("chalie.heap")

ARENAS: Final = 2
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

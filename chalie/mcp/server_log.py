"""One remote MCP server's log file, ``logs/mcp-<name>.log``: bounded, rotated, removed with it.

A stdio server's stderr used to be the file itself: a server printing 1.4 GB
in 12 s filled the disk, and the file outlived the server. Now the child
writes into a pipe (:meth:`ServerLog.fileno`), a thread of the log's own
drains it, and everything (its stderr and the server's ``notifications/
message``, :meth:`ServerLog.write`) lands in the file, which is rotated at
``max_bytes`` into one ``.1`` backup: at most twice ``max_bytes`` on disk,
whatever the server writes. :func:`remove` deletes both files when the server
is removed.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Final

MAX_BYTES: Final = 1 << 20
CHUNK: Final = 64 * 1024


def log_path(logs_dir: Path, name: str) -> Path:
    return logs_dir / f"mcp-{name}.log"


def remove(logs_dir: Path, name: str) -> int:
    """Delete a server's log and its backup; how many files were removed."""
    removed = 0
    base = log_path(logs_dir, name)
    for path in (base, base.with_name(base.name + ".1")):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


def tail(logs_dir: Path, name: str, lines: int, *, max_bytes: int = CHUNK) -> list[str]:
    """The last ``lines`` lines of a server's log (its stderr, its ``notifications/message``
    and the notifications it sent), read from at most ``max_bytes`` at its end; escaped
    to text a page shows as it is (invalid UTF-8 replaced)."""
    path = log_path(logs_dir, name)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except FileNotFoundError:
        return []
    found = data.decode("utf-8", "replace").splitlines()
    if len(data) == max_bytes and found:
        found = found[1:]  # the first line was cut by the window
    return found[-lines:] if lines > 0 else []


class ServerLog:
    """A text stream for the SDK's ``errlog`` whose file descriptor is a drained pipe."""

    def __init__(self, path: Path, *, max_bytes: int = MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        self._file = open(path, "ab")
        self._size = self._file.tell()
        self.rotations = 0
        self._read, self._write = os.pipe()
        self._closed = False
        self._reader = threading.Thread(
            target=self._drain, name=f"mcp-log-{path.stem}", daemon=True
        )
        self._reader.start()

    # -- the stream the SDK is given -----------------------------------------------------
    def fileno(self) -> int:
        """The pipe's write end: a child's stderr."""
        return self._write

    def write(self, text: str) -> int:
        self._append(text.encode("utf-8", "replace"))
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop: our write end closes; the drain ends at EOF (or soon, if a child lingers)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            os.close(self._write)
        self._reader.join(2.0)
        with contextlib.suppress(OSError):
            os.close(self._read)  # a lingering child's writes now fail, never block us
        with self._lock:
            self._file.close()

    # -- the file ------------------------------------------------------------------------
    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._read, CHUNK)
            except OSError:
                return
            if not chunk:
                return
            self._append(chunk)

    def _append(self, data: bytes) -> None:
        with self._lock:
            if self._file.closed:
                return
            while data:
                room = self.max_bytes - self._size
                if room <= 0:
                    self._rotate()
                    continue
                part, data = data[:room], data[room:]
                self._file.write(part)
                self._size += len(part)

    def _rotate(self) -> None:
        self._file.close()
        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        self._file = open(self.path, "ab")
        self._size = 0
        self.rotations += 1

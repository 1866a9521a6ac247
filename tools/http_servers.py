"""What the small http.server instances of the tests and benchmarks share."""

from __future__ import annotations

import itertools
import socket
import threading

# How often a test's http.server checks for shutdown() (serve_forever's poll_interval): its
# 0.5 s default made every test server's teardown take half a second.
SERVER_POLL = 0.02


class TrickleServer:
    """A server that answers every connection with its response headers one byte at a time,
    ``every`` seconds apart, and never finishes them (the slow-header attack on a fetch).

    ``open`` counts the connections still being trickled to."""

    def __init__(self, every: float = 0.2) -> None:
        self.every = every
        self.accepted = 0
        self.open = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port: int = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, name="trickle", daemon=True).start()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self.open += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        header = itertools.cycle(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 60)
        try:
            conn.recv(65536)  # the request
            for byte in header:
                if self._stop.wait(self.every):
                    return
                conn.sendall(bytes([byte]))
        except OSError:
            return  # the client gave up: what the fetch's deadline is for
        finally:
            conn.close()
            with self._lock:
                self.open -= 1

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

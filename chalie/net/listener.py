"""The TCP listening socket every server of ours hands to uvicorn.

Made with ``IPPROTO_TCP`` as its protocol on purpose: asyncio sets
``TCP_NODELAY`` on an accepted connection only when the socket says it is TCP,
and a socket made as ``socket(AF_INET, SOCK_STREAM)`` says protocol 0. Without
it, a response written in two pieces (headers, then body) waits for the peer's
delayed ACK: 44 ms a request on loopback instead of 0.4 ms (measured with
uvicorn on asyncio and on uvloop). ``TCP_NODELAY`` is also set on the listener,
which accepted sockets inherit on Linux.
"""

from __future__ import annotations

import socket

BACKLOG = 1024


def tcp_listener(host: str, port: int) -> socket.socket:
    """A bound, listening, non-blocking TCP socket; raises OSError (closed) when it cannot bind."""
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((bare, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock

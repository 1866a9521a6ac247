"""A real HAProxy (Debian's) on loopback in front of several daemons' MCP servers.

For the tests and the recipe of docs/store.rst: inbound MCP behind a load balancer. Each
HTTP request is balanced on its own (round robin). ``sticky=True`` adds the one affinity
a legacy (stateful) MCP client needs: a session goes back to the daemon that created it,
learnt from the ``mcp-session-id`` header of that daemon's response (a modern 2026-07-28
client sends no session and needs none).

Use::

    with Haproxy([("127.0.0.1", 8101), ("127.0.0.1", 8102)], tmp, sticky=True) as lb:
        url = lb.url + "/mcp"

Each daemon lists the balancer's address in ``[mcp_server] allowed_hosts``
(``["127.0.0.1:8100"]``): the Host header clients send is the balancer's.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from types import TracebackType

from tools.personal_servers import free_port, stop
from tools.waiting import wait_until

BINARY = "haproxy"

STICKY = """\
    # A legacy MCP session lives in the daemon that created it: back to it, always.
    stick-table type string len 128 size 100k expire 30m
    stick match req.hdr(mcp-session-id)
    stick store-response res.hdr(mcp-session-id)
"""


def config(servers: list[tuple[str, int]], port: int, sticky: bool) -> str:
    """The HAProxy configuration: one frontend on loopback, the daemons round robin."""
    lines = [
        "global",
        "    maxconn 2000",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        # A legacy client keeps a GET stream open, and a turn may take minutes.
        "    timeout client 10m",
        "    timeout server 10m",
        "frontend mcp",
        f"    bind 127.0.0.1:{port}",
        "    default_backend daemons",
        "backend daemons",
        "    balance roundrobin",
    ]
    text = "\n".join(lines) + "\n" + (STICKY if sticky else "")
    for i, (host, server_port) in enumerate(servers):
        text += f"    server d{i} {host}:{server_port}\n"
    return text


def available() -> bool:
    return shutil.which(BINARY) is not None


class Haproxy:
    """One HAProxy process, in the foreground, stopped on exit."""

    def __init__(
        self, servers: list[tuple[str, int]], workdir: Path, *, sticky: bool, port: int = 0
    ) -> None:
        # The daemons must know the name clients reach them by ([mcp_server] allowed_hosts:
        # the DNS-rebinding guard answers 421 to any other Host), so a port may be given.
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.path = workdir / ("haproxy-sticky.cfg" if sticky else "haproxy.cfg")
        self.path.write_text(config(servers, self.port, sticky))
        self.log = workdir / "haproxy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Haproxy:
        checked = subprocess.run(
            [BINARY, "-c", "-f", str(self.path)], capture_output=True, text=True, timeout=30
        )
        if checked.returncode != 0:
            raise RuntimeError(f"haproxy refused its configuration: {checked.stderr.strip()}")
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [BINARY, "-db", "-f", str(self.path)], stdout=out, stderr=subprocess.STDOUT
            )
        wait_until(self._listening, 30, "haproxy listening")
        return self

    def _listening(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"haproxy exited: {self.log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop(proc)

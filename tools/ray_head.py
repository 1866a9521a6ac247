"""A throw-away Ray head on this host, for the Ray tests and the Ray benchmark.

``RayHead.start()`` runs ``ray start --head --block`` in its own session with
its own temp directory and its own auth token (token authentication on, as on
a real cluster), and ``stop()`` kills that session: nothing of another Ray on
the machine is touched (never ``ray stop``, which stops every Ray of the user).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RayHead:
    """One Ray head process tree; ``env`` is what a driver needs to join it (the token)."""

    def __init__(self, *, cpus: int = 2, resources: dict[str, float] | None = None) -> None:
        self.cpus = cpus
        self.resources = dict(resources or {})
        self.port = free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix="chray-", dir="/tmp"))
        token = self.tmp / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        # Ray reads these in the head, in its workers and in every driver that joins.
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> RayHead:
        ray = Path(sys.executable).with_name("ray")
        argv = [
            str(ray) if ray.exists() else "ray",
            "start",
            "--head",
            "--block",
            f"--port={self.port}",
            f"--num-cpus={self.cpus}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={self.tmp}",
        ]
        if self.resources:
            argv.append(f"--resources={json.dumps(self.resources)}")
        # The head's workers import chalie and the sample abilities from this checkout.
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env: dict[str, Any] = {**os.environ, **self.env, "PYTHONPATH": path}
        with open(self.tmp / "head.log", "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {self.proc.returncode}: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the Ray head did not listen within {timeout} s: {self.log()}")

    def log(self) -> str:
        path = self.tmp / "head.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def pids(self) -> list[int]:
        """The head's processes (its session), from /proc."""
        if self.proc is None:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getsid(int(entry)) == self.proc.pid:
                        found.append(int(entry))
                except OSError:
                    continue
        return found

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(30)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> RayHead:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

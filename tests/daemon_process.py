"""A real daemon process on one data directory, driven like an operator would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from chalie.process import control
from tests.slow import require_slow

BUILDING = ("loading", "rebuilding")


def short_home() -> Path:
    """A fresh data directory with a short path (ipc socket paths are capped at 107 bytes;
    pytest's tmp paths can be longer)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="chd-", dir="/tmp"))


class DaemonProcess:
    """One real daemon process on one data directory, driven like an operator would."""

    def __init__(self, home: Path, log_path: Path, argv: list[str] | None = None) -> None:
        self.home = home
        self.log_path = log_path
        self.argv = argv or [sys.executable, "-m", "chalie", "--home", str(home), "run"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, wait: bool = True) -> DaemonProcess:
        require_slow("a daemon process")
        config = self.home / "config.toml"
        if self.home.is_dir() and not config.exists():
            # Tests never bind fixed ports: the inbound MCP server takes an ephemeral one.
            config.write_text("[mcp_server]\nport = 0\n")
        env = {**os.environ, "CHALIE_HOME": str(self.home)}
        env.pop("CHALIE_ABILITIES_DIR", None)
        with open(self.log_path, "ab") as log_file:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=env
            )
        if wait:
            self.wait_ready()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait_ready(self, timeout: float = 60.0) -> dict[str, object]:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                reply = control.request(self.home, "status", timeout=2)
            except control.DaemonNotRunning:
                time.sleep(0.05)
                continue
            building = (reply.data.get("discovery") or {}).get("state") in BUILDING
            if reply.ok and all(c["alive"] for c in reply.data["actors"]) and not building:
                # A find sent during the first index build is answered at once with
                # discovery-index-building: a test starts once the index is built.
                data: dict[str, object] = reply.data
                return data
            time.sleep(0.05)
        raise AssertionError(f"daemon not ready within {timeout} s:\n{self.log()}")

    def cli(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a chalie command in this process (CliRunner), against the real daemon."""
        from click.testing import CliRunner

        from chalie_app.cli import cli

        result = CliRunner().invoke(cli, ["--home", str(self.home), *args], input=input)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)

    def cli_process(
        self, *args: str, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a chalie command as its own process, as an operator would."""
        return subprocess.run(
            [sys.executable, "-m", "chalie", "--home", str(self.home), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def status(self) -> dict[str, object]:
        reply = control.request(self.home, "status", timeout=10)
        assert reply.ok, reply
        data: dict[str, object] = reply.data
        return data

    def signal(self, signum: int, timeout: float = 60.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signum)
        return self.proc.wait(timeout)

    def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_lines(self) -> list[dict[str, object]]:
        lines = []
        for raw in self.log().splitlines():
            if raw.startswith("{"):
                lines.append(json.loads(raw))
        return lines
